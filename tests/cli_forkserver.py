"""Run `python -m rsc_health.cli ARGS` many times over without paying, each time, for Python's
start and the import of pandas, SQLAlchemy, matplotlib (about 2 CPU-seconds a command: nearly
all of what the README-commands test spent).

A server process starts once with the environment and working directory every command gets,
imports those third-party libraries, and then forks one child per command. The child is what
`python -m rsc_health.cli ARGS` would be in that environment and directory: its own process,
stdin /dev/null, stdout and stderr its own files, rsc_health imported afresh (the server never
imports it), `__main__` run by runpy as `-m` does, an uncaught exception printed as a traceback
with exit status 1, atexit handlers and non-daemon threads seen to as at interpreter exit, and
the exit status the parent gets. Nothing one command does reaches the next: each child is forked
from the same untouched server.

    with CliForkServer(env, cwd) as cli:
        proc = cli.run(["status"], timeout=300)   # a subprocess.CompletedProcess
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Imported once by the server: libraries the historian commands import anyway (none of them
# is rsc_health, so the product's own import-time behaviour is exercised in every child).
PRELOAD = ("click", "sqlalchemy", "numpy", "pandas", "jinja2", "matplotlib", "rich")
_KEEP: list = []


class CliForkServer:
    def __init__(self, env: dict[str, str], cwd: str | os.PathLike, *,
                 module: str = "rsc_health.cli", preload: tuple[str, ...] = PRELOAD) -> None:
        self.module = module
        self._tmp = tempfile.TemporaryDirectory(prefix="cli-fork-")
        self._n = 0
        self.proc = subprocess.Popen([sys.executable, __file__, *preload], env=env, cwd=cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            self.close()
            raise RuntimeError(f"cli fork server did not start: {ready!r}")

    def run(self, argv: list[str], *, timeout: float) -> subprocess.CompletedProcess:
        self._n += 1
        out = Path(self._tmp.name) / f"{self._n}.out"
        err = Path(self._tmp.name) / f"{self._n}.err"
        self.proc.stdin.write(json.dumps({"argv": list(argv), "out": str(out), "err": str(err),
                                          "timeout": timeout, "module": self.module}) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"cli fork server died (exit {self.proc.wait()})")
        answer = json.loads(reply)
        stdout = out.read_text(errors="replace")
        stderr = err.read_text(errors="replace")
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, answer["returncode"], stdout, stderr)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._tmp.cleanup()

    def __enter__(self) -> CliForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reopen(fd: int, mode: str, like: io.TextIOWrapper) -> io.TextIOWrapper:
    raw = io.FileIO(fd, mode, closefd=False)
    buffered: io.RawIOBase | io.BufferedIOBase = raw
    if not isinstance(like.buffer, io.RawIOBase):
        buffered = io.BufferedWriter(raw) if mode == "w" else io.BufferedReader(raw)
    return io.TextIOWrapper(buffered, encoding=like.encoding, errors=like.errors,
                            line_buffering=like.line_buffering, write_through=like.write_through)


def _child(request: dict) -> None:
    """In the forked child: become `python -m MODULE ARGV`; never returns."""
    code = 1
    try:
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        # Fresh standard streams on the new descriptors, made as the interpreter made the
        # server's (the same buffering: PYTHONUNBUFFERED, stderr line-buffered, encodings).
        # The server's stream objects stay referenced: freed, they would close the new fds.
        _KEEP.extend((sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__,
                      sys.__stderr__))
        sys.stdin = _reopen(0, "r", sys.stdin)
        sys.stdout = _reopen(1, "w", sys.stdout)
        sys.stderr = _reopen(2, "w", sys.stderr)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        import atexit
        import runpy
        import threading
        import traceback

        sys.argv = ["-m", *request["argv"]]  # runpy puts the module's path in argv[0]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    except BaseException:  # the child's own setup failed: say so where stderr now is
        import traceback

        os.write(2, traceback.format_exc().encode())
    finally:
        os._exit(code & 0xFF)


def _serve(preload: list[str]) -> None:
    import importlib

    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first, not this file's
    for name in preload:
        importlib.import_module(name)
    control_in, control_out = sys.stdin, sys.stdout
    control_out.write("ready\n")
    control_out.flush()
    for line in control_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        pidfd = os.pidfd_open(pid)  # readable when the child exits (Linux 5.3)
        try:
            exited, _, _ = select.select([pidfd], [], [], float(request["timeout"]))
        finally:
            os.close(pidfd)
        timed_out = not exited
        if timed_out:
            os.kill(pid, signal.SIGKILL)  # as subprocess.run's timeout does
        _, status = os.waitpid(pid, 0)
        control_out.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                                      "timed_out": timed_out}) + "\n")
        control_out.flush()


if __name__ == "__main__":
    _serve(sys.argv[1:])
