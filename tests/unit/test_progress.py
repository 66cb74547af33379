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
from click.testing import CliRunner

from rsc_health.cli import cli

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    out = tmp_path_factory.mktemp("progress") / "demo"
    result = CliRunner().invoke(cli, ["demo", "--out", str(out), "--nodes", "16", "--days",
                                      "10", "--seed", "2", "--json"])
    assert result.exit_code == 0, result.output
    return f"sqlite:///{out / 'historian.db'}"


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
