"""`healthctl status` with a historian configured that cannot be read (down, a wrong
password, a firewall): it cannot tell which nodes stopped checking, which verdicts are held
or which probes hang, so it must not exit 0 as if none did, nor say there is no historian.
Before: "node freshness: no historian configured", exit 0, the daily check green while blind."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsc_health.cli import cli
from tests.unit.test_terminal_escapes import _stand_in_slurm

DOWN = "postgresql+psycopg://rsc:pw@127.0.0.1:1/history"


def _status(tmp_path, url: str, *args: str):
    """`healthctl status` against a stand-in scontrol printing a real node record."""
    where = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    where.mkdir()
    config = _stand_in_slurm(where)
    return CliRunner().invoke(cli, ["--config", str(config), "--db", url, "status", *args])


def test_status_with_its_historian_unreachable_says_so_and_exits_1(tmp_path):
    out = _status(tmp_path, DOWN)
    assert out.exit_code == 1, out.output
    assert "no historian configured" not in out.output
    assert "historian unreachable" in out.output
    doc = _status(tmp_path, DOWN, "--json")
    assert doc.exit_code == 1
    data = json.loads(doc.stdout)
    assert data["not_checking"] is None and "127.0.0.1" in data["historian_error"]


def test_status_with_a_healthy_historian_and_fleet_exits_0(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    from rsc_health.historian.db import connect

    connect(url, upgrade=True, create_missing=True).dispose()
    out = _status(tmp_path, url, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["historian_error"] is None


def test_status_with_its_sqlite_historian_file_gone_does_not_vouch_for_the_fleet(tmp_path):
    """`healthctl status` exits 1 and says "historian unreachable" when the historian's
    directory is missing, but with the directory there and the file gone it created an empty
    historian and exited 0: no node "not checking", no verdict held, all well."""
    gone = tmp_path / "historian.db"
    out = _status(tmp_path, f"sqlite:///{gone}")
    assert out.exit_code == 1, out.output
    assert "historian unreachable" in out.output and "does not exist" in out.output
    assert not gone.exists()
