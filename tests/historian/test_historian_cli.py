"""`healthctl ingest`, `ticket` and `db status` as an operator runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

FIXTURES = Path(__file__).parent / "fixtures"


def _run(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--db", url, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_ingest_commands_report_counts_and_bad_lines(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    out = json.loads(
        _run(url, "ingest", "sacct", "--file", str(FIXTURES / "sacct_small.txt"), "--json")
    )
    assert (out["read"], out["written"], out["skipped"], out["bad"]) == (9, 8, 1, [])
    out = json.loads(
        _run(url, "ingest", "checks", "--file", str(FIXTURES / "checks.jsonl"), "--json")
    )
    assert [b["line"] for b in out["bad"]] == [4, 5, 6]
    text = _run(url, "ingest", "events", "--file", str(FIXTURES / "sacctmgr_events.txt"))
    assert text.startswith("events: read 3, written 2, 1 dropped (a cluster-wide event")
    assert "attributed" in _run(url, "attribute")
    status = json.loads(_run(url, "db", "status", "--json"))
    assert status["rows"]["jobs"] == 8 and status["rows"]["node_events"] == 2
    assert status["rows"]["attributions"] >= 1


def test_ticket_commands(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    _run(url, "db", "upgrade")  # only db upgrade and the imports create a historian
    assert "ticket 1 opened for gpu007" in _run(url, "ticket", "open", "gpu007", "--reason", "x")
    listed = json.loads(_run(url, "ticket", "list", "--open", "--json"))
    assert [(t["id"], t["node"], t["closed"]) for t in listed] == [(1, "gpu007", None)]
    assert "closed" in _run(url, "ticket", "close", "1")
    again = CliRunner().invoke(cli, ["--db", url, "ticket", "close", "1"])
    assert again.exit_code == 1 and "was closed" in again.output
    assert json.loads(_run(url, "ticket", "list", "--open", "--json")) == []
    _run(url, "ticket", "import", "--file", str(FIXTURES / "tickets.csv"))
    assert len(json.loads(_run(url, "ticket", "list", "--json"))) == 3


def test_an_operator_command_creates_no_historian_only_db_upgrade_and_the_imports_do(
        tmp_path):
    """A ticket opened (or `db status` asked) on a host whose historian file is gone made a
    new, empty one in its place, which every reader then took for a quiet fleet."""
    gone = tmp_path / "h.db"
    url = f"sqlite:///{gone}"
    opened = CliRunner().invoke(cli, ["--db", url, "ticket", "open", "gpu007", "--reason", "x"])
    assert opened.exit_code == 1 and "does not exist" in opened.output, opened.output
    assert "absent" in json.loads(_run(url, "db", "status", "--json"))["state"]
    assert not gone.exists()
    _run(url, "ticket", "import", "--file", str(FIXTURES / "tickets.csv"))
    assert gone.exists()


def test_database_down_is_one_clear_line(tmp_path):
    result = CliRunner().invoke(
        cli, ["--db", "postgresql+psycopg://u:pw@127.0.0.1:1/h", "ticket", "list"]
    )
    assert result.exit_code == 1
    assert "127.0.0.1:1/h is unavailable" in result.output and "pw" not in result.output


def test_a_database_that_is_down_is_a_one_line_error_on_every_write_command(tmp_path):
    down = "postgresql+psycopg://postgres@127.0.0.1:1/rsc_health"  # nothing listens on port 1
    checks = tmp_path / "checks.jsonl"
    checks.write_text('{"time": "2026-11-21T00:00:00Z", "node": "n1", "check": "xid", '
                      '"status": "fail"}\n')
    for args in (["ingest", "checks", "--file", str(checks)], ["ticket", "open", "n1",
                 "--reason", "fan"], ["ticket", "list"], ["attribute"]):
        result = CliRunner().invoke(cli, ["--db", down, *args])
        assert result.exit_code == 1, (args, result.output)
        assert "unavailable" in result.output and "Traceback" not in result.output, args


def test_closing_a_ticket_that_does_not_exist_says_so(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    _run(url, "db", "upgrade")
    result = CliRunner().invoke(cli, ["--db", url, "ticket", "close", "4711"])
    assert result.exit_code == 1
    assert "4711" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [
    ["ingest", "sacct"], ["ingest", "events"], ["ingest", "reservations"],
    ["ingest", "checks"], ["ingest", "exclusions"], ["ticket", "import"],
])
def test_a_fifo_given_as_the_file_is_refused_in_one_line_never_waited_on(tmp_path, command):
    """A FIFO nobody writes to (a stale named pipe, a path typo onto one) blocked open() for
    ever: the timer's next run stacked up behind it. Only regular files (and '-') are read."""
    fifo = tmp_path / "sacct.fifo"
    os.mkfifo(fifo)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "rsc_health.cli", "--db", url, *command, "--file", str(fifo)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])),
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{fifo}: not a regular file" in proc.stderr
    assert "Traceback" not in proc.stderr
