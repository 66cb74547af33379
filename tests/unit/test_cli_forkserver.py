"""tests/cli_forkserver.py stands in for `python -m MODULE ARGS` in the README-commands test:
each command it runs must end as that real process does (exit status, stdout, stderr, a
traceback, atexit handlers and threads) and leave nothing behind for the next one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cli_forkserver import PRELOAD, CliForkServer

PROBE = textwrap.dedent("""\
    import atexit, os, sys, threading, time
    what = sys.argv[1]
    print("argv", sys.argv[1:], "main", __name__, "path0", sys.path[0] == os.getcwd())
    print("stdin", repr(sys.stdin.read()), "env", os.environ.get("PROBE_ENV"))
    print("to stderr", file=sys.stderr)
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "message":
        sys.exit("told to stop")
    if what == "raise":
        raise ValueError("boom")
    if what == "atexit":
        atexit.register(lambda: print("atexit ran"))
    if what == "thread":
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread ended"))).start()
    if what == "leak":
        import json
        json.LEAKED = True
        os.environ["PROBE_ENV"] = "changed"
    if what == "leaked":
        import json
        print("leaked", getattr(json, "LEAKED", False))
    if what == "hang":
        time.sleep(600)
    if what == "unflushed":
        sys.stdout.write("no newline")
    if what == "kill":
        os.kill(os.getpid(), 9)
""")

CASES = [["plain"], ["exit", "3"], ["exit", "0"], ["message"], ["raise"], ["atexit"],
         ["thread"], ["unflushed"], ["kill"]]


@pytest.fixture
def probe_dir(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    return tmp_path


def _env(unbuffered: bool = False):
    env = dict(os.environ, PROBE_ENV="set", PYTHONPATH=os.getcwd())
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


def _real(argv, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "probe_mod", *argv], env=env or _env(),
                          cwd=cwd, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("unbuffered", "preload"), [(False, PRELOAD), (True, ())],
                         ids=["buffered-preloaded", "PYTHONUNBUFFERED"])
def test_each_command_ends_as_the_real_python_m_process_does(probe_dir, unbuffered, preload):
    """With the libraries the README test preloads (numpy's threads among them) and without."""
    env = _env(unbuffered)
    with CliForkServer(env, probe_dir, module="probe_mod", preload=preload) as server:
        for argv in CASES:
            real = _real(argv, probe_dir, env)
            forked = server.run(argv, timeout=60)
            assert forked.returncode == real.returncode, (argv, forked, real)
            assert forked.stdout == real.stdout, (argv, forked.stdout, real.stdout)
            # A traceback names the files it went through: the same last lines, both ways.
            tail = real.stderr.strip().splitlines()[-1]
            assert forked.stderr.strip().splitlines()[-1] == tail, (argv, forked.stderr)
            assert ("Traceback" in forked.stderr) == ("Traceback" in real.stderr), argv
    assert "ValueError: boom" in _real(["raise"], probe_dir).stderr
    assert _real(["kill"], probe_dir).returncode == -9


def test_nothing_one_command_does_reaches_the_next(probe_dir):
    with CliForkServer(_env(), probe_dir, module="probe_mod", preload=()) as server:
        assert server.run(["leak"], timeout=60).returncode == 0
        after = server.run(["leaked"], timeout=60)
    assert "leaked False" in after.stdout, after.stdout
    assert "env set" in after.stdout, after.stdout


def test_a_hung_command_is_killed_at_its_timeout_and_the_server_goes_on(probe_dir):
    with CliForkServer(_env(), probe_dir, module="probe_mod", preload=()) as server:
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired) as raised:
            server.run(["hang"], timeout=1)
        assert time.monotonic() - started < 30
        assert "to stderr" in raised.value.stderr  # what it wrote before it was killed
        assert server.run(["exit", "4"], timeout=60).returncode == 4
