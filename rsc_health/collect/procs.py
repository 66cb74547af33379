"""Run a few programs at once, each in its own process group, read at most so much of their
output, and kill what is still running at its deadline.

For the `site` check family (programs the site wrote, so anything may happen) and Slurm's
commands (behind whatever wrapper a site puts around them). A program that hangs is SIGKILLed
with its whole process group at the deadline (a hung `df` or `scontrol` it started included)
and never waited for after that: a process stuck in the kernel (D state) dies when the kernel
lets go, and Popen reaps it later. Output past `max_bytes` is not read: the pipe is closed, so a
program printing forever stops at its next write (SIGPIPE). A program that exits while a
background child of its own still holds its stdout is done `exit_grace_s` later; the child is
left alone (it may be a remount or a service restart the check started on purpose). With
exit_grace_s=None its output is read to the end, as subprocess.run does, until the deadline,
and the group is killed there: a Slurm command's answer is not whole until its pipe closes.
The leader is not reaped until its group has had its SIGKILL (os.waitid WNOWAIT), so the group
id cannot have been reused by anyone else when it is signalled.

Standard library only, imported only when a site check is configured or Slurm is called.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Collection

    from _typeshed import StrPath  # str | os.PathLike[str]

# After the program exits, how long its pipes may stay open (held by a child it left behind).
EXIT_GRACE_S = 0.2
# How often a running program is asked whether it has exited while its pipes stay open.
POLL_S = 0.05
STDERR_KEEP = 2048


@dataclass
class Outcome:
    """What one program did. returncode: its exit status, -N for death by signal N, None when
    it was killed at its deadline (timed_out) or could not be started (start_error)."""

    name: str
    stdout: bytes = b""
    stderr: bytes = b""  # the first STDERR_KEEP (stderr_keep) bytes
    returncode: int | None = None
    timed_out: bool = False
    truncated: bool = False  # stdout went past max_bytes and was cut there
    start_error: str = ""
    elapsed_s: float = 0.0


@dataclass
class _Running:
    name: str
    proc: subprocess.Popen
    deadline: float
    started: float
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    err_seen: int = 0
    err_keep: int = STDERR_KEEP
    open_fds: dict[int, str] = field(default_factory=dict)  # fd -> "out" | "err"
    exited_at: float | None = None
    truncated: bool = False
    own_group: bool = True  # started in a session of its own: its pid is its group's id
    group_ends: bool = False  # its group is killed when it exits (run_all's group_ends_with)


# Process groups run_all started and has not finished with, by leader pid: what the node
# path's watchdog kills before its os._exit (which runs no cleanup), so a program still running
# when the whole run gives up does not outlive it. A set: add and discard are atomic.
_LIVE: set[int] = set()


def kill_live_groups() -> int:
    """SIGKILL every process group run_all still holds (from any thread); how many. Their
    leaders are not reaped yet, so each group id is still theirs."""
    killed = 0
    for pgid in list(_LIVE):
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def run_all(
    commands: dict[str, list[str]],
    *,
    timeout_s: dict[str, float],
    max_bytes: int,
    env: dict[str, str] | None = None,
    cwd: StrPath | None = None,
    exit_grace_s: float | None = EXIT_GRACE_S,
    stderr_keep: int = STDERR_KEEP,
    pass_fds: dict[str, int] | None = None,
    group_ends_with: Collection[str] = (),
    new_session: bool = True,
) -> dict[str, Outcome]:
    """Start every command now (argv lists, by name); return each one's Outcome no later than
    its timeout (plus the time to spawn and kill). Never raises for a program's behaviour.
    `pass_fds`: a descriptor a command inherits (its program, run as /proc/self/fd/N).
    `group_ends_with`: commands whose process group is SIGKILLed when they exit, whatever of
    it is still running (the NHC adapter: NHC runs in its group). `new_session=False`: the
    commands run in the caller's process group (so whoever kills the caller's group kills
    them) and are killed alone, by pid, at their deadline."""
    running: list[_Running] = []
    results: dict[str, Outcome] = {}
    for name, argv in commands.items():
        started = _start(name, argv, timeout_s[name], stderr_keep, env=env, cwd=cwd,
                         fd=(pass_fds or {}).get(name), new_session=new_session)
        if isinstance(started, Outcome):
            results[name] = started
        else:
            started.group_ends = name in group_ends_with
            running.append(started)
    while running:
        for r in list(running):
            outcome = _settled(r, time.monotonic(), max_bytes, exit_grace_s)
            if outcome is not None:
                results[r.name] = outcome
                running.remove(r)
        if running:
            _wait(running, max_bytes)
    return {name: results[name] for name in commands}


def _start(name: str, argv: list[str], timeout_s: float, stderr_keep: int, *, env, cwd,
           fd: int | None, new_session: bool = True) -> _Running | Outcome:
    """The command started in its own session (or the caller's process group), its pipes
    non-blocking; or the Outcome of one that could not start."""
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=new_session, close_fds=True, env=env, cwd=cwd,
            pass_fds=(fd,) if fd is not None else (),
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Outcome(name, start_error=why)
    if new_session:
        _LIVE.add(proc.pid)
    now = time.monotonic()
    r = _Running(name, proc, now + max(0.0, timeout_s), now, err_keep=stderr_keep,
                 own_group=new_session)
    for pipe_fd, kind in ((proc.stdout.fileno(), "out"), (proc.stderr.fileno(), "err")):
        os.set_blocking(pipe_fd, False)
        r.open_fds[pipe_fd] = kind
    return r


def _settled(r: _Running, now: float, max_bytes: int,
             exit_grace_s: float | None) -> Outcome | None:
    """The command's Outcome once it has exited and its pipes are done (or the grace after
    its exit is over), or once it is past its deadline (its group killed); None meanwhile."""
    if r.exited_at is None and _exited(r.proc):
        r.exited_at = now
    grace_over = exit_grace_s is not None and r.exited_at is not None and (
        now - r.exited_at >= exit_grace_s)
    if r.exited_at is not None and (not r.open_fds or grace_over):
        return _finish(r, max_bytes, timed_out=False)
    if now >= r.deadline and (r.exited_at is None or exit_grace_s is None):
        _kill_group(r.proc, r.own_group)
        return _finish(r, max_bytes, timed_out=True)
    return None


def _wait(running: list[_Running], max_bytes: int) -> None:
    """Read what the running commands wrote, waiting no later than the next deadline (and
    polling while an exit is one the pipes will not announce)."""
    fds = {fd: r for r in running for fd in r.open_fds}
    wait = min(r.deadline for r in running) - time.monotonic()
    if any(r.exited_at is not None for r in running) or any(not r.open_fds for r in running):
        wait = min(wait, POLL_S)  # waiting on an exit the pipes will not announce
    elif fds:
        wait = min(wait, 0.1)  # an exit behind pipes a left-behind child keeps open
    wait = max(0.0, wait)
    if not fds:
        time.sleep(wait)
        return
    ready, _, _ = select.select(list(fds), [], [], wait)
    for fd in ready:
        _read(fds[fd], fd, max_bytes)


def _read(r: _Running, fd: int, max_bytes: int) -> bool:
    """One read; False when there was nothing to read now (or the pipe is done)."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return False
    except OSError:
        chunk = b""
    if not chunk:
        _close(r, fd)
        return False
    if r.open_fds[fd] == "out":
        room = max_bytes - len(r.out)
        r.out += chunk[:room]
        if len(chunk) > room:
            r.truncated = True
            _close(r, fd)  # stop reading: the program's next write gets SIGPIPE
    else:
        r.err_seen += len(chunk)
        r.err += chunk[: max(0, r.err_keep - len(r.err))]
        if r.err_seen > max_bytes:
            _close(r, fd)
    return fd in r.open_fds


