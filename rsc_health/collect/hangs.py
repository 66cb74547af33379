"""Probes that keep hanging: which one (statvfs of a mount, NVML, the InfiniBand ports' sysfs
read), since when, for how many sweeps in a row.

One run says its own hang (`mount_hung`, `nvml_hung`, `ib_hung`). What one run cannot say is
that the probe has hung on every run for an hour: a wedged driver answers no NVML call until the
GPU is reset, and a checker error for ever lets jobs start on it. The node state keeps, per probe
still hanging, when it first hung and how many sweeps in a row found it hung:
{"boot_id": ..., "probes": {"nvml": {"since": ISO time, "sweeps": 3, "pid": 4242, "start":
123456}}}. A probe that answers is dropped; a new boot starts afresh (a reboot is the cure).

A GPU whose handle NVML refuses (collect.gpu.HANDLE_REFUSED), or gives but then refuses
every health call so (collect.gpu.GpuState.unanswered), is kept the same way, under
`nvml_handle gpuN`, with no child: it is not a hang, but NVML answers nothing for it either,
and what one run cannot tell from a moment's contention, sweeps in a row can.

pid and start (its start time, /proc/PID/stat) name the child the run abandoned. While that
child is still in the kernel the probe is not asked again: the child itself is the answer (it
returns the moment the mount or the driver does), and asking again would only leave one more
process stuck behind it: one per run, hundreds in a day-long storage outage, each holding the
memory of the run it was forked from. A statvfs child's record also names the mount it was
abandoned on ("mount": its ID and device, collect.mounts.standing): once another mount stands
at the path (the operator's remount; the old one detached, its child stuck on it for good) the
path is asked afresh, one new child at most, and the old child is forgotten.

That bound must hold whatever the state dir's disk does. The record is kept twice (`Kept`):
in the state dir and in a runtime dir on tmpfs (RUNTIME_DIR under the node's root, /run: no
disk behind it), each copy numbered (`seq`), and the newer one read. It is saved whether or
not the run's findings could be spooled (it consumes no event). A copy that cannot be read
(garbled, or where someone else could have put it), a save that no copy took (an empty copy
is then left where one can be: a full disk still takes a file of no bytes), a state dir that
refuses writes or a node lock held by another run: then the run does not trust the record
and finds the children abandoned before it in /proc (`find_waiting`), by the marker each
child holds while it asks (collect.bounded.hold_mark). A healthy run reads two names that are
not there and scans nothing.

Standard library only: the prolog uses this on every job start.
"""

from __future__ import annotations

import os
import stat

from rsc_health.collect.kmsg import save_json
from rsc_health.collect.sysfs import ours, pure
from rsc_health.compat import datetime, json_dumps, json_loads
from rsc_health.durable import load_state_json

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

NVML = "nvml"
STATVFS = "statvfs"
IB = "ib"  # the InfiniBand ports' sysfs read (collect.ibports)
NVML_HANDLE = "nvml_handle"  # a GPU's handle NVML refuses (nvml_handle(index)): no child


def nvml_handle(index: int) -> str:
    """The record's name of gpuN's refused handle: `nvml_handle gpu3`."""
    return f"{NVML_HANDLE} gpu{index}"


# The runtime copy's directory under the node's root: /run is a tmpfs, whatever the state
# dir's disk does (full, read-only), and a reboot, which ends every hang, empties it.
RUNTIME_DIR = "run/rsc-health"


def runtime_dir(root: StrPath) -> str:
    return pure(os.path.join(root, RUNTIME_DIR))  # str(Path(root) / RUNTIME_DIR)


def statvfs(path: str) -> str:
    """The probe name of one mount's statvfs: `statvfs /home`."""
    return f"{STATVFS} {path}"


def kind(probe: str) -> str:
    return probe.split(" ", 1)[0]


def load(path: StrPath) -> dict:
    """{"boot_id", "probes", "seq", "lost"}; anything malformed or unreadable is no hang on
    record (the count starts again: a wedged driver is then found N sweeps later, never
    wrongly) and lost (the run looks for the children in /proc: `Kept`). seq: -1 when there
    is none, 0 for a record written before copies were numbered."""
    return _parsed(load_state_json(path))


def _parsed(data: dict) -> dict:
    probes = data.get("probes") if isinstance(data.get("probes"), dict) else {}
    clean = {
        str(name): {k: v for k, v in p.items() if k in ("since", "sweeps", "pid", "start")
                    and (k == "since" or type(v) is int)
                    or k == "after_health" and v is True
                    or k == "mount" and isinstance(v, str)}
        for name, p in probes.items()
        if isinstance(p, dict) and isinstance(p.get("since"), str)
        and type(p.get("sweeps")) is int and p["sweeps"] >= 0
    }
    boot = data.get("boot_id")
    seq = data.get("seq")
    return {"boot_id": boot if isinstance(boot, str) else None, "probes": clean,
            "seq": seq if type(seq) is int else 0 if data else -1, "lost": "lost" in data}


