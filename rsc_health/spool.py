"""The node's local spool: every result the node path produces is appended here first.

The node's verdict never waits on the database: the prolog, epilog and sweep append JSON lines
to `<state_dir>/spool/pending.jsonl` (flock'd, fsync'd) and are done. The historian delivers the
spool later (`healthctl spool flush`), inserting by each record's unique `id`, so a record that
is delivered twice lands once.

Record kinds (every record has "kind", "id", "time" (ISO 8601, UTC) and "node"):

  check      source, job_id, check, component, status, severity, code, reason
  job_start  job_id, excluded (list of node names the job excluded), user, partition, nodes
             (the job's SLURM_JOB_NODELIST, a hostlist: its members before sacct tells them)
  job_end    job_id
  action     action (an ActionKind: drain_now, drain_after_job, resume, requeue,
             requeue_refused, guard_tripped, held_under_drain, would_drain), reason, job_id
  heartbeat  source, level, checker_errors, duration_s, families ({family: status}), version,
             and hung ({probe: since}) while a probe hangs: one per prolog/epilog/sweep run,
             so the historian knows the node is still looking
  telemetry  source, job_id, interval_s (seconds the rates cover; null on a first run, after
             a reboot or a gap), metrics ({metric: {value, component}} in the vocabulary of
             model.Metric, e.g. {"throttle_hw_frac": {"value": 0.4, "component": "gpu3"}}):
             one per run of the telemetry family (every sweep), dropped first when the spool
             is full (a sample is not news)

Nothing standing at a spool name is trusted: a symlink there is never followed (a secret it
points at would be delivered or quarantined) and a FIFO never opened blocking (a flush would
wait for ever); each is refused, and the flush sets it aside as NAME.not-a-file-NS. A file
another user owns there (a spool directory others may write is allowed when it is sticky,
which keeps them from replacing ours, not from adding theirs) is no record of this node's:
append never writes to (nor waits on the lock of) a pending.jsonl of theirs (a file,
symlink, FIFO, directory, socket) but puts its records in a batch file of its own (made
whole under a fresh name, as write_atomic makes any file), so the node loses none to
whoever keeps making one; the flush sets such a pending.jsonl, batch or lock file aside as
NAME.not-ours-NS (anything else not a file as NAME.not-a-file-NS), never delivering,
appending to or locking it. Nor do their files count toward the spool's size (size_bytes).

Standard library only: the prolog imports this.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from rsc_health import lazyre
from rsc_health.collect.sysfs import ours
from rsc_health.compat import datetime, json_dumps, json_loads
from rsc_health.durable import fsync_dir, judge_directory, make_dirs, open_regular, write_atomic
from rsc_health.model import Finding, Severity, Status, new_record_id

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

PENDING = "pending.jsonl"
# The spool's directory: records name jobs and their users, so not for everyone to read.
SPOOL_DIR_MODE = 0o750
KINDS = ("check", "job_start", "job_end", "action", "heartbeat", "telemetry")
TELEMETRY_FAMILY = "telemetry"  # the family whose OK finding carries the run's sample


def record(kind: str, node: str, time: datetime, **fields) -> dict:
    if kind not in KINDS:
        raise ValueError(f"unknown spool record kind {kind!r}")
    return {"kind": kind, "id": new_record_id(), "time": time.isoformat(), "node": node, **fields}


def check_records(
    findings: Iterable[Finding], *, node: str, source: str, time: datetime, job_id: str | None
) -> list[dict]:
    """One record per finding that is not OK, plus one OK row per all-clear family.

    Recording every OK component of every sweep would write ~100 rows per node every five
    minutes; the family-level OK row keeps "this was checked and clean" at 1/20th the volume.
    """
    findings = list(findings)
    bad_families = {f.family for f in findings if f.status is not Status.OK}
    out = []
    for f in findings:
        if f.status is Status.OK:
            continue
        rec = record(
            "check",
            node,
            time,
            source=source,
            job_id=job_id,
            check=f.family,
            component=f.component,
            status=f.status.value,
            severity=f.severity.severity_word,
            code=f.code,
            reason=f.reason,
        )
        key = f.data.get("event_key") if isinstance(f.data, dict) else None
        if key:
            import hashlib  # only for event records: most runs have none

            # surrogateescape: a node name that was not UTF-8 (os.environ's lone surrogates)
            # must not fail the run at its spool step.
            rec["id"] = hashlib.sha256(f"{node}|{key}".encode("utf-8", "surrogateescape")
                                       ).hexdigest()[:32]
        out.append(rec)
    for family in sorted({f.family for f in findings} - bad_families):
        out.append(
            record(
                "check",
                node,
                time,
                source=source,
                job_id=job_id,
                check=family,
                component="*",
                status=Status.OK.value,
                severity=Severity.NONE.severity_word,
                code="",
                reason="all clear",
            )
        )
    return out


def telemetry_records(findings: Iterable[Finding], *, node: str, source: str, time: datetime,
                      job_id: str | None) -> list[dict]:
    """The run's `telemetry` record: the sample the telemetry family's OK finding carries
    (checks/telemetry.py), none when that family did not run."""
    data = telemetry_sample(findings)
    if data is None:
        return []
    return [record("telemetry", node, time, source=source, job_id=job_id,
                   interval_s=data.get("interval_s"), metrics=data["metrics"])]


def telemetry_sample(findings: Iterable[Finding]) -> dict | None:
    """{metrics, interval_s, ...}: the telemetry family's sample among `findings`, if any."""
    for f in findings:
        data = f.data if isinstance(f.data, dict) else {}
        if f.family == TELEMETRY_FAMILY and f.status is Status.OK and "metrics" in data:
            return data
    return None