def _close(r: _Running, fd: int) -> None:
    r.open_fds.pop(fd, None)
    for stream in (r.proc.stdout, r.proc.stderr):
        if stream is not None and not stream.closed and stream.fileno() == fd:
            stream.close()


def _finish(r: _Running, max_bytes: int, *, timed_out: bool) -> Outcome:
    _LIVE.discard(r.proc.pid)  # before its leader is reaped: the group id may then be reused
    for fd in list(r.open_fds):
        # What the program wrote before it went is still in the pipe: take it (bounded).
        for _ in range(max_bytes // 65536 + 2):
            if not _read(r, fd, max_bytes):
                break
        _close(r, fd)
    for stream in (r.proc.stdout, r.proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    if r.exited_at is not None and not timed_out:
        if r.group_ends:  # what it leaves running goes too; not reaped yet: the id is its own
            _kill_group(r.proc, True)
        r.proc.wait()  # a zombie by now (_exited left it unreaped): this returns at once
    end = r.exited_at if r.exited_at is not None else time.monotonic()
    return Outcome(
        r.name, bytes(r.out), bytes(r.err), None if timed_out else r.proc.returncode,
        timed_out=timed_out, truncated=r.truncated, elapsed_s=round(end - r.started, 3),
    )


def _exited(proc: subprocess.Popen) -> bool:
    """Has the program exited? Asked without reaping it (WNOWAIT): its zombie keeps its pid,
    the id of its process group, from being handed to anyone else until _finish reaps it."""
    if proc.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return proc.poll() is not None


def _kill_group(proc: subprocess.Popen, own_group: bool = True) -> None:
    """SIGKILL the program's process group (its pid: start_new_session), or the program alone
    when it runs in the caller's group. The leader is not reaped yet, so the group id cannot
    have been reused by anyone else."""
    try:
        if own_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=0.05)  # reap it if it went; a process stuck in the kernel is left
    except subprocess.TimeoutExpired:
        pass
