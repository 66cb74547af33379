"""A verdict kept for the next run (slurmctld away, the guard, someone else's drain) is not
carried out for a transient, state-observed cause that run sees healthy again (helper-204's
attack, defect 4): a mount missing while slurmctld was away, back by the next sweep, drained
the node and requeued its job. An event's cause (an XID, a counter's rise) is consumed when
kept and no later look sees it again: it is always carried out."""

from __future__ import annotations

import json

from rsc_health import nodepath
from rsc_health.model import Finding, Severity, Status
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_drain_keeps_every_cause import XID94, drop_checkpoint
from .test_nodepath_faults import node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import node01_slurm


def test_a_transient_verdict_kept_while_slurm_was_away_is_dropped_once_the_mount_is_back(
        node_env, monkeypatch):  # noqa: F811
    """/checkpoint drops while slurmctld is away (a failover): the sweep keeps mount_missing
    pending. The automounter brings it back; slurmctld comes back. The next sweep sees every
    mount healthy: before, it drained the node and requeued job 777 for the mount."""
    root = node_env
    monkeypatch.delenv("SLURM_JOB_ID")
    slurm = node01_slurm()
    good = drop_checkpoint(root)
    slurm.stop()
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    pending = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    assert json.loads(pending.read_text())["causes"][0]["code"] == "mount_missing"

    (root / "proc/mounts").write_text(good)  # the mount is back
    slurm.start()
    slurm.calls.clear()
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0

    assert [c[0] for c in slurm.calls] == [], slurm.calls
    assert not pending.exists()  # forgotten: nothing of it is left to carry out


def test_a_kept_xid_is_still_carried_out_when_the_mount_kept_with_it_is_back(
        node_env, monkeypatch):  # noqa: F811
    """XID 94 and /checkpoint missing while slurmctld is away: both kept. The mount comes
    back: the healed mount is dropped, the XID 94 (its line consumed) is still drained for."""
    root = node_env
    monkeypatch.delenv("SLURM_JOB_ID")
    slurm = node01_slurm()
    good = drop_checkpoint(root)
    (root / "dev/kmsg").open("a").write(XID94)
    slurm.stop()
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    pending = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    assert sorted(c["code"] for c in json.loads(pending.read_text())["causes"]) == [
        "mount_missing", "xid94"]

    (root / "proc/mounts").write_text(good)
    slurm.start()
    slurm.calls.clear()
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    drains = [c for c in slurm.calls if c[0] == "drain"]
    assert len(drains) == 1 and drains[0][2].startswith("rsc_health:job:xid94:"), slurm.calls
    assert ("requeue", "777") not in slurm.calls  # drain after the job: it finishes
    assert not pending.exists()


def _fail(family, component, code, *, repair=False):
    return Finding(family, component, Status.FAIL, Severity.DRAIN_NOW, "x", code, repair)


def _ok(family, component):
    return Finding(family, component, Status.OK, Severity.NONE, "ok")


def test_only_a_transient_state_observed_cause_seen_ok_on_its_component_is_dropped():
    # Imported here: the node-path tests above still run (and fail) on a tree without it.
    from rsc_health.policy import OBSERVED_NOW_CODES, still_standing

    mount = _fail("mount", "/checkpoint", "mount_missing")
    port = _fail("infiniband", "mlx5_0/1", "ib_down")
    # Events and counter rises: a later run's ok on the component says nothing of them.
    xid = _fail("xid", "0000:1b:00", "xid13")
    sbe = _fail("ecc", "gpu3", "ecc_sbe_rising")
    errors = _fail("infiniband", "mlx5_0/1", "ib_symbol_errors", repair=True)
    kept = [mount, port, xid, sbe, errors]
    healthy = [_ok("mount", "/checkpoint"), _ok("infiniband", "mlx5_0/1"),
               _ok("xid", "0000:1b:00"), _ok("ecc", "gpu3")]
    assert still_standing(kept, healthy) == [xid, sbe, errors]
    # Not seen ok (another mount, a checker error, the family not run): still standing.
    assert still_standing(kept, [_ok("mount", "/scratch")]) == kept
    # Listed in [actions] never_resume_codes: a person's to lift, never dropped.
    assert still_standing([mount], healthy, never_resume={"mount_missing"}) == [mount]
    assert {"xid13", "ecc_sbe_rising"}.isdisjoint(OBSERVED_NOW_CODES)