def size_bytes(spool_dir: str | os.PathLike) -> int:
    """What the spool holds on disk: pending.jsonl and batches not yet delivered. Only our own
    files count: another user's in a sticky spool (a sparse file of any size costs them
    nothing) would otherwise fill [node] spool_max_mb and make the node drop its own
    all-clear rows and heartbeats."""
    total = 0
    try:
        with os.scandir(os.fspath(spool_dir)) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    if ours(st.st_uid):
                        total += st.st_size
    except OSError:
        return 0
    return total


def carries_news(rec: dict) -> bool:
    """A record that must be kept however full the spool is: anything but an all-clear check
    row or a heartbeat (those say 'still fine', which the next delivered run says again)."""
    kind = rec.get("kind")
    if kind in ("heartbeat", "telemetry"):
        return False
    return not (kind == "check" and rec.get("status") == Status.OK)


def append(spool_dir: str | os.PathLike, records: list[dict]) -> None:
    """Append records durably and all-or-nothing. Raises OSError if the disk refuses (full,
    read-only); then the file is cut back to where it was, so a later run never finds half a
    record, and the caller knows nothing was spooled (callers log and carry on).

    One write(2) of all the lines on an O_APPEND fd, under the flock: a short write (a full
    disk) is cut back, never completed by a second write. What no code can cut back is a
    writer killed inside its write(2) (SIGKILL, the watchdog's os._exit, the OOM killer): the
    kernel may have put the first part of the line on disk. So every append first looks at
    the file's last byte and starts on a fresh line when it is not a newline: the torn line
    stays one unreadable line on its own (the historian quarantines it) and costs no record
    appended after it (tests/node/test_spool_torn.py)."""
    if not records:
        return
    spool_dir = os.fspath(spool_dir)
    if not os.path.isdir(spool_dir):
        make_dirs(spool_dir, SPOOL_DIR_MODE)
        fsync_dir(_parent(spool_dir))
    judge(spool_dir)
    data = "".join(json_dumps(r, separators=(",", ":"), sort_keys=True) + "\n" for r in records)
    payload = data.encode("utf-8", "surrogateescape")
    fd = _open_locked_pending(os.path.join(spool_dir, PENDING))
    if fd is None:
        _append_aside(spool_dir, payload)
        return
    try:
        size = os.fstat(fd).st_size
        # An empty file is most likely one this open created (the first append since a
        # flush claimed the last): its name is only durable once the directory is fsync'd.
        new_name = size == 0
        if size and os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        try:
            written = os.write(fd, payload)
            if written != len(payload):
                raise OSError(errno.ENOSPC, f"short write to the spool ({written} of "
                              f"{len(payload)} bytes)")
            os.fsync(fd)
            if new_name:
                fsync_dir(spool_dir)
        except BaseException:
            # BaseException: an exception a signal handler raises between the write and the
            # fsync must not leave half an append behind either.
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def judge(spool_dir: str | os.PathLike) -> None:
    """UnsafeDirectory (a PermissionError) unless the spool and the directory it is named in
    meet DIRECTORY_RULE (as write_atomic judges every other file root writes): in a state dir
    another user owns, they could swap spool/ for a link to a directory of theirs, and root
    appended its records to a file they had seeded with a forged `resume` line, for the flush
    to deliver. Every append judges it, and every flush before it writes or reads there."""
    spool_dir = os.fspath(spool_dir)
    for directory in (_parent(spool_dir), spool_dir):
        judge_directory(directory)


