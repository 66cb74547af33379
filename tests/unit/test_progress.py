"""Slow commands show a spinner naming themselves when the operator watches (stdout and stderr a
terminal), and draw nothing under a pipe or a timer, so `--json | jq` stays clean."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rsc_health.historian.db import connect
from tests.report.test_gather import populate

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    """A small populated historian (the report tests' own: jobs, failures, events): the
    spinner draws from a command's start, so the data's size does not matter here."""
    path = tmp_path_factory.mktemp("progress") / "historian.db"
    engine = connect(f"sqlite:///{path}", create_missing=True)
    populate(engine)
    engine.dispose()
    return f"sqlite:///{path}"


def _in_a_terminal(argv: list[str], env: dict) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=120), ANSI.sub("", out.decode(errors="replace"))


def _env(db: str) -> dict:
    env = dict(os.environ, RSC_HEALTH_DB=db, RSC_HEALTH_CONFIG=os.devnull,
               PYTHONPATH=str(REPO))
    env.pop("RSC_HEALTH_NO_PROGRESS", None)
    return env


def test_a_watched_slow_command_shows_a_spinner_naming_it(demo_db):
    code, text = _in_a_terminal([sys.executable, "-m", "rsc_health.cli", "mttf"], _env(demo_db))
    assert code == 0
    assert "healthctl mttf" in text and "0:00:0" in text  # the label and the elapsed time
    assert "MTTF" in text or "mttf" in text.lower()


def test_a_piped_command_draws_no_spinner(demo_db):
    proc = subprocess.run([sys.executable, "-m", "rsc_health.cli", "mttf", "--json"],
                          env=_env(demo_db), capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0
    assert "healthctl mttf" not in proc.stdout + proc.stderr
    assert proc.stdout.lstrip().startswith(("[", "{"))
