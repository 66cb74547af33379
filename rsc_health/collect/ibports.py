"""The InfiniBand ports under /sys/class/infiniband, read once a run for every family that
asks: the one door to them.

The infiniband family (state, rate, error counters) and the telemetry family (rate, link
layer, the same error counters as rates, congestion and data counters) read the same files.
Each sysfs counter read of an mlx5 port is a MAD to the HCA's firmware, so a run that judges
both asked the firmware for the seven shared error counters twice. `reader(root, env)` gives the
run's one reader (kept on the CollectEnv): a file asked for twice is read once and the answer
shared, the ports are listed once.

Read in an abandonable child (rsc_health.collect.bounded), like NVML and statvfs: each sysfs
counter read of an mlx5 port is a MAD to the HCA's firmware, and a wedged firmware command
holds the read in the kernel, where no deadline of this process can interrupt it (before, the
run hung there until its watchdog, and the families after it, a lost GPU's among them, were
never judged). One child per run lists the ports and reads every file the running families
read (`start`, forked before NVML is asked, so the two overlap), streaming each answer as it
comes; the parent waits until [infiniband] read_timeout_s (never past the stage's deadline).
A child that has not finished by then is abandoned: what it answered is judged, the rest is
absent, and the hang is said and recorded (collect.hangs: `ib`, the engine's ib_hung; after
[infiniband] hang_sweeps sweeps in a row, ib_wedged). While that child is still in the kernel
the ports are not read again (the child is the answer: one process stuck, not one per run).

Bounded like every read of the node path: each file through `read_bounded` (a regular file,
opened non-blocking, at most ATTR_BYTES: a FIFO, a device or a directory where a counter was is
no answer, never a wait), at most MAX_PORTS ports (a hostile or broken tree of thousands of
directories is not walked to its end), and no child started once the stage's deadline has
passed: what was not read is absent, and said once as a collector error.

Standard library only, Python 3.9: the prolog reads it on every job start.
"""

from __future__ import annotations

import os
import time

from rsc_health.collect import hangs
from rsc_health.collect.sysfs import pure, read_text

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from _typeshed import StrPath  # str | os.PathLike[str]

MAX_PORTS = 64
# HCA names looked at (one stat each): a broken or hostile class directory of thousands.
MAX_HCAS = 1024
SHARED_KEY = "ib_ports"
SOURCE = "sys/class/infiniband"
# A family's reads (checks.Family.reads) under each port: `<PORT_GLOB><file>`.
PORT_GLOB = f"{SOURCE}/*/ports/*/"
# Seconds the child may take when [infiniband] read_timeout_s is not in the config given.
DEFAULT_TIMEOUT_S = 5.0


def port_files(globs: Iterable[str]) -> tuple[str, ...]:
    """The files under each port directory that these reads (a family's READS) name, in
    order, each once: `sys/class/infiniband/*/ports/*/counters/symbol_error` ->
    `counters/symbol_error`."""
    out: dict[str, None] = {}
    for glob in globs:
        if glob.startswith(PORT_GLOB) and "*" not in glob[len(PORT_GLOB):]:
            out[glob[len(PORT_GLOB):]] = None
    return tuple(out)


def sweeps_missed(env) -> int:
    """Sweeps in a row the ports' read hung before this run (its record in hangs_before; 0:
    none on record): the counters read now rose over that many sweeps more than one."""
    record = (getattr(env, "hangs_before", None) or {}).get(hangs.IB)
    return record["sweeps"] if isinstance(record, dict) and type(record.get("sweeps")) is int \
        and record["sweeps"] > 0 else 0


def after_hang(env) -> bool:
    """Whether a hang of the ports' read is on record from before this run: the counters'
    last read may be from before it, so a rise now is not one interval's."""
    return hangs.IB in (getattr(env, "hangs_before", None) or {})


def under_ports(rel: str) -> bool:
    """Whether a path relative to the root is a file under a port (PORT_GLOB): the reader's."""
    parts = rel.split("/")
    return len(parts) > 6 and "/".join(parts[:3]) == SOURCE and parts[4] == "ports"


