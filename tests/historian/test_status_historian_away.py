"""`healthctl status` with a historian configured that cannot be read (down, a wrong
password, a firewall): it cannot tell which nodes stopped checking, which verdicts are held
or which probes hang, so it must not exit 0 as if none did, nor say there is no historian.
Before: "node freshness: no historian configured", exit 0, the daily check green while blind."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from click.testing import CliRunner

from rsc_health.cli import cli
from tests.unit.test_terminal_escapes import NODE_LINE, _stand_in_slurm

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


# helper-213: a Slurm that hides a partition from an unprivileged user.
HIDDEN_LINE = NODE_LINE.replace("NodeName=node02", "NodeName=hidden01").replace(
    "State=IDLE+DRAIN", "State=IDLE").replace("Partitions=gpu", "Partitions=admin").split(
    " Reason=")[0]


def _slurm_hiding_a_partition(tmp_path):
    """scontrol as slurmctld answers an unprivileged user: without -a (SHOW_ALL) a node
    whose partitions are all Hidden=YES (or AllowGroups the user is not in) is left out of
    `scontrol show node`; with -a it is listed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "visible.txt").write_text(NODE_LINE + "\n")
    (tmp_path / "all.txt").write_text(NODE_LINE + "\n" + HIDDEN_LINE + "\n")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        "for a in \"$@\"; do\n"
        f"  case \"$a\" in -a|--all) cat {tmp_path / 'all.txt'}; exit 0;; esac\n"
        "done\n"
        "for a in \"$@\"; do\n"
        f"  case \"$a\" in hidden01) grep NodeName=hidden01 {tmp_path / 'all.txt'}; exit 0;; esac\n"
        "done\n"
        f"cat {tmp_path / 'visible.txt'}\n")
    scontrol.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\n')
    return config


def _hidden_historian(tmp_path, rows, inventory=()):
    from sqlalchemy import create_engine

    from rsc_health.historian import db, schema

    url = f"sqlite:///{tmp_path / 'h.db'}"
    eng = create_engine(url)
    db.create(eng)
    with eng.begin() as conn:
        if rows:
            conn.execute(schema.node_runs.insert(), rows)
        if inventory:
            conn.execute(schema.node_inventory.insert(), list(inventory))
    eng.dispose()
    return url


def test_status_does_not_call_a_node_in_a_hidden_partition_retired(tmp_path, monkeypatch):
    """helper-213: status leaves out a stale node Slurm no longer lists (54def05). Without -a
    that listing is partial for a user who is not SlurmUser/root/operator: nodes whose
    partitions are all hidden are left out. hidden01's checks stopped an hour ago: it is
    not checking, not 'retired or renamed', and status exits 1."""
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    now = datetime.utcnow()
    url = _hidden_historian(tmp_path, [
        {"node": "node02", "source": "sweep", "level": "ok",
         "last_seen": now - timedelta(minutes=3)},
        {"node": "hidden01", "source": "sweep", "level": "ok",
         "last_seen": now - timedelta(hours=1)}])
    config = _slurm_hiding_a_partition(tmp_path)
    out = CliRunner().invoke(cli, ["--config", str(config), "--db", url, "status", "--json"])
    data = json.loads(out.stdout)
    assert [n["node"] for n in data["not_checking"]] == ["hidden01"], data
    assert out.exit_code == 1
