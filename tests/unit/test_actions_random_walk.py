"""The action layer on random histories (hypothesis draws them): one node's sweeps, prologs
and epilogs judge it faulty or clean while a person drains and resumes it, Slurm marks it
DOWN and back, and jobs come and go, against the in-memory Slurm. Whatever the order:

- a drain or DOWN a person or Slurm set is never overwritten, resumed or cleared by us;
- a drain verdict leaves the node drained (by us, or still by the person), never in service;
- a repair drain (never_resume_codes: XID 79) is never lifted by us, however many clean sweeps;
- we resume only our own drain, and only after resume_after_clean_sweeps clean sweeps in a row;
- a repair drain that `scontrol reboot nextstate=RESUME` lifted between two runs is drained
  again by the next run, a sweep or a job start's (once the node is back, if Slurm marked it
  DOWN meanwhile; a person who drains it meanwhile owns it).
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rsc_health.actions import Actor
from rsc_health.config import load_config
from rsc_health.model import Finding, Severity, Status
from rsc_health.policy import decide, is_ours
from rsc_health.slurm.memory import MemorySlurm

CFG = load_config("/dev/null")
NODE = "n01"
STEPS = ["xid79", "mount", "after_job", "clean", "clean", "clean", "warn", "person_drain",
         "person_resume", "down", "up", "job_start", "job_end", "reboot_lift", "job_prolog"]


def _verdict(step: str):
    if step == "xid79":
        return decide([Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW, "fell off",
                               "xid79", True)])
    if step == "mount":
        return decide([Finding("mount", "/home", Status.FAIL, Severity.DRAIN_NOW, "missing",
                               "mount_missing", False)])
    if step == "after_job":
        return decide([Finding("pcie", "gpu1", Status.FAIL, Severity.DRAIN_AFTER_JOB, "x8",
                               "pcie_width", False)])
    if step == "warn":
        return decide([Finding("gpu", "gpu2", Status.WARN, Severity.WARN, "hot", "gpu_temp")])
    return decide([Finding("gpu", "gpu0", Status.OK, Severity.NONE, "fine")])


def _actor(slurm: MemorySlurm, state: Path, clock: list[datetime]) -> Actor:
    """NODE's action layer on `slurm`, its state under `state`, its time clock[0]."""
    actor = Actor(slurm, CFG, NODE, state / NODE, now=lambda: clock[0], log=lambda m: None)
    actor.sleep = lambda s: None  # the guard's settle wait
    return actor


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(STEPS), min_size=1, max_size=40))
def test_random_histories_keep_the_action_layers_promises(steps):
    clock = [datetime(2026, 11, 22, 12, 0, tzinfo=UTC)]
    slurm = MemorySlurm([f"n{i:02d}" for i in range(10)], now=lambda: clock[0])
    with tempfile.TemporaryDirectory() as state:
        actor = _actor(slurm, Path(state), clock)
        never = set(CFG.get("actions.never_resume_codes"))
        need = int(CFG.get("actions.resume_after_clean_sweeps"))
        clean_run = 0
        jobs: list[str] = []
        slurm.boot(NODE, clock[0] - timedelta(days=1))
        owed = False  # a repair drain of ours lifted by a reboot, not drained again yet
        for step in steps:
            clock[0] += timedelta(minutes=5)
            before = slurm.info[NODE]
            if step == "reboot_lift":  # rebooted with nextstate=RESUME: Slurm lifts the drain
                code = before.reason.split(":")[2] if is_ours(before.reason) else ""
                owed = owed or (before.drain_set and code in never and not before.down)
                slurm.set_state(NODE, "IDLE", "")
                slurm.boot(NODE, clock[0])
                jobs.clear()
                continue
            if step == "person_drain":
                owed = False  # the node is the person's now: their resume is their decision
                slurm.set_state(NODE, before.state.split("+")[0] + "+DRAIN",
                                "ops: bad fan, ticket 42", user="ops", when=clock[0])
                continue
            if step == "person_resume":
                if before.drain_set:
                    slurm.set_state(NODE, before.state.split("+")[0], "", user="ops")
                continue
            if step == "down":
                slurm.set_state(NODE, "DOWN*" + "".join(
                    "+" + f for f in before.state.split("+")[1:]),
                    before.reason or "Not responding", user=before.reason_user or "slurm")
                continue
            if step == "up":
                if before.down:
                    flags = [f for f in before.state.split("+")[1:]]
                    slurm.set_state(NODE, "+".join(["IDLE", *flags]),
                                    before.reason if "DRAIN" in flags else "")
                continue
            if step == "job_start":
                jobs.append(slurm.start_job(NODE, whole_node=False))
                continue
            if step == "job_end":
                if jobs:
                    slurm.end_job(jobs.pop(0))
                continue
            verdict = _verdict(step)
            clean = step in ("clean", "warn")
            actor.apply(verdict, clean_sweep=clean)  # job_prolog: an OK run at a job start
            after = slurm.info[NODE]
            if owed and not before.down:  # DOWN: carried out once it is back
                assert after.drain_set and is_ours(after.reason), (step, before, after)
                owed = False
            theirs = (before.drain_set and not is_ours(before.reason)) or before.down
            if before.drain_set and not is_ours(before.reason):
                assert after.drain_set and after.reason == before.reason, (step, before, after)
            if before.down:
                assert after.down or after.drain_set, (step, before, after)
            if verdict.drains:
                assert after.drain_set or after.down, (step, before, after)
                clean_run = 0
            elif clean and not theirs:
                clean_run += 1
            if before.drain_set and is_ours(before.reason) and not after.drain_set:
                code = before.reason.split(":")[2]
                assert code not in never, (step, before, after)
                assert clean and clean_run >= need, (step, clean_run, before, after)


def _walk(steps: list[str]) -> MemorySlurm:
    clock = [datetime(2026, 11, 22, 12, 0, tzinfo=UTC)]
    slurm = MemorySlurm([f"n{i:02d}" for i in range(10)], now=lambda: clock[0])
    with tempfile.TemporaryDirectory() as state:
        actor = _actor(slurm, Path(state), clock)
        for step in steps:
            clock[0] += timedelta(minutes=5)
            if step == "person_drain":
                slurm.set_state(NODE, "IDLE+DRAIN", "ops: bad fan", user="ops", when=clock[0])
            else:
                actor.apply(_verdict(step), clean_sweep=step in ("clean", "warn"))
    return slurm


def test_the_walks_promises_are_reachable_both_ways():
    # the property above is not vacuous: our drain is lifted after the clean sweeps, a repair
    # drain is not, and a person's drain outlives our verdicts and clean sweeps
    assert not _walk(["mount", "clean", "clean", "clean"]).info[NODE].drain_set
    assert _walk(["mount", "clean", "clean"]).info[NODE].drain_set
    assert _walk(["xid79"] + ["clean"] * 6).info[NODE].reason.startswith("rsc_health:now:xid79")
    person = _walk(["person_drain", "mount", "xid79"] + ["clean"] * 4).info[NODE]
    assert person.drain_set and person.reason == "ops: bad fan"
