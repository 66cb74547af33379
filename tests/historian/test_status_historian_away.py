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


def _historian_with_a_retired_rack(tmp_path) -> str:
    from datetime import datetime, timedelta

    from sqlalchemy import create_engine

    from rsc_health.historian import db, schema

    url = f"sqlite:///{tmp_path / 'h.db'}"
    eng = create_engine(url)
    db.create(eng)
    now = datetime.utcnow()
    with eng.begin() as conn:
        conn.execute(schema.node_runs.insert(), [
            {"node": "node02", "source": "sweep", "level": "ok",
             "last_seen": now - timedelta(minutes=3)},
            {"node": "oldrack01", "source": "sweep", "level": "ok",
             "last_seen": now - timedelta(days=200)}])
    eng.dispose()
    return url


def test_status_does_not_fail_forever_on_a_node_slurm_no_longer_has(tmp_path, monkeypatch):
    """A rack retired months ago keeps its node_runs row for ever: status listed it under
    'not checking' and exited 1 every day, though Slurm, read in the same run, no longer has
    it (helper 203). It is left out and counted."""
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    url = _historian_with_a_retired_rack(tmp_path)
    doc = _status(tmp_path, url, "--json")  # Slurm knows node02 alone
    data = json.loads(doc.stdout)
    assert data["not_checking"] == [], data["not_checking"]
    assert data["not_in_slurm"] == ["oldrack01"]
    assert doc.exit_code == 0, doc.output
    text = _status(tmp_path, url)
    assert "1 node(s) the historian has heard from that Slurm no longer has" in text.output
    assert "oldrack01" in text.output and "not checking:" not in text.output


def test_status_keeps_a_stale_node_slurm_still_has(tmp_path, monkeypatch):
    from datetime import datetime, timedelta

    from sqlalchemy import create_engine, update

    from rsc_health.historian import schema

    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    url = _historian_with_a_retired_rack(tmp_path)
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(update(schema.node_runs).where(schema.node_runs.c.node == "node02")
                     .values(last_seen=datetime.utcnow() - timedelta(days=1)))
    eng.dispose()
    doc = _status(tmp_path, url, "--json")
    data = json.loads(doc.stdout)
    assert [n["node"] for n in data["not_checking"]] == ["node02"]
    assert doc.exit_code == 1
