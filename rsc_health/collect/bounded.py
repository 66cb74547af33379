"""Run a probe that can block in the kernel where it can be abandoned: a forked child.

statvfs on a hung NFS/Lustre/FUSE mount and NVML on a wedged driver block in the kernel
(D state). A thread stuck there keeps the whole process from exiting; a child process does
not: the parent stops waiting at the deadline, kills the child (the kill lands whenever the
kernel lets go) and goes on. The child's answer comes back as JSON over a pipe.

Standard library only: the prolog uses this on every job start.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any


class Abandoned(Exception):
    """The probe did not answer within its deadline (or its child died without answering)."""


def start(fn: Callable[[], Any]) -> tuple[int, int]:
    """Fork a child that runs fn() and writes its JSON result; (pid, read fd)."""
    r, w = os.pipe()
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
            try:
                payload = {"ok": fn()}
            except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
                payload = {"error": f"{type(exc).__name__}: {exc}",
                           "errno": getattr(exc, "errno", None),
                           "strerror": getattr(exc, "strerror", None)}
            data = json.dumps(payload, default=str).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(w, view) :]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def collect(children: dict[str, tuple[int, int]], deadline: float) -> dict[str, dict | None]:
    """Wait for every child's answer until `deadline` (time.monotonic()); None = abandoned."""
    buffers = {key: bytearray() for key in children}
    open_fds = {fd: key for key, (_, fd) in children.items()}
    done: dict[str, dict | None] = {}
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            key = open_fds[fd]
            if chunk:
                buffers[key] += chunk
                continue
            del open_fds[fd]
            os.close(fd)
            try:
                done[key] = json.loads(bytes(buffers[key]) or b"null")
            except ValueError:
                done[key] = None
    for fd, key in open_fds.items():
        os.close(fd)
        done[key] = None
    for key, (pid, _) in children.items():
        if done.get(key) is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(pid, os.WNOHANG)  # reap if it is gone; never wait for a stuck one
        except OSError:
            pass
    return done


def call(fn: Callable[[], Any], timeout_s: float) -> Any:
    """fn()'s result from a child, or Abandoned after timeout_s; the child's exception comes
    back as OSError (with its errno) or RuntimeError."""
    pid, fd = start(fn)
    answer = collect({"x": (pid, fd)}, time.monotonic() + timeout_s)["x"]
    if answer is None:
        raise Abandoned(f"no answer within {timeout_s:g}s")
    if "error" in answer:
        if answer.get("errno") is not None:
            raise OSError(answer["errno"], answer.get("strerror") or answer["error"])
        raise RuntimeError(answer["error"])
    return answer["ok"]