class IbReader:
    """The run's reads of the InfiniBand ports: one child lists them and reads `names` under
    each (begin), the families take its answers (ports, text, virtual)."""

    def __init__(self, root: StrPath, deadline: float | None = None, names: Iterable[str] = (),
                 timeout_s: float = DEFAULT_TIMEOUT_S, state=None,
                 hangs_before: dict | None = None) -> None:
        self.root = pure(root)
        self.deadline = deadline
        self.names = tuple(dict.fromkeys(names))
        self.timeout_s = timeout_s
        self.state = state
        self.hangs_before = hangs_before or {}
        self._child: tuple[int, int, float] | None = None
        self._begun = False
        self._gathered = False
        self._ports: list[tuple[str, str, str]] | None = None  # None: never listed
        self._virtual: set[str] = set()
        self._files: dict[str, str | None] = {}  # by sysfs.pure path
        # HCAs whose ports were not all listed (their ports/ unreadable, or past MAX_PORTS):
        # hca -> why. None of their ports may be judged missing.
        self.unlisted: dict[str, str] = {}
        self._said_unlisted = False
        self.hung = False  # the child did not finish (or one before it is still waiting)
        self.error: str | None = None  # the child failed (said once by `said`)
        self.skipped = 0  # 1 when the stage's deadline had passed before anything was read
        self.dropped = 0  # ports past MAX_PORTS

    @property
    def listed(self) -> bool:
        """Whether the ports were listed: without that, no port may be judged missing."""
        self._gather()
        return self._ports is not None

    def begin(self) -> None:
        """Fork the child (once), unless the one a run abandoned before is still waiting in
        the kernel (then the ports are not read: the hang is said) or the deadline passed."""
        if self._begun:
            return
        self._begun = True
        state = self.state
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.skipped = 1  # not asked: a hang on record stays as it was
            return
        if state is not None:
            state.probes_asked.append(hangs.IB)
        waiting = self.hangs_before.get(hangs.IB) or {}
        if hangs.still_waiting(waiting):
            self.hung = True
            if state is not None:
                state.hung_probes[hangs.IB] = (
                    f"InfiniBand: the port read abandoned before (pid {waiting['pid']}) is "
                    "still waiting in the kernel; not asked again")
            return
        from rsc_health.collect import bounded

        pid, fd = bounded.start(_asker(self.root, self.names), streaming=True,
                                mark=hangs.marker(hangs.IB, self.root))
        self._child = (pid, fd, time.monotonic())

    def _gather(self) -> None:
        """The child's answers, waited for until read_timeout_s after it started (never past
        the deadline); a child not done by then is abandoned (the hang said and recorded)."""
        if self._gathered:
            return
        self.begin()
        self._gathered = True
        if self._child is None:
            return
        from rsc_health.collect import bounded

        pid, fd, started = self._child
        until = started + self.timeout_s
        if self.deadline is not None:
            until = min(until, self.deadline)
        reports: dict[str, list] = {}
        done = bounded.collect({"ib": (pid, fd)}, until, reports=reports)["ib"]
        last = None
        for msg in reports.get("ib") or ():
            if not isinstance(msg, dict):
                continue
            if self._ports is None and isinstance(msg.get("ports"), list):
                self._ports = [(str(h), str(p), self._port_dir(h, p))
                               for h, p, _ in msg["ports"]][:MAX_PORTS]
                self._virtual = {self._port_dir(h, p)
                                 for h, p, v in msg["ports"] if v is True}
                dropped = msg.get("dropped")
                self.dropped = dropped if type(dropped) is int else 0
                unlisted = msg.get("unlisted")
                self.unlisted = ({str(k): str(v) for k, v in unlisted.items()}
                                 if isinstance(unlisted, dict) else {})
            elif self._ports is not None and type(msg.get("p")) is int \
                    and 0 <= msg["p"] < len(self._ports) and isinstance(msg.get("f"), dict):
                pdir = self._ports[msg["p"]][2]
                for name, text in msg["f"].items():
                    if name in self.names:
                        self._files[pure(os.path.join(pdir, name))] = (
                            text if isinstance(text, str) else None)
                        last = (msg["p"], name)
        if done is None:
            self.hung = True
            if self.state is not None:
                self.state.hung_probes[hangs.IB] = (
                    f"InfiniBand: no answer within {max(0.0, until - started):.1f}s; "
                    f"{self._stuck_at(last)}")
                self.state.probe_pids[hangs.IB] = pid
        elif bounded.DIED in done:  # crashed or killed (not a hang: nothing waits)
            self.error = f"the IB reader exited without an answer ({done[bounded.DIED]})"[:200]
        elif "error" in done:
            self.error = str(done["error"])[:200]

    def _port_dir(self, hca: object, port: object) -> str:
        return pure(os.path.join(self.root, SOURCE, str(hca), "ports", str(port)))

    def _stuck_at(self, last: tuple[int, str] | None) -> str:
        """Which read did not return: the one after the last answered."""
        if self._ports is None:
            return "listing the ports hung"
        order = [(i, n) for i in range(len(self._ports)) for n in self.names]
        at = order.index(last) + 1 if last in order else 0
        if at >= len(order):
            return f"all {len(order)} port files answered, the child did not exit"
        i, name = order[at]
        where = name.rpartition("/")[0] or "attributes"
        return (f"a read of {self._ports[i][0]}/{self._ports[i][1]} {where} hung "
                f"({at} of {len(order)} port files answered)")

    def ports(self) -> list[tuple[str, str, str]]:
        """(HCA name, port name, port directory) of every port, in name order; an HCA whose
        ports cannot be listed is skipped, no class directory is no port; [] when they were
        not listed (`listed` says which)."""
        self._gather()
        return list(self._ports or [])

    def virtual(self, pdir: StrPath) -> bool:
        """Whether the port is an SR-IOV virtual function's (its device has a physfn)."""
        self._gather()
        return pure(pdir) in self._virtual

    def text(self, path: StrPath) -> str | None:
        """The file's stripped text, or None (unreadable, not a regular file, not answered)."""
        self._gather()
        return self._files.get(pure(path))


