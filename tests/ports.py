"""A TCP port on 127.0.0.1 for a daemon a test starts (slurmctld, slurmd, PgBouncer, Prometheus)."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

BASE = 20000
# xdist workers draw from bands of their own: a port is only known taken once its daemon has
# bound it, so two workers checking the same free port before either daemon starts both got it
BANDS = 8
_given: set[int] = set()


def ephemeral_low() -> int:
    """The kernel's first ephemeral port (where outgoing connections' ports start)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(low, BASE + BANDS)


def _band(low: int) -> tuple[int, int]:
    """[start, end) of this process's ports: its xdist worker's band (gwN), else all of them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        return BASE, low
    width = max(1, (low - BASE) // BANDS)
    start = BASE + (int(worker[2:]) % BANDS) * width
    return start, start + width


def free_port() -> int:
    """A port below the kernel's ephemeral range that is free now, and never one this process
    handed out before. Port 0 handed out an ephemeral port, which any outgoing connection
    (PostgreSQL, slurmdbd, munge) could take before the daemon bound it: a slurmd then died
    with "Address already in use" and the whole Slurm suite after it failed (seen once in five
    full runs). A cluster takes eight ports before any daemon binds: drawn at random, two of
    them were once the same (slurmdbd's and node04's slurmd: slurmctld's messages to the node
    reached slurmdbd, and no node came up), so a port is handed out once per process, and each
    xdist worker draws from its own band."""
    start, end = _band(ephemeral_low())
    for _ in range(400):
        port = secrets.randbelow(max(1, end - start)) + start
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")
