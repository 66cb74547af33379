"""The suite's stand-in nv-hostengine: a listener of this test process's own on 127.0.0.1, on a
port the kernel picks, open from the first import to the process's exit. `HOST` goes in the
stand-in dcgmi commands' --host: dcgmi is asked only where root (or the asking user) listens
there, and its answer taken only if the same sockets still listen after (checks.dcgm.host_door,
host_moved).

Each xdist worker has its own. One shared 127.0.0.1:5555 (a SO_REUSEPORT socket per worker)
changed under a worker's dcgmi whenever another worker finished, and host_moved rightly refused
that answer: a qualification inconclusive in CI near the run's end."""

from __future__ import annotations

import socket

_SOCK = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
_SOCK.bind(("127.0.0.1", 0))
_SOCK.listen(1)
HOST = f"127.0.0.1:{_SOCK.getsockname()[1]}"
