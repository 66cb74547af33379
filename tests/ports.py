"""A TCP port on 127.0.0.1 for a daemon a test starts (slurmctld, slurmd, PgBouncer, Prometheus)."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path


def free_port() -> int:
    """A port below the kernel's ephemeral range that is free now. Port 0 handed out an
    ephemeral port, which any outgoing connection (PostgreSQL, slurmdbd, munge) could take
    before the daemon bound it: a slurmd then died with "Address already in use" and the
    whole Slurm suite after it failed (seen once in five full runs)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = secrets.randbelow(max(1, low - 20000)) + 20000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")
