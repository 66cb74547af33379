"""A private PgBouncer in transaction pooling mode in front of the test PostgreSQL: what
docs/deployment.md tells a fleet of thousands of nodes to flush through.

Two server connections and `server_round_robin`, so consecutive transactions of one client,
and the clients one after another, land on different backends as they do under a fleet's load.
PgBouncer refuses to run as root: it runs as the postgres user, its files in a directory that
user can read."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.ports import free_port as _free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    return Path(PGBOUNCER).exists()




@contextmanager
def pgbouncer(pg_url: str) -> Iterator[str]:
    """Run PgBouncer for the database of `pg_url`; yields the URL that goes through it."""
    url = make_url(pg_url)
    port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="rsc-pgbouncer-"))
    user = url.username or "postgres"
    (home / "users.txt").write_text(f'"{user}" ""\n')
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={url.host or '127.0.0.1'} port={url.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {home / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 2\nmin_pool_size = 2\n"
        "server_round_robin = 1\n"
        f"logfile = {home / 'pgbouncer.log'}\n"
    )
    shutil.chown(home, "postgres")
    for f in home.iterdir():
        shutil.chown(f, "postgres")
    argv = [PGBOUNCER, str(home / "pgbouncer.ini")]
    if os.geteuid() == 0:
        argv[1:1] = ["-u", "postgres"]
    # Its log goes to the logfile; a pipe nobody reads would fill and stop it mid-run.
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    logfile = home / "pgbouncer.log"
                    log = logfile.read_text() if logfile.exists() else ""
                    raise RuntimeError(f"pgbouncer did not start: {log}") from exc
                time.sleep(0.05)
        yield url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(home, ignore_errors=True)
