"""The mass-drain guard between `healthctl lemons --apply` and node-path drains in the same
window. The lemon run counts the partition once (PartitionGuard.from_slurm) and drains its
grants later without looking again; node-path drains that land in between settle against a
table without the lemon drains (lemon drains are 'fixed': the node path steps back only for
those it sees). Both keep theirs: the partition ends past the guard's limit."""
from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner
from lemon_fleet import AS_OF, Fleet, fleet_slurm
from sqlalchemy import create_engine

from rsc_health.actions import Actor, automatic, guard_limit
from rsc_health.cli import AppContext
from rsc_health.commands.lemons import lemons
from rsc_health.config import load_config
from rsc_health.historian import db
from rsc_health.model import Finding, Severity, Status
from rsc_health.policy import decide

DAY = timedelta(days=1)


@pytest.fixture
def engine(tmp_path):
    eng = create_engine(f"sqlite:///{tmp_path / 'historian.db'}")
    db.create(eng)
    yield eng
    eng.dispose()


def xid79():
    return decide([Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW, "fell off the bus",
                           "xid79", True)])


def test_lemon_and_node_path_drains_in_one_window_stay_within_the_limit(tmp_path, engine):
    fleet = Fleet(engine)
    for node in ("bad1", "bad2"):
        for k in range(6):
            fleet.xid(node, AS_OF - (2 * k + 1) * DAY, "xid79", f"gpu{k}")
    slurm = fleet_slurm({"bad1": ("IDLE", ""), "bad2": ("IDLE", "")}, size=20)
    limit = guard_limit(22, 0.10)
    assert limit == 2
    cfg = load_config("/dev/null")

    def node_path_sweeps():
        # A fabric event: two nodes' sweeps drain while the lemon run is under way.
        for name in ("n10", "n11"):
            a = Actor(slurm, cfg, name, tmp_path / name, log=lambda m: None)
            a.sleep = lambda s: None
            a.apply(xid79())

    slurm.after("node", node_path_sweeps)  # after the lemon run counted the partition
    site = tmp_path / "config.toml"
    site.write_text('[lemon]\nxid_cnt = 3\nstrong = ["xid_cnt"]\n')
    obj = AppContext(config_path=str(site), db_url=str(engine.url))
    obj.slurm = slurm
    res = CliRunner().invoke(lemons, ["--as-of", AS_OF.strftime("%Y-%m-%d"), "--apply"],
                             obj=obj)
    assert res.exit_code == 0, res.output
    out = sorted((n, i.reason[:24]) for n, i in slurm.info.items()
                 if i.drain_set and automatic(i.reason))
    assert len(out) <= limit, f"{len(out)} automatic drains in the window, limit {limit}: {out}"