# What a runtime copy may weigh: a record names a handful of probes.
RECORD_BYTES = 1 << 16


def _load_runtime(path: str) -> dict:
    """The runtime copy as load() gives it. Believed only as a regular file of root's (or this
    process's user's) that no one else may write, in a directory root's alone
    (durable.kept_by_root_alone): a record planted there could name any long-lived process
    and blind the probe for as long as it lives. Lost otherwise. A healthy node has none:
    one failed open."""
    from rsc_health.durable import kept_by_root_alone

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return _parsed({})
    except OSError as exc:
        return _parsed({"lost": exc.strerror or str(exc)})
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or not ours(st.st_uid)
                or st.st_mode & 0o022 or st.st_size > RECORD_BYTES):
            return _parsed({"lost": "not a file of root's alone"})
        data = os.read(fd, RECORD_BYTES + 1)
    except OSError as exc:
        return _parsed({"lost": exc.strerror or str(exc)})
    finally:
        os.close(fd)
    parent = os.path.dirname(path)
    if not kept_by_root_alone(parent):
        return _parsed({"lost": f"{parent} is not root's alone"})
    try:
        doc = json_loads(data)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the decoder
        return _parsed({"lost": "not JSON"})
    return _parsed(doc if isinstance(doc, dict) else {"lost": "not a JSON object"})


class Kept:
    """One record of the children runs abandoned (the node path's HANGS_FILE, or the read-only
    runs' CHECK_HANGS_FILE), kept in the state dir and in the runtime dir: the newer copy (this
    boot's, the higher seq) is the record. `lost`: a copy could not be believed, so the record
    may miss a child: the run looks in /proc (find_waiting).

    make: the runtime dir may be made (the node path); a read-only run writes a copy only
    where a directory root's alone already stands (durable.kept_by_root_alone)."""

    def __init__(self, name: str, sdir: StrPath, rdir: StrPath, boot_id: str,
                 *, make: bool = True) -> None:
        self.paths = (pure(os.path.join(sdir, name)), pure(os.path.join(rdir, name)))
        self.make = make
        self.copies = [load(self.paths[0]), _load_runtime(self.paths[1])]
        self.lost = any(c["lost"] for c in self.copies)
        usable = [c for c in self.copies if not c["lost"]] or [_parsed({})]
        self.record = max(usable, key=lambda c: (c["boot_id"] == boot_id, c["seq"]))

    def keepable(self) -> bool:
        """Whether a save could land anywhere: a directory root's alone that this process may
        write (a read-only run by a user, or pointed at a tree someone else owns, has none)."""
        from rsc_health.durable import kept_by_root_alone

        dirs = [os.path.dirname(p) for p in self.paths]
        return any(kept_by_root_alone(d) and os.access(d, os.W_OK) for d in dirs)

    def save(self, probes: dict[str, dict], boot_id: str) -> str | None:
        """Write each copy that does not say this already (none on a healthy run: nothing
        hanging, none on record). None when the record is kept; else what went wrong (the
        state dir's copy not written), for a checker finding. A save no copy took leaves each
        copy it can empty (lost: the next run looks in /proc)."""
        stale = [i for i, c in enumerate(self.copies) if not _says(c, probes, boot_id)]
        if not stale:
            return None
        doc = {"boot_id": boot_id, "probes": probes,
               "seq": max(c["seq"] for c in self.copies) + 1}
        failed: dict[int, OSError] = {}
        for i in stale:
            try:
                self._write(i, json_dumps(doc, sort_keys=True))
                self.copies[i] = {**doc, "lost": False}
            except OSError as exc:
                failed[i] = exc
        if not failed:
            return None
        held = [i for i, c in enumerate(self.copies) if _says(c, probes, boot_id)]
        if not held:
            for i in failed:
                try:
                    self._write(i, "")
                    self.copies[i] = _parsed({"lost": "empty"})
                except OSError:
                    pass
        if 0 not in failed:
            return None
        why = "; ".join(f"{os.path.dirname(self.paths[i])}: {failed[i].strerror or failed[i]}"
                        for i in sorted(failed))
        where = (f"kept in {os.path.dirname(self.paths[held[0]])}" if held else
                 "kept nowhere: the next run looks for its children in /proc")
        return f"cannot save {os.path.basename(self.paths[0])} ({why}); {where}"

    def _write(self, i: int, text: str) -> None:
        from rsc_health import durable

        path = self.paths[i]
        parent = os.path.dirname(path)
        if i == 1 and self.make and not os.path.isdir(parent):
            # Made only below a directory root's alone: never through a symlink.
            above = next(d for d in _parents(parent) if os.path.isdir(d))
            if not durable.kept_by_root_alone(above):
                raise durable.UnsafeDirectory(f"{above} is not root's alone: refused")
            durable.make_dirs(parent)
        if (i == 1 or not self.make) and not durable.kept_by_root_alone(parent):
            raise durable.UnsafeDirectory(f"{parent} is not root's alone: refused")
        durable.write_atomic(path, text)