def _asker(root: str, names: tuple[str, ...]):
    """What the child runs: list the ports, then read `names` under each, one report per
    answer (what was answered before a read that hangs comes back)."""

    def ask(emit) -> None:
        ports: list[tuple[str, str, str, bool]] = []
        dropped = 0
        unlisted: dict[str, str] = {}
        for hca, port, virtual in _each_port(root, unlisted):
            if len(ports) >= MAX_PORTS:
                dropped += 1
                unlisted.setdefault(hca, f"more than {MAX_PORTS} ports")
                continue
            ports.append((hca, port, os.path.join(root, SOURCE, hca, "ports", port), virtual))
        emit({"ports": [[h, p, v] for h, p, _, v in ports], "dropped": dropped,
              "unlisted": unlisted})
        # One report per port and directory (its attributes, then its counters): what came
        # before a read that hangs is kept, at a fraction of a report per file's cost.
        groups: dict[str, list[str]] = {}
        for name in names:
            groups.setdefault(name.rpartition("/")[0], []).append(name)
        for i, (_, _, pdir, _) in enumerate(ports):
            base = pdir
            for group in groups.values():
                emit({"p": i, "f": {n: read_text(f"{base}/{n}") for n in group}})

    return ask


def natural(name: str) -> tuple:
    """A sort key that puts mlx5_9 before mlx5_10: runs of digits compare as numbers."""
    parts: list = []
    digits = ""
    text = ""
    for ch in name:
        if ch.isdigit() and ch.isascii():
            if text:
                parts.append((0, text))
                text = ""
            digits += ch
        else:
            if digits:
                parts.append((1, int(digits)))
                digits = ""
            text += ch
    if digits:
        parts.append((1, int(digits)))
    if text:
        parts.append((0, text))
    return tuple(parts)


