"""Run a probe that can block in the kernel where it can be abandoned: a forked child.

statvfs on a hung NFS/Lustre/FUSE mount and NVML on a wedged driver block in the kernel
(D state). A thread stuck there keeps the whole process from exiting; a child process does
not: the parent stops waiting at the deadline, kills the child (the kill lands whenever the
kernel lets go) and goes on. The child's answer comes back as JSON over a pipe.

The child keeps none of the parent's descriptors but its pipe: a child stuck in the kernel
outlives the run that abandoned it (SIGKILL cannot end a FUSE request the daemon holds, nor an
ioctl into a wedged driver), and whatever it still held stayed held. The node lock is a flock,
and a flock belongs to the open file description, which a forked child shares: the stuck child
held the node lock for as long as the mount hung, and every later prolog and sweep waited for
it. (A POSIX fcntl lock is not inherited, but it is dropped when the process closes any
descriptor of that file and does not exclude the process's own threads; an OFD lock is
inherited like a flock. So the lock stays a flock, and the child lets go of it here.)

Standard library only: the prolog uses this on every job start.
"""

from __future__ import annotations

import os
import select
import time

from rsc_health.compat import json_dumps, json_loads

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Abandoned(Exception):
    """The probe did not answer within its deadline (or its child died without answering).
    `partial`: the last thing a streaming probe reported before that (None if nothing);
    `pid`: the child left behind (killed, but a child stuck in the kernel dies only when the
    kernel lets go)."""

    def __init__(self, message: str, partial: Any = None, pid: int | None = None):
        super().__init__(message)
        self.partial = partial
        self.pid = pid


# How long past its deadline a child still writing is read, while each look finds more: one
# that wrote more than its pipe holds before it was asked (collect.ibports, a node of many
# ports, waited on after NVML) is blocked on that pipe, not hung.
PIPE_GRACE_S = 0.25

DIED = "died"  # an answer's key: the child closed its pipe without one (its exit status)


class Died(Abandoned):
    """The child closed its pipe without an answer: it crashed (a segfault in the library it
    called) or was killed. Not a hang: nothing is left waiting in the kernel, and a caller that
    counts hangs toward a drain must not count this (a checker that crashes is the checker's
    fault)."""


def hold_mark(name: str) -> int | None:
    """A memfd named `name` (collect.hangs.marker: the probe and the node's root), held while
    the probe is asked: a later run with no record of the children abandoned before it that it
    can trust finds them by it (collect.hangs.find_waiting). None where no memfd is to be had
    (the probe is asked all the same). One syscall, in the child."""
    try:
        return os.memfd_create(name, os.MFD_CLOEXEC)
    except (AttributeError, OSError, ValueError):  # no memfd here, a name too long
        return None


def start(fn: Callable[..., Any], *, streaming: bool = False,
          mark: str | None = None) -> tuple[int, int]:
    """Fork a child that runs fn() and writes its JSON result; (pid, read fd). streaming: fn
    gets an `emit(obj)` to report how far it got, one JSON line each, before its result
    (json.dumps never writes a raw newline, so every message is one line). mark: the child
    holds hold_mark(mark) for as long as it lives."""
    r, w = os.pipe()
    _widen(w)
    pid = os.fork()
    if pid == 0:  # the child: answer and leave without running the parent's exit handlers
        code = 0
        try:
            os.close(r)
            # Let go of the parent's stdio: a stuck child must not hold the pipe a caller
            # (slurmd, systemd, a test) reads the parent's output from until EOF.
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            # Let go of every other descriptor (the node lock, the spool, other probes'
            # pipes) before anything that can block: see the module's docstring.
            os.closerange(3, w)
            os.closerange(w + 1, _max_fd())
            if mark is not None:
                hold_mark(mark)

            def emit(obj: Any) -> None:
                _write_all(w, json_dumps({"partial": obj}, default=str).encode() + b"\n")

            try:
                payload = {"ok": fn(emit) if streaming else fn()}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
                payload = {"error": f"{type(exc).__name__}: {exc}",
                           "errno": getattr(exc, "errno", None),
                           "strerror": getattr(exc, "strerror", None)}
            _write_all(w, json_dumps(payload, default=str).encode())
            # The parent's end of file now, not when the kernel has torn this process down
            # (an NVML child's exit closes the driver's handles: milliseconds on a real GPU).
            os.close(w)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


# Room asked for in each child's pipe (F_SETPIPE_SZ; Linux gives root up to
# /proc/sys/fs/pipe-max-size, 1 MiB by default): a child forked early and asked late (the IB
# ports' child, waited on after NVML) writes all it has without blocking on a pipe of 64 KiB.
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named there only from Python 3.10


def _widen(fd: int) -> None:
    """Ask for PIPE_BYTES of room in the pipe; a refusal (a user over its pipe quota, another
    system) leaves it as it is: PIPE_GRACE_S still reads a child blocked on it."""
    import fcntl

    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


def _max_fd() -> int:
    try:
        return max(os.sysconf("SC_OPEN_MAX"), 1024)
    except (OSError, ValueError):
        return 65536


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _messages(buf: bytes) -> list[dict]:
    """Every whole line of a child's output that is a JSON object, in order."""
    out = []
    for line in buf.split(b"\n"):
        if not line.strip():
            continue  # not JSON (json's decoder would import json just to say so)
        try:
            msg = json_loads(line)
        except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested too deep
            continue
        if isinstance(msg, dict):
            out.append(msg)
    return out