def _open_locked_pending(path: str) -> int | None:
    """pending.jsonl opened for appending and flock'd, and still the file of that name once
    the lock is held. Between our open and our lock a flush may have claimed the file (renamed
    it to a batch), read it and deleted it: records appended to that inode would be lost, so
    the file is opened afresh (a claim only ever renames pending.jsonl away, so this ends);
    so is it when what refused the open is gone by the time its owner is looked at.

    None when anything of another user's stands there (a sticky spool dir: made
    first, or again after each flush): its lines would be delivered as ours, and refusing
    would lose the node's records to whoever made it; the caller spools them aside
    (_append_aside), and the flush sets theirs aside (claim). Its owner is looked at before
    its lock is taken: they could hold that lock for ever."""
    refused: OSError | None = None
    for _ in range(100):
        try:
            fd = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError as exc:
            # Whatever the open said (ELOOP: a symlink; EINVAL: a FIFO; ENXIO: a socket;
            # EISDIR: a directory; EACCES: a file of theirs under fs.protected_regular, or
            # a symlink under protected_symlinks), a thing of theirs at the name sends the
            # records aside. Its owner is looked at only once the open failed.
            owner = _owner(path)
            if owner is None and exc.errno in (errno.EACCES, errno.ELOOP, errno.EINVAL,
                                               errno.EISDIR, errno.ENXIO, errno.ETXTBSY,
                                               errno.EWOULDBLOCK):
                # What refused the open is gone since (the flush set it aside, its owner
                # removed it): the name is free, so open again.
                refused = exc
                continue
            if owner is not None and not ours(owner):
                return None
            raise
        refused = None
        try:
            held = os.fstat(fd)
            if not ours(held.st_uid):
                os.close(fd)
                return None
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                named = os.stat(path)
            except FileNotFoundError:
                named = None
            if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    if refused is not None:
        raise refused
    raise OSError(errno.EAGAIN, f"{path} was claimed away 100 times in a row")


def _owner(path: str) -> int | None:
    """The uid owning what stands at `path` (not followed); None when nothing does."""
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return None


def _append_aside(spool_dir: str, payload: bytes) -> None:
    """The records of an append that found another user's pending.jsonl: a batch file of
    their own, whole or not at all (write_atomic: a fresh name renamed into place, never one
    planted), that the next flush delivers as it does a claimed pending.jsonl. The random
    part keeps it from any name a claim picks. Raises OSError."""
    stamp = datetime.now().strftime('%Y%m%dT%H%M%S%f')
    name = f"batch-{stamp}-{os.urandom(6).hex()}.jsonl"
    write_atomic(os.path.join(spool_dir, name), payload, mode=0o640)


