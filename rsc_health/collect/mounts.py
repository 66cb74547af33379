"""Mounts: presence, type and read-write from /proc/mounts, plus a liveness probe.

The probe calls statvfs in a forked child (a thread per mount in it) and gives up after a
timeout: a hung NFS, Lustre or FUSE mount blocks statvfs in the kernel, and the checker must
report that (`mount_hung`), not hang with it. A thread stuck in the kernel would keep the
prolog from exiting until the mount answers; an abandoned child does not
(rsc_health.collect.bounded), whatever its own threads are stuck in.
"""

from __future__ import annotations

import errno
import os
import time

from rsc_health.collect.sysfs import pure, read_bounded
from rsc_health.compat import json_loads
from rsc_health.record import dataclass

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]


@dataclass
class Mount:
    device: str
    path: str
    fstype: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    """/proc/mounts escapes space, tab, newline and backslash as octal (\\040)."""
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c == "\\" and i + 3 < len(field) + 0 and field[i + 1 : i + 4].isdigit():
            try:
                out.append(chr(int(field[i + 1 : i + 4], 8)))
                i += 4
                continue
            except ValueError:
                pass
        out.append(c)
        i += 1
    return "".join(out)


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mounts.append(
            Mount(_unescape(parts[0]), _unescape(parts[1]), parts[2], tuple(parts[3].split(",")))
        )
    return mounts


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/self/mountinfo (proc(5)): `id parent maj:min root mountpoint opts [tags] - fstype
    source superopts`. Read-only may be per mount (opts) or per superblock (superopts)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        head, tail = left.split(), right.split()
        if not sep or len(head) < 6 or len(tail) < 2:
            continue
        opts = head[5].split(",")
        if len(tail) > 2 and "ro" in tail[2].split(","):
            opts.append("ro")
        mounts.append(Mount(_unescape(tail[1]), _unescape(head[4]), tail[0], tuple(opts)))
    return mounts


def collect(root: StrPath) -> list[Mount]:
    """/proc/mounts, or /proc/self/mountinfo where only that exists (some containers).

    Raises OSError when neither can be read: an unreadable mount table is the checker's
    problem (a checker finding), never "every expected mount is missing"."""
    root = os.fspath(root)
    last: OSError | None = None
    for rel, parse in (("proc/mounts", parse_mounts), ("proc/self/mountinfo", parse_mountinfo)):
        try:
            table = parse(read_bounded(os.path.join(root, rel)).decode("utf-8", "replace"))
        except OSError as exc:
            last = exc
            continue
        if any(m.path == "/" for m in table):
            return table
        # Every live mount table has "/": one without it (empty, garbled) was not read right,
        # and must not say that every expected mount is missing.
        last = OSError(errno.ENODATA, "no / in it: not a mount table",
                       pure(os.path.join(root, rel)))
    raise last or OSError("no mount table")


# The probe; tests replace it with one that blocks to prove the timeout.
statvfs = os.statvfs


@dataclass
class ProbeResult:
    path: str
    ok: bool
    hung: bool
    seconds: float
    error: str | None = None
    pid: int | None = None  # the child abandoned when hung (collect.hangs)
    # The child closed its pipe without asking it (killed, crashed, or its asker raised):
    # nothing waits in the kernel, so not a hang: the checker's error (`error` says how).
    checker_fault: bool = False


def probe(root: StrPath, paths: list[str], timeout_s: float,
          alone: frozenset[str] | set[str] = frozenset()) -> dict[str, ProbeResult]:
    """statvfs every path in parallel; whatever has not answered by the deadline is hung (and
    the child asking it abandoned). One forked child asks them all, a thread per path (a hung
    mount holds its own thread, not the others' answers): one fork per run, not one per mount.
    A path in `alone` gets a child of its own (checks.mount: a path whose earlier hang shared
    its child with another's, so that each stuck child names one mount again)."""
    return finish(begin(root, paths, alone), timeout_s)


class Probing:
    """The children `begin` forked, asking statvfs while the run does something else."""

    def __init__(self, started: float, paths: list[str], groups: list[list[str]],
                 children: dict) -> None:
        self.started = started
        self.paths = paths
        self.groups = groups
        self.children = children


def begin(root: StrPath, paths: list[str],
          alone: frozenset[str] | set[str] = frozenset()) -> Probing:
    """Fork the statvfs children now (probe's first half): collect_all starts them before it
    waits on NVML or the InfiniBand ports, so a hung mount's wait overlaps theirs."""
    from rsc_health.collect import bounded, hangs

    started = time.monotonic()
    root = os.fspath(root)
    together = [p for p in paths if p not in alone]
    groups = ([together] if together else []) + [[p] for p in paths if p in alone]
    children = {str(i): bounded.start(_asker([_target(root, p) for p in group],
                                             [hangs.marker(hangs.statvfs(p), root)
                                              for p in group]), streaming=True)
                for i, group in enumerate(groups)}
    return Probing(started, list(paths), groups, children)


