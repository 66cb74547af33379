"""The node's local store under its state dir: the per-node lock, the pending drain verdict,
the mass-drain guard's backoff, and what a broken config falls back on.

A drain verdict not yet carried out (controller away, the guard holding, someone else's drain
standing) is kept in `pending_verdict.json` and acted on by the next sweep or prolog, because
the engine has already consumed the events behind it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from rsc_health import spool
from rsc_health.collect.sysfs import read_state
from rsc_health.compat import aware_time, datetime, json_dumps, json_loads, timedelta
from rsc_health.durable import remove, write_atomic
from rsc_health.model import Finding, Level, Verdict, utcnow
from rsc_health.node.sinks import log
from rsc_health.record import dataclass

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from rsc_health.config import Config
    from rsc_health.node.stage import Stage

LOCK_FILE = "node.lock"
PENDING_VERDICT_FILE = "pending_verdict.json"
STATE_DIR_MODE = 0o755
# Why a pending verdict waits on a backoff (PendingVerdict.why), as the logs say it.
HELD_BY = {"guard": "mass-drain guard", "foreign_drain": "someone else's drain"}


class LockTimeout(Exception):
    pass


class node_lock:  # noqa: N801 - used as the function it was: `with node_lock(sdir, t):`
    """flock on <state_dir>/node.lock, waited for no longer than timeout_s (_flock_until). Yields
    None, or what is wrong with the lock file, in words (the run says it as a checker error).

    A state dir that refuses writes (its filesystem remounted read-only after disk errors)
    must not blind the node path: flock needs no write access, so the lock file, or the
    directory itself when the file was never made, is opened read-only. That run can neither
    spool nor advance its cursor (it says so), but it still looks and acts. Nor must anything
    that is not a file at the lock's name (a directory, a symlink, a socket): every run finds
    the same thing there and locks the state dir itself instead. Yields (whether the state dir
    takes writes, what is wrong with the lock file or None). A state dir that does not (False):
    the run finds the probe children abandoned before it in /proc, as it can keep no record
    of them (collect.hangs). Taken on entering the `with`, released on leaving it (a class,
    not contextlib's decorator: every job start takes it)."""

    def __init__(self, sdir: str | os.PathLike, timeout_s: float) -> None:
        self._sdir = sdir
        self._timeout_s = timeout_s
        self._fd: int | None = None

    def __enter__(self) -> tuple[bool, str | None]:
        sdir, timeout_s = self._sdir, self._timeout_s
        own_state_dir(sdir)
        fd, note, writable = _open_lock(sdir)
        try:
            if not _flock_until(fd, time.monotonic() + timeout_s):
                raise LockTimeout(f"{os.path.join(sdir, LOCK_FILE)} held for {timeout_s:g}s")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return writable, note

    def __exit__(self, *exc_info: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class _Late(Exception):
    """The interval timer rang while flock waited: the wait's deadline has passed."""


def _ring(signum: int, frame: object) -> None:
    raise _Late


def _flock_until(fd: int, deadline: float) -> bool:
    """flock(fd) exclusively; False when it is still held by another at `deadline`
    (time.monotonic()). Free: taken at once. Held: waited for in flock itself, woken the moment
    the holder lets go, an interval timer (SIGALRM) ending the wait at the deadline; not polled
    with a sleep between looks, which kept a prolog behind an epilog or a sweep up to one more
    poll (50 ms) after the lock was free. Off the main thread (no signal handler can be set
    there) it polls, every 10 ms."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    import signal  # only when the lock is held: its enums cost every job start 0.5 ms

    try:
        previous = signal.signal(signal.SIGALRM, _ring)
    except ValueError:  # not the main thread
        return _poll_flock(fd, deadline)
    got = False
    try:
        left = deadline - time.monotonic()
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                got = True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except _Late:  # rang in flock (not taken), or just after it returned (taken: got says)
        pass
    finally:
        # None: a handler set outside Python, which signal() cannot put back; the default then.
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
    return got


def _poll_flock(fd: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.01, left))


# open(2) of something that is not a file at the lock's name: a symlink (O_NOFOLLOW), a
# directory, a socket.
_NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP)


def _open_lock(sdir: str | os.PathLike) -> tuple[int, str | None, bool]:
    """(descriptor to flock, what is wrong with the lock file or None, whether the state dir
    takes writes)."""
    # Held by this process alone: O_CLOEXEC (Python's default, said here) keeps it from the
    # programs a run executes (site checks, Slurm commands), and a probe forked without exec
    # closes it first thing (collect.bounded): a child stuck in the kernel must not hold it.
    # O_NOFOLLOW: a symlink planted at its name is not followed (nor created through).
    lock_file = os.path.join(sdir, LOCK_FILE)
    try:
        return os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                       0o644), None, True
    except OSError as exc:
        if exc.errno in _NOT_A_FILE:
            note = (f"{lock_file} is not a file ({exc.strerror}): the state dir is "
                    "locked instead until it is removed")
            log(note)
            return os.open(sdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), note, True
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        why = exc.strerror
    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # never made (or not a file): the directory itself
        fd = os.open(sdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    log(f"state dir {sdir} refuses writes ({why}): checking and acting, but nothing can be "
        f"spooled or remembered until it is writable")
    return fd, None, False


def own_state_dir(sdir: str | os.PathLike) -> None:
    """The state dir, made 0755 whatever the umask. One that others may write (made 0777 by an
    older version under umask 000) is ours to mend: anyone could plant a pending verdict,
    a drain record or a symlink in it, and write_atomic refuses it (durable.DIRECTORY_RULE)."""
    from rsc_health.durable import make_dirs, unsafe_directory

    make_dirs(sdir, STATE_DIR_MODE)
    for directory, mode in ((os.fspath(sdir), STATE_DIR_MODE),
                            (os.path.join(sdir, "spool"), spool.SPOOL_DIR_MODE)):
        try:
            st = os.lstat(directory)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and unsafe_directory(st):
                os.chmod(directory, mode)
                log(f"{directory} was writable by group or others (mode "
                    f"{stat.S_IMODE(st.st_mode):o}): made {mode:o}")
        except OSError:
            pass  # a read-only state dir: node_lock says so


# ---- pending verdicts -----------------------------------------------------------------------
@dataclass(frozen=True)
class PendingVerdict:
    verdict: Verdict
    # slurm_unavailable | guard | foreign_drain | fault | unrecorded (carried out, but the
    # drain record could not be told: node.act._unrecorded)
    why: str
    holds: int = 0  # how many runs in a row the mass-drain guard has held it back
    retry_after: datetime | None = None  # aware; no Slurm call for it before then
    time: datetime | None = None  # aware; when it was (last) kept


class CorruptPending(ValueError):
    """pending_verdict.json cannot be trusted (not a regular file, too big, not the JSON
    save_pending writes): load_pending discards it."""


def save_pending(sdir: str | os.PathLike, verdict: Verdict, *, why: str, holds: int = 0,
                 retry_after: datetime | None = None, now: datetime | None = None) -> bool:
    """Keep the verdict for the next run; whether it was kept (said on stderr when not)."""
    data = {"level": verdict.level.exit_code, "why": why,
            "causes": [c.to_dict() for c in verdict.causes],
            "time": (now or utcnow()).isoformat()}
    if holds:
        data.update(holds=holds, retry_after=retry_after.isoformat() if retry_after else None)
    try:
        # Its bytes and its name fsync'd: a power cut must not take the one memory of a drain
        # verdict whose XID left with the old boot's ring buffer.
        write_atomic(os.path.join(sdir, PENDING_VERDICT_FILE), json_dumps(data))
    except OSError as exc:
        log(f"cannot save the pending verdict ({exc})")
        return False
    return True


def load_pending(sdir: str | os.PathLike, lost: list[str] | None = None
                 ) -> PendingVerdict | None:
    """The pending verdict, or None; a corrupt file is discarded (removed: the next run
    decides afresh) and said, on stderr and, with `lost`, appended there for the run to say
    as a checker error: the file is there only while a drain verdict is held, so what it held
    (an XID whose line was consumed) may be gone with it."""
    try:
        return read_pending(sdir)
    except CorruptPending as exc:
        log(f"corrupt {PENDING_VERDICT_FILE} discarded: {exc}")
        clear_pending(sdir)
        if lost is not None:
            lost.append(str(exc))
        return None


def read_pending(sdir: str | os.PathLike) -> PendingVerdict | None:
    """The pending verdict, or None when there is none, read only (qualification's gate reads
    it so); CorruptPending for a file load_pending would discard."""
    try:
        data: Any = json_loads(read_state(os.path.join(sdir, PENDING_VERDICT_FILE)))
        causes = tuple(Finding.from_dict(c) for c in data["causes"])
        for c in causes:
            # JSON of the wrong types (a number or null where text belongs) would fail the
            # verdict step of every later run, before anything is spooled.
            if not all(isinstance(v, str) for v in (c.family, c.component, c.reason, c.code)):
                raise TypeError(f"cause {c.family!r}/{c.component!r} is not all text")
        holds = data.get("holds", 0)
        holds = holds if isinstance(holds, int) and not isinstance(holds, bool) else 0
        level = Level.from_exit_code(data["level"])  # stored as its exit code, as ever
        return PendingVerdict(Verdict(level, "", causes), str(data.get("why", "")),
                              max(0, min(holds, 64)), aware_time(data.get("retry_after")),
                              aware_time(data.get("time")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the decoder goes: it stopped every run at
        # its verdict step, for good (a checker fault each time, nothing ever drained).
        raise CorruptPending(str(exc)[:200]) from exc


def clear_pending(sdir: str | os.PathLike) -> None:
    try:
        # For good: not drained again after a power cut.
        remove(os.path.join(sdir, PENDING_VERDICT_FILE))
    except OSError:
        pass


# ---- the guard's backoff ----------------------------------------------------------------------
def guard_backs_off(cfg: Config, stage: Stage, pending: PendingVerdict, fresh: Verdict,
                    now: datetime) -> bool:
    """Leave Slurm alone for a verdict the guard or someone else's drain held? Only while
    nothing is new: a fault code the held verdict lacks, or a worse level, is tried at once.
    A job start never retries a guard-held one (the sweep does) and always retries one held
    under someone else's drain: a job starting here means that drain is most likely lifted,
    and the job must not run on the fault. A sweep or epilog retries once the backoff has run
    out, or at once when the wait left is longer than any backoff (the clock stepped back)."""
    if pending.why not in HELD_BY or not cfg.get("actions.enabled"):
        return False  # shadow mode asks Slurm nothing anyway: it records would_drain
    held = {c.code or c.family for c in pending.verdict.causes}
    new = {c.code or c.family for c in fresh.causes if fresh.drains} - held
    if new or fresh.level > pending.verdict.level:
        return False
    if stage.name == "prolog":
        return pending.why == "guard"
    longest = timedelta(minutes=1.5 * _guard_retry_minutes(cfg)[1])
    return pending.retry_after is not None and now < pending.retry_after <= now + longest


def _guard_retry_minutes(cfg: Config) -> tuple[float, float]:
    """[actions] guard_retry_min and guard_retry_max_min: the first backoff and the longest."""
    return (float(cfg.get("actions.guard_retry_min")),
            float(cfg.get("actions.guard_retry_max_min")))


def guard_retry_after(cfg: Config, holds: int, now: datetime,
                      rand: Callable[[], float] | None = None) -> datetime:
    """When a verdict the guard has held `holds` times is next tried: [actions]
    guard_retry_min doubling per hold up to guard_retry_max_min, times 0.5-1.5 at random so a
    fleet's held nodes do not all come back in the same minute."""
    import random

    first, most = _guard_retry_minutes(cfg)
    minutes = min(most, first * 2 ** min(holds - 1, 16))
    return now + timedelta(minutes=minutes * (0.5 + (rand or random.random)()))


# ---- other memories -------------------------------------------------------------------------
# actions.DRAIN_STATE_FILE (tests/unit/test_actions.py holds them equal).
DRAIN_RECORD = "slurm_drain.json"


def reboot_lift_owed(sdir: str | os.PathLike) -> bool:
    """Our drain record notes a reboot asked with nextstate=RESUME over a drain of ours that
    is never auto-resumed (actions.DrainState.reboot_resumes), or the boot a run last saw
    such a drain in place on (DrainState.boot): a job start asks Slurm whether a reboot lifted
    it, so the job does not run on the fault until the next sweep. A job starting here at all
    means the drain is gone: one Slurm read, on a node we drained for a repair."""
    from rsc_health.durable import load_state_json

    # Not imported from rsc_health.actions: that loads the Slurm side (~20 ms), and a healthy
    # job start loads none of it.
    record = load_state_json(os.path.join(sdir, DRAIN_RECORD))
    boot = record.get("boot")
    return record.get("reboot_resumes") is True or (isinstance(boot, str) and boot != "")


def has_drain_state(sdir: str | os.PathLike) -> bool:
    """A drain of ours is on record (the Actor's drain state file). Its name from here, not
    from rsc_health.actions: every clean sweep asks, and that module loads the Slurm side."""
    try:
        os.stat(os.path.join(sdir, DRAIN_RECORD))
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        # As Path.exists: a dangling or looping symlink is no record; anything else (EACCES,
        # EIO) cannot tell: ask Slurm, as before.
        return exc.errno not in (errno.ELOOP, errno.EBADF)
    except ValueError:  # a NUL in the name (Path.exists said False)
        return False
    return True


def remember_config(cfg: Config, sdir: str | os.PathLike, parsed: bytes | None = None) -> None:
    """What a broken config push falls back on (config.last_good_config, fallback_config)."""
    from rsc_health.config import remember_good

    try:
        remember_good(cfg, sdir, parsed)
    except OSError as exc:
        log(f"cannot remember the config's textfile dir and historian ({exc})")