def _regular(path: str) -> bool:
    """A regular file of ours stands at `path` (not a symlink to one); anything else (another
    user's file too) is set aside for a person to look at, so it neither blocks nor misleads
    a flush again."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(st.st_mode) and ours(st.st_uid):
        return True
    why = "not-ours" if stat.S_ISREG(st.st_mode) else "not-a-file"
    try:
        os.rename(path, f"{path}.{why}-{time.time_ns()}")  # path: a name in the spool dir
    except FileNotFoundError:
        pass
    return False


def claim(spool_dir: str | os.PathLike) -> list[str]:
    """Move pending records aside for delivery; returns every batch awaiting delivery.

    The rename is atomic and the flock waits for any writer mid-append, so no line is torn or
    lost; batches from an earlier failed delivery are returned again. Callers hold flush_lock.
    A symlink, FIFO or anything else that is not a file, at pending.jsonl or named like a
    batch, is set aside (never read: it would block, or deliver what it points at), and so is
    a file there another user owns (its lines would be delivered as this node's).
    """
    spool_dir = os.fspath(spool_dir)
    pending = os.path.join(spool_dir, PENDING)
    if _regular(pending):
        stamp = datetime.now().strftime('%Y%m%dT%H%M%S%f')
        batch = os.path.join(spool_dir, f"batch-{stamp}.jsonl")
        # The name is the wall clock's: a clock stepped back onto (or frozen at) the instant
        # of a batch still waiting for delivery would rename over it and lose it. Callers hold
        # flush_lock, so no other claim picks the same free name meanwhile.
        n = 0
        while os.path.exists(batch):
            n += 1
            batch = os.path.join(spool_dir, f"batch-{stamp}~{n}.jsonl")  # "~" sorts after "."
        fd = open_regular(pending)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(pending, batch)
            # The next append makes a new pending.jsonl: its name must not become durable
            # while this rename is not, or a power cut lets a delivered batch back in.
            fsync_dir(spool_dir)
        finally:
            os.close(fd)
    return [path for path in _batches(spool_dir) if _regular(path)]


def _batches(spool_dir: str) -> list[str]:
    """The paths of the names in `spool_dir` that match batch-*.jsonl, sorted (as sorted
    Path.glob gave them); none when it is not a directory one can list."""
    try:
        with os.scandir(spool_dir) as entries:
            names = [entry.name for entry in entries]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []
    return [os.path.join(spool_dir, name) for name in sorted(names)
            if len(name) >= 12 and name.startswith("batch-") and name.endswith(".jsonl")]


FLUSH_LOCK = ".flush.lock"


class SpoolBusy(RuntimeError):
    """Another flush is delivering this spool now."""


class flush_lock:  # noqa: N801 - used as the function it was: `with flush_lock(dir):`
    """One flush of a spool at a time. Two at once claim the same batch files and each reads
    the historian before the other writes, so each counts the batch's failures: the second
    raises SpoolBusy instead (the first delivers everything that was claimable). Taken on
    entering the `with` (a class, not contextlib's decorator: the prolog imports this
    module)."""

    def __init__(self, spool_dir: str | os.PathLike) -> None:
        self._spool_dir = os.fspath(spool_dir)
        self._fd: int | None = None

    def __enter__(self) -> None:
        path = os.path.join(self._spool_dir, FLUSH_LOCK)
        _regular(path)  # another user's lock file (they could hold it for ever): set aside
        fd = open_regular(path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            owner = os.fstat(fd).st_uid
            if not ours(owner):  # planted again since
                raise OSError(errno.EPERM, f"owned by uid {owner}, not ours: refused", path)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolBusy(f"another spool flush of {self._spool_dir} is running") from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def __exit__(self, *exc_info: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_batch(path: str | os.PathLike) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, record or None when the line is not valid JSON, raw line). Only a regular
    file of ours is read (open_regular): OSError for a symlink or FIFO, or another user's file,
    put there since the claim."""
    fd = open_regular(path)
    try:
        owner = os.fstat(fd).st_uid
        if not ours(owner):
            raise OSError(errno.EPERM, f"owned by uid {owner}, not ours: refused",
                          os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    with open(fd, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json_loads(line)
                if "\\ud" in line or "\\uD" in line:
                    obj = without_lone_surrogates(obj)  # two frames a level: deeper than json
            except (ValueError, RecursionError):  # [[[[... nested; ValueError: 5,000 digits
                yield lineno, None, line
                continue
            yield lineno, obj if isinstance(obj, dict) else None, line


_LONE_SURROGATE = lazyre.compile("[\ud800-\udfff]")  # compiled by the first flush that needs it


def without_lone_surrogates(value):
    """A path or log text that was not UTF-8 on the node reaches the spool as escaped lone
    surrogates (\\udce9): no database driver can encode them, and one such record would stop
    every later flush of the node. They become U+FFFD, as undecodable bytes do elsewhere."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_lone_surrogates(v) for v in value]
    return value


def done(path: str | os.PathLike) -> None:
    """A batch was delivered (or quarantined): remove it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _parent(path: str) -> str:
    """The directory holding `path` as Path(path).parent names it: empty and "." parts do not
    count ("a/b/" -> "a", "a//b" -> "a", "b" -> ".", "/" -> "/")."""
    root = "/" if path.startswith("/") else ""
    parts = [part for part in path.split("/") if part and part != "."]
    return root + "/".join(parts[:-1]) if len(parts) > 1 else root or "."