def _parents(path: str) -> list[str]:
    """pathlib's PurePath(path).parents as str: each directory above `path`, nearest first,
    ending at "/" (or "." for a relative path)."""
    out: list[str] = []
    top = ("//" if path[:2] == "//" and path[2:3] != "/" else  # POSIX keeps a leading //
           "/" if path.startswith("/") else ".")
    path = path.rstrip("/") or top
    while True:
        up = os.path.dirname(path).rstrip("/") or top
        if up == path or path == ".":
            return out
        out.append(up)
        path = up


def _says(copy: dict, probes: dict[str, dict], boot_id: str) -> bool:
    """Whether a copy already holds this record (none at all says nothing hangs)."""
    return (not copy["lost"] and copy["probes"] == probes
            and copy["boot_id"] in (None, boot_id))


def with_found(record: dict, found: dict[str, dict], boot_id: str, now: datetime) -> dict:
    """The record with the abandoned children find_waiting found: a probe whose child on record
    is not one still waiting (or that has none on record) is named by the one found, so it is
    not asked again (since when and how many sweeps stay the record's where it has them)."""
    if not found:
        return record
    probes = dict(current(record, boot_id))
    for name, child in found.items():
        rec = probes.get(name)
        if still_waiting(rec):
            continue
        was = rec or {"since": now.isoformat(), "sweeps": 0}
        probes[name] = {**{k: v for k, v in was.items()
                           if k not in ("pid", "start", "after_health", "mount")}, **child}
    return {**record, "boot_id": boot_id, "probes": probes}


def marker(probe: str, root: StrPath) -> str:
    """The name of the memfd a probe's child holds while it asks (bounded.hold_mark)."""
    return f"rsc-health probe under {root}: {probe}"


_SIGKILL = 1 << 8  # bit 9 - 1 of a /proc status signal mask


def find_waiting(root: StrPath) -> dict[str, dict]:
    """{probe: {"pid", "start"}}: the children runs under `root` abandoned that are still in
    the kernel, found in /proc. For a run without a record it can trust (Kept.lost, a state
    dir that refuses writes, the node lock held): a read of /proc/PID/stat per process.

    A process counts when it is alive (in the kernel, D or R, or a zombie main thread whose
    prober thread is: `_start_time`), SIGKILL is pending on it (the run that abandoned it
    killed it: a child a run is still waiting on is in flight, not abandoned, and counting it
    would say a hang that is not there), it holds the probe's marker (a memfd named
    marker(probe, root): the mount prober's threads each hold their mount's until it answers)
    and every uid of it is root's (or this process's): anyone can name a memfd so and get a
    process of theirs stuck on a FUSE mount of their own, and blind the probe with it. Of
    several, the oldest."""
    prefix = "/memfd:" + marker("", root)
    me, euid = os.getpid(), os.geteuid()
    found: dict[str, dict] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            state, start = _stat(f"/proc/{pid}/stat")
            if state not in ("D", "R", "Z"):
                continue
            status = _status(pid)
        except (OSError, ValueError, IndexError):
            continue
        if not _root_and_killed(status, euid):
            continue
        for probe in _marks(pid, prefix):
            if probe not in found or start < found[probe]["start"]:
                found[probe] = {"pid": pid, "start": start}
    return {p: c for p, c in found.items() if _start_time(c["pid"]) == c["start"]}


def _status(pid: int) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as file:
        text = file.read()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _root_and_killed(status: dict[str, str], euid: int) -> bool:
    try:
        uids = [int(u) for u in status["Uid"].split()]
        pending = int(status.get("ShdPnd", "0"), 16) | int(status.get("SigPnd", "0"), 16)
    except (KeyError, ValueError):
        return False
    return bool(uids) and all(u in (0, euid) for u in uids) and bool(pending & _SIGKILL)