def _last_message(buf: bytes, key: str) -> Any:
    """The last whole line of a child's output that is a JSON object holding `key`. Lines are
    decoded from the last back, only as far as that one: a streaming child's answer is its last
    line, and its reports before it (the NVML child's: every GPU's answers so far, after each
    GPU) are not decoded again on every job start."""
    for line in reversed(buf.split(b"\n")):
        if key.encode() not in line:
            continue
        try:
            msg = json_loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(msg, dict) and key in msg:
            return msg
    return None


def collect(children: dict[str, tuple[int, int]], deadline: float,
            partial: dict[str, Any] | None = None,
            reports: dict[str, list] | None = None) -> dict[str, dict | None]:
    """Wait for every child's answer until `deadline` (time.monotonic()); None = abandoned.
    `partial`, when given, receives each abandoned streaming child's last report; `reports`,
    when given, every report of each streaming child, in order, answered or abandoned."""
    buffers, done = _read_until(children, deadline)
    if reports is not None:
        reports.update({key: [m["partial"] for m in _messages(bytes(buf)) if "partial" in m]
                        for key, buf in buffers.items()})
    if partial is not None:
        for key in children:
            if done.get(key) is None or DIED in (done.get(key) or {}):
                last = _last_message(bytes(buffers[key]), "partial")
                partial[key] = last["partial"] if last else None
    for key, (pid, _) in children.items():
        if DIED in (done.get(key) or {}):
            done[key] = {DIED: _exit_status(pid)}
        _let_go(pid, kill=done.get(key) is None)
    return done


def _read_until(children: dict[str, tuple[int, int]], deadline: float
                ) -> tuple[dict[str, bytearray], dict[str, dict | None]]:
    """(what each child wrote, its answer: its last "ok" or "error" message, None for one
    that did not close its pipe by the deadline); every pipe is closed after. What a child
    wrote is read even when the deadline has passed before this is called (a child started
    early and asked late, collect.ibports): only a wait past the deadline is not made."""
    buffers = {key: bytearray() for key in children}
    open_fds = {fd: key for key, (_, fd) in children.items()}
    done: dict[str, dict | None] = {}
    flowing = False  # the last look read something
    while open_fds:
        now = time.monotonic()
        left = deadline - now
        wait = max(0.0, left)
        if left <= 0 and flowing and now < deadline + PIPE_GRACE_S:
            # Past the deadline a child may be blocked only on its full pipe (more than the
            # pipe holds written while the parent waited on another probe): reading let it
            # go on, so its next lines are a moment away, not a hang.
            wait = min(0.05, deadline + PIPE_GRACE_S - now)
        ready, _, _ = select.select(list(open_fds), [], [], wait)
        flowing = bool(ready)
        if not ready and left <= 0:
            break
        for fd in ready:
            chunk = os.read(fd, 65536)
            key = open_fds[fd]
            buffers[key] += chunk
            if not chunk:
                del open_fds[fd]
                os.close(fd)
                done[key] = (_last_message(bytes(buffers[key]), "ok")
                             or _last_message(bytes(buffers[key]), "error")
                             or {DIED: True})
    for fd, key in open_fds.items():
        os.close(fd)
        done[key] = None
    return buffers, done


def _exit_status(pid: int) -> str:
    """How a child that closed its pipe without an answer ended (it is exiting: its pipe
    closes as the kernel tears it down; waited for at most 50 ms, then "still exiting")."""
    got, status = 0, 0
    for _ in range(25):
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except OSError:
            return "already reaped"
        if got:
            break
        time.sleep(0.002)
    if got == 0:
        return "still exiting"
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


def _let_go(pid: int, *, kill: bool) -> None:
    """Kill a child abandoned (kill=True; the kill lands when the kernel lets go of it), and
    reap it if it is gone; never wait for a stuck one."""
    try:
        if kill:
            import signal  # only for a child abandoned: its enum costs every job start 0.5 ms

            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:
        pass


def call(fn: Callable[..., Any], timeout_s: float, *, streaming: bool = False,
         mark: str | None = None) -> Any:
    """fn()'s result from a child, or Abandoned after timeout_s; the child's exception comes
    back as OSError (with its errno) or RuntimeError. streaming: fn(emit) may report how far
    it got, and Abandoned carries the last report (what was answered before a hang). mark:
    see start."""
    pid, fd = start(fn, streaming=streaming, mark=mark)
    partial: dict[str, Any] = {}
    answer = collect({"x": (pid, fd)}, time.monotonic() + timeout_s, partial)["x"]
    if answer is None:
        raise Abandoned(f"no answer within {timeout_s:g}s", partial.get("x"), pid)
    if DIED in answer:
        raise Died(f"the child exited without an answer ({answer[DIED]})",
                   partial.get("x"), pid)
    if "error" in answer:
        if answer.get("errno") is not None:
            raise OSError(answer["errno"], answer.get("strerror") or answer["error"])
        raise RuntimeError(answer["error"])
    return answer["ok"]
