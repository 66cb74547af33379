"""A drain verdict keeps every drain-level cause, whatever level it is carried out at
(helper-204's attack, defects 1 and 2): the drain record (slurm_drain.json) and the verdict
kept for the next run (pending_verdict.json) name them all, so a never-resumed or repair
cause seen with a worse transient one is never resumed away with it, nor dropped from what
is kept. Its kernel-log line is consumed: nothing else would ever drain the node for it."""

from __future__ import annotations

import json

from rsc_health import nodepath
from rsc_health.actions import DRAIN_STATE_FILE
from rsc_health.model import Finding, Level, Severity, Status
from rsc_health.node.exits import judge_what_is_in
from rsc_health.node.stage import STAGES, Progress
from rsc_health.node.store import load_pending, save_pending
from rsc_health.policy import decide
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import node01_slurm

XID94 = "4,9001,99000001,-;NVRM: Xid (PCI:0000:1b:00): 94, pid=77, name=python3, " \
        "Contained: SM (0x1). RST: Yes, D-RST: No\n"


def drop_checkpoint(root):
    """/checkpoint gone from the mount table; the table as it was, to put back."""
    mounts = root / "proc/mounts"
    text = mounts.read_text()
    mounts.write_text("".join(ln for ln in text.splitlines(keepends=True)
                              if " /checkpoint " not in ln))
    return text


def _mount(level=Severity.DRAIN_NOW):
    return Finding("mount", "/checkpoint", Status.FAIL, level, "/checkpoint not mounted",
                   "mount_missing")


def _xid94():
    return Finding("xid", "0000:1b:00", Status.FAIL, Severity.DRAIN_AFTER_JOB,
                   "XID 94 contained ECC error", "xid94")


def _remap():
    return Finding("remap", "gpu2", Status.FAIL, Severity.DRAIN_AFTER_JOB,
                   "gpu2 row remapping pending", "remap_pending", repair=True)


def test_a_drain_verdict_names_every_drain_level_cause_the_worst_first():
    warn = Finding("telemetry", "node", Status.WARN, Severity.WARN, "hot", "hot")
    verdict = decide([warn, _remap(), _mount()])
    assert verdict.level is Level.DRAIN_NOW
    assert [c.code for c in verdict.causes] == ["mount_missing", "remap_pending"]
    assert verdict.reason.startswith("rsc_health:now:mount_missing:")
    assert verdict.reason.endswith("(+1 more)")
    # The lesser level's repair cause makes the whole drain one only a person lifts.
    assert not verdict.auto_resumable


def test_a_never_resumed_xid94_seen_with_a_transient_mount_fault_is_not_resumed_away(
        node_env, monkeypatch):  # noqa: F811
    """One sweep sees XID 94 (drain after job, in [actions] never_resume_codes) and
    /checkpoint missing (drain now, transient). Before, the drain record kept only the
    worst level's causes (mount_missing, auto-resumable), the XID line was consumed, and
    three clean sweeps once the mount was back resumed a GPU that needs a reset."""
    root = node_env
    monkeypatch.delenv("SLURM_JOB_ID")
    slurm = node01_slurm()
    good = drop_checkpoint(root)
    (root / "dev/kmsg").open("a").write(XID94)
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    assert [c[0] for c in slurm.calls][:1] == ["drain"]
    record = json.loads((root / NODE_STATE / DRAIN_STATE_FILE).read_text())
    assert record["codes"] == ["mount_missing", "xid94"] and not record["auto_resumable"]

    (root / "proc/mounts").write_text(good)
    for _ in range(4):
        nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)

    resumed = [c for c in slurm.calls if c[0] in ("resume", "undrain")]
    assert not resumed, f"a node with an unrepaired XID 94 was resumed: {slurm.calls}"


def test_a_pending_xid94_stays_pending_when_a_worse_transient_fault_joins_it(
        node_env, monkeypatch):  # noqa: F811
    """XID 94 while slurmctld is away: kept pending (its kmsg line consumed). Next sweep,
    slurmctld still away, /checkpoint is missing too: before, the verdict kept was rewritten
    with the drain-now cause alone, and the XID 94 was gone from pending_verdict.json."""
    root = node_env
    monkeypatch.delenv("SLURM_JOB_ID")
    slurm = node01_slurm()
    slurm.stop()
    (root / "dev/kmsg").open("a").write(XID94)
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    pending = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    assert [c["code"] for c in json.loads(pending.read_text())["causes"]] == ["xid94"]

    drop_checkpoint(root)
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    kept = json.loads(pending.read_text())
    assert [c["code"] for c in kept["causes"]] == ["mount_missing", "xid94"], kept
    assert kept["level"] == Level.DRAIN_NOW.exit_code


class _Seen:
    """What engine.InFlight gives the watchdog: the findings judged before the hang."""

    def __init__(self, found):
        self.found = found

    def judged(self):
        return list(self.found), []


def test_the_watchdog_keeps_every_pending_cause_when_a_worse_one_comes_in(tmp_path):
    """A run the watchdog ends merges what came in with the verdict kept: a pending
    drain-after-job repair cause is not dropped for a fresh drain-now transient one."""
    from rsc_health.config import load_config

    save_pending(tmp_path, decide([_remap()]), why="slurm_unavailable")
    run = Progress(STAGES["sweep"], 0.0, None)
    run.cfg, run.sdir, run.step = load_config(), tmp_path, "checks"
    run.inflight = _Seen([_mount()])
    judge_what_is_in(run)
    kept = load_pending(tmp_path)
    assert kept is not None
    assert [c.code for c in kept.verdict.causes] == ["mount_missing", "remap_pending"]
    assert run.verdict is not None and not run.verdict.auto_resumable