def _marks(pid: int, prefix: str) -> list[str]:
    """The probes whose marker process `pid` holds (its descriptors, read through a thread
    still alive: a zombie main thread has none)."""
    out: list[str] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        fds = f"/proc/{pid}/task/{tid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        if not names:
            continue
        for fd in names:
            try:
                link = os.readlink(f"{fds}/{fd}")
            except OSError:
                continue
            if link.startswith(prefix):
                out.append(link[len(prefix):].removesuffix(" (deleted)"))
        return out
    return out


def current(previous: dict, boot_id: str) -> dict[str, dict]:
    """The probes on record as hanging in this boot."""
    return (previous.get("probes") or {}) if previous.get("boot_id") in (None, boot_id) else {}


def update(previous: dict, boot_id: str, asked: set[str], hung: dict[str, int | None],
           now: datetime, *, sweep: bool, after_health: frozenset[str] | set[str] = frozenset(),
           mounts: dict[str, str] | None = None) -> dict[str, dict]:
    """The probes hanging after this run. `asked`: the probe kinds this run ran (a kind it did
    not run keeps its record); `hung`: the probes that did not answer, each with the pid of the
    child this run abandoned (None: none, the one on record is still waiting). A sweep that
    found a probe hung counts one more sweep. `after_health`: the hung probes whose child
    waits only past the health answers (after_health: true on the record, kept while that
    child is the one on record). `mounts`: the mount a statvfs child was abandoned on
    (collect.mounts.standing), kept with it; one other than the record's is a new hang."""
    before = current(previous, boot_id)
    out = {name: p for name, p in before.items() if kind(name) not in asked}
    mounts = mounts or {}
    for name in sorted(hung):
        was = before.get(name)
        mount = mounts.get(name) if hung[name] is not None else None
        if was is None or mount and was.get("mount", mount) != mount:
            was = {"since": now.isoformat(), "sweeps": 0}
        rec = {**was, "sweeps": was["sweeps"] + (1 if sweep else 0)}
        if hung[name] is not None:
            for key in ("pid", "start", "after_health", "mount"):
                rec.pop(key, None)
            start = _start_time(hung[name])
            if start is not None:
                rec.update(pid=hung[name], start=start)
                if name in after_health:
                    rec["after_health"] = True
                if mount:
                    rec["mount"] = mount
        out[name] = rec
    return out


def still_waiting(record: dict | None) -> bool:
    """The child a run abandoned on this probe is still in the kernel (alive, not a zombie,
    and the same process: its start time matches, so a reused pid is not mistaken for it)."""
    if not record or type(record.get("pid")) is not int or type(record.get("start")) is not int:
        return False
    return _start_time(record["pid"]) == record["start"]


def wedged(state, probe: str, limit: int) -> dict | None:
    """The probe's record when it hung (or was refused: NodeState.refused_probes) on this run
    and on `limit` sweeps in a row (the driver behind it is wedged: the node's fault, a drain
    for repair, not a checker error for ever); None otherwise, and always with limit <= 0.
    getattr: a state built by hand (a test, a replay tool) need not carry the hang fields."""
    if probe not in getattr(state, "hung_probes", {}) and \
            probe not in getattr(state, "refused_probes", {}):
        return None
    hang = getattr(state, "hangs", {}).get(probe)
    if hang is None or limit <= 0 or hang["sweeps"] < limit:
        return None
    return hang


def waited_s(record: dict, now: datetime) -> float:
    """Seconds since the probe first hung."""
    try:
        return max(0.0, (now - datetime.fromisoformat(record["since"])).total_seconds())
    except (KeyError, TypeError, ValueError):
        return 0.0


def _start_time(pid: int) -> int | None:
    """A live process's start time (clock ticks since boot, /proc/PID/stat field 22); None when
    it is gone or a zombie. /proc is this machine's, whatever root the checks read.

    Live means any of its threads: the mount prober's child asks each mount in a thread, and
    once killed its main thread is a zombie while the thread stuck in statvfs is still in the
    kernel (state D): the process is still waiting on that mount."""
    try:
        state, start = _stat(f"/proc/{pid}/stat")
        if state in _GONE:
            tasks = f"/proc/{pid}/task"
            if not any(_stat(f"{tasks}/{t}/stat")[0] not in _GONE for t in os.listdir(tasks)):
                return None
        return start
    except (OSError, ValueError, IndexError):
        return None


_GONE = ("Z", "X", "x")


def _stat(path: str) -> tuple[str, int]:
    """(state, start time) from a /proc stat file."""
    with open(path, encoding="utf-8") as file:
        stat = file.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def save(path: StrPath, probes: dict[str, dict], boot_id: str, *, sync_dir: bool = True) -> None:
    save_json(path, {"boot_id": boot_id, "probes": probes}, sync_dir=sync_dir)