def _each_port(root: str, unlisted: dict[str, str]) -> Iterator[tuple[str, str, bool]]:
    """Every (HCA name, port name, whether the HCA is an SR-IOV virtual function): physical
    HCAs first, each group in natural name order (mlx5_9 before mlx5_10), so that past
    MAX_PORTS it is virtual functions' ports that are left, not the fabric's (40 HCAs of
    which 32 are VFs listed mlx5_10..mlx5_39 ahead of mlx5_4 in plain order). No class
    directory is no port; an HCA whose ports/ is gone (ENOENT: removed while listed) has
    none; one whose ports/ cannot be listed otherwise (not a directory, EIO, EACCES) goes
    into `unlisted` with why: the checker could not look, which is no evidence that its
    ports are gone."""
    top = os.path.join(root, SOURCE)
    try:
        names = os.listdir(top)
    except FileNotFoundError:
        return
    # One stat per HCA (a tree of thousands is cut at MAX_PORTS ports below, each listed)
    hcas = sorted((os.path.exists(os.path.join(top, h, "device", "physfn")), natural(h), h)
                   for h in names[:MAX_HCAS])
    for h in names[MAX_HCAS:]:
        unlisted.setdefault(h, f"more than {MAX_HCAS} HCAs")
    for virtual, _, hca in hcas:
        try:
            ports = sorted(os.listdir(os.path.join(top, hca, "ports")), key=natural)
        except FileNotFoundError:
            continue
        except OSError as exc:
            unlisted[hca] = exc.strerror or type(exc).__name__
            continue
        for port in ports:
            yield hca, port, virtual


def _timeout(env) -> float:
    cfg = getattr(env, "cfg", None)
    try:
        value = cfg.get("infiniband.read_timeout_s") if cfg is not None else None
        return float(value) if value is not None else DEFAULT_TIMEOUT_S
    except (TypeError, ValueError, AttributeError):
        return DEFAULT_TIMEOUT_S


def start(root: StrPath, env, names: Iterable[str]) -> IbReader:
    """The run's one reader, its child forked now (collect_all: before NVML is asked, so the
    ports are read while NVML answers): `names`, every file under a port the running
    families read."""
    found = env.shared[SHARED_KEY] = IbReader(
        root, env.deadline, names, _timeout(env), env.state, env.hangs_before)
    found.begin()
    return found


def reader(root: StrPath, env=None, names: Iterable[str] = ()) -> IbReader:
    """The run's one reader (kept in env.shared), or one that reads `names` (the asking
    family's) when the run started none."""
    if env is None or getattr(env, "shared", None) is None:
        return IbReader(root, getattr(env, "deadline", None), names, _timeout(env))
    found = env.shared.get(SHARED_KEY)
    if found is None or found.root != pure(root):
        found = env.shared[SHARED_KEY] = IbReader(
            root, env.deadline, names, _timeout(env), env.state, env.hangs_before)
    return found


def finish(env) -> None:
    """Wait for the run's reader's child if no family asked it (its hang still said)."""
    found = getattr(env, "shared", {}).get(SHARED_KEY)
    if found is not None:
        found.ports()


def said(read: IbReader, env, family: str) -> None:
    """One collector error for what the reader left unread (the deadline, MAX_PORTS, a child
    that failed); a hang is the engine's ib_hung, said once a run."""
    state = getattr(env, "state", None)
    if state is None:
        return
    if read.skipped:
        state.errors.append((family, SOURCE, "stage deadline passed: the ports were not "
                                             "read this run"))
        read.skipped = 0
    if read.error:
        state.errors.append((family, SOURCE, f"port read failed: {read.error}"))
        read.error = None
    if read.dropped:
        state.errors.append((family, SOURCE, f"more than {MAX_PORTS} ports: "
                                             f"{read.dropped} not read"))
        read.dropped = 0
    cannot = {h: why for h, why in read.unlisted.items() if not why.startswith("more than")}
    if cannot and not read._said_unlisted:
        read._said_unlisted = True
        state.errors.append((family, SOURCE, "ports not listed: " + ", ".join(
            f"{h} ({why})" for h, why in sorted(cannot.items()))[:300]))