def _target(root: str, path: str) -> str:
    """str(Path(root) / path): the name statvfs is asked."""
    return pure(os.path.join(root, path.lstrip("/")) if path != "/" else root)


def standing(root: StrPath, paths: list[str]) -> dict[str, str]:
    """{path: the mount standing at it now}, as its mount ID and device ("812 0:61"): a
    remount has another, even while the old mount lives on detached (`umount -l`; a statvfs
    child stuck on it holds it), so a child abandoned on the old one says nothing of the new
    (checks.mount). Read from this process's /proc/self/mountinfo, not the one under `root`:
    the children ask the paths under `root` on this machine (a live node's root is /), as
    collect.hangs reads their /proc. A path without a mount of its own, or a table that cannot
    be read, is left out: nothing tells its mounts apart. Read only where a hang is on record
    or just found, never on a healthy run."""
    try:
        text = read_bounded("/proc/self/mountinfo").decode("utf-8", "replace")
    except OSError:
        return {}
    ids: dict[str, str] = {}
    for line in text.splitlines():
        head = line.partition(" - ")[0].split()
        if len(head) >= 5:  # `id parent maj:min root mountpoint ...` (proc(5))
            ids[_unescape(head[4])] = f"{head[0]} {head[2]}"  # the last on a path is visible
    base = os.path.realpath(root)  # mountinfo names real paths
    return {p: ids[t] for p in paths if (t := _target(base, p)) in ids}


def finish(probing: Probing, timeout_s: float) -> dict[str, ProbeResult]:
    """The answers of `begin`'s children, waited for until timeout_s after they started (what
    they answered by the time this is asked, when that has passed already)."""
    from rsc_health.collect import bounded

    groups, children = probing.groups, probing.children
    reports: dict[str, list] = {}
    answers = bounded.collect(children, probing.started + timeout_s, reports=reports)
    took = time.monotonic() - probing.started
    results: dict[str, ProbeResult] = {}
    for i, group in enumerate(groups):
        said = {r.get("i"): r for r in reports.get(str(i), []) if isinstance(r, dict)}
        for n, path in enumerate(group):
            answer = said.get(n)
            ended = answers.get(str(i))
            if answer is None and ended is not None:
                # Its child is gone without this answer: a crash, not a hang (bounded.Died).
                how = (f"exited without an answer ({ended[bounded.DIED]})"
                       if bounded.DIED in ended else
                       f"failed: {str(ended.get('error'))[:200]}" if "error" in ended else
                       "answered without it")
                results[path] = ProbeResult(path, False, False, took,
                                            f"the statvfs child {how}", checker_fault=True)
            elif answer is None:
                results[path] = ProbeResult(path, False, True, took, pid=children[str(i)][0])
            elif answer.get("error"):
                results[path] = ProbeResult(path, False, False, answer["seconds"],
                                            str(answer["error"]))
            else:
                results[path] = ProbeResult(path, True, False, answer["seconds"])
    return {path: results[path] for path in probing.paths}


def _asker(targets: list[str], marks: list[str] | None = None):
    """What the child runs: statvfs each target (the module's `statvfs`: tests replace it), in
    a thread each when there are several, reporting {"i", "seconds", "error"} per answer.
    marks: each target's marker, held until it answered (collect.hangs.find_waiting: a child
    stuck on one mount holds that mount's alone)."""

    def ask(emit) -> None:
        import _thread  # threading's own threads, without threading.py (every job start)

        from rsc_health.collect.bounded import hold_mark

        started = time.monotonic()

        def one(i: int, done=None) -> None:
            try:
                ask_one(i)
            finally:
                if done is not None:
                    done.release()

        def ask_one(i: int) -> None:
            held = hold_mark(marks[i]) if marks else None
            try:
                statvfs(targets[i])
                error = None
            except Exception as exc:  # noqa: BLE001 - reported to the parent as data
                error = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
            emit({"i": i, "seconds": time.monotonic() - started, "error": error})
            if held is not None:
                os.close(held)

        if len(targets) == 1:
            one(0)
            return
        # A thread each, joined as threading.Thread.join() would: by a lock it holds until
        # it returns (daemonic: nothing waits on one at exit; the child leaves by os._exit).
        dones = []
        for i in range(len(targets)):
            done = _thread.allocate_lock()
            done.acquire()
            _thread.start_new_thread(one, (i, done))
            dones.append(done)
        for done in dones:
            done.acquire()

    return ask


def replayed_probes(path: StrPath, paths: list[str]) -> dict[str, ProbeResult]:
    """Recorded outcomes ({path: ProbeResult fields}) for `paths`; unrecorded ones are left out.

    Raises OSError or ValueError when the file cannot be read or is not such a mapping."""
    doc = json_loads(read_bounded(path))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object of probe results")
    out = {}
    for p in paths:
        rec = doc.get(p)
        if isinstance(rec, dict):
            out[p] = ProbeResult(p, bool(rec.get("ok")), bool(rec.get("hung")),
                                 float(rec.get("seconds") or 0.0), rec.get("error"),
                                 checker_fault=rec.get("checker_fault") is True)
    return out
