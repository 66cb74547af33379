"""The InfiniBand ports under /sys/class/infiniband, read once a run for every family that
asks: the one door to them.

The infiniband family (state, rate, error counters) and the telemetry family (rate, link
layer, the same error counters as rates, congestion and data counters) read the same files.
Each sysfs counter read of an mlx5 port is a MAD to the HCA's firmware, so a run that judges
both asked the firmware for the seven shared error counters twice. `reader(root, env)` gives the
run's one reader (kept on the CollectEnv): a file asked for twice is read once and the answer
shared, the ports are listed once.

Bounded like every read of the node path: each file through `read_bounded` (a regular file,
opened non-blocking, at most ATTR_BYTES: a FIFO, a device or a directory where a counter was is
no answer, never a wait), at most MAX_PORTS ports (a hostile or broken tree of thousands of
directories is not walked to its end), and no read once the stage's deadline (CollectEnv's
time.monotonic() by which collectors must return) has passed: what was not read is absent, and
said once as a collector error. A read the kernel itself blocks in (firmware not answering a
MAD) is not abandoned here: the driver fails the command at its firmware command timeout.

Standard library only, Python 3.9: the prolog reads it on every job start.
"""

from __future__ import annotations

import time
from pathlib import Path

from rsc_health.collect.sysfs import read_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

MAX_PORTS = 64
SHARED_KEY = "ib_ports"
SOURCE = "sys/class/infiniband"


class IbReader:
    """The run's reads of the InfiniBand ports: listed once, each file read once."""

    def __init__(self, root: Path, deadline: float | None = None) -> None:
        self.root = Path(root)
        self.deadline = deadline
        self._ports: list[tuple[str, str, Path]] | None = None
        self._files: dict[Path, str | None] = {}
        self.reads = 0  # files actually read (the rest came from the cache)
        self.skipped = 0  # files not read: the deadline had passed
        self.dropped = 0  # ports past MAX_PORTS

    def ports(self) -> list[tuple[str, str, Path]]:
        """(HCA name, port name, port directory) of every port, in name order; an HCA whose
        ports cannot be listed is skipped, no class directory is no port."""
        if self._ports is None:
            self._ports = []
            for hca, pdir in _each_port(self.root):
                if len(self._ports) >= MAX_PORTS:
                    self.dropped += 1
                    continue
                self._ports.append((hca.name, pdir.name, pdir))
        return self._ports

    def text(self, path: Path) -> str | None:
        """The file's stripped text, or None (unreadable, not a regular file, too late)."""
        if path in self._files:
            return self._files[path]
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.skipped += 1
            return None  # not cached: a later run reads it
        self.reads += 1
        value = read_text(path)
        self._files[path] = value
        return value


def _each_port(root: Path) -> Iterator[tuple[Path, Path]]:
    try:
        hcas = sorted((root / SOURCE).iterdir())
    except OSError:
        return
    for hca in hcas:
        try:
            port_dirs = sorted((hca / "ports").iterdir(), key=lambda p: p.name)
        except OSError:
            continue
        for pdir in port_dirs:
            yield hca, pdir


def reader(root: Path, env=None) -> IbReader:
    """The run's one reader (kept in env.shared), or a fresh one without an env."""
    if env is None or getattr(env, "shared", None) is None:
        return IbReader(root, getattr(env, "deadline", None))
    found = env.shared.get(SHARED_KEY)
    if found is None or found.root != Path(root):
        found = env.shared[SHARED_KEY] = IbReader(root, env.deadline)
    return found


def said(read: IbReader, env, family: str) -> None:
    """One collector error for what the reader left unread (the deadline, MAX_PORTS)."""
    state = getattr(env, "state", None)
    if state is None:
        return
    if read.skipped:
        state.errors.append((family, SOURCE, f"stage deadline passed: {read.skipped} port "
                                             "file(s) not read this run"))
        read.skipped = 0
    if read.dropped:
        state.errors.append((family, SOURCE, f"more than {MAX_PORTS} ports: "
                                             f"{read.dropped} not read"))
        read.dropped = 0
