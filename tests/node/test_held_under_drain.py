"""A drain verdict held under a drain that is not ours (a person's, NHC's, "Prolog error"):
kept for as long as that drain stands, without asking slurmctld on every sweep, and carried out
at once by a job start on the node."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import NODE, node01_slurm

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_a_verdict_held_under_a_persons_drain_for_half_a_day_costs_slurmctld_few_reads(
        node_env, monkeypatch):  # noqa: F811 - pytest fixture by name
    root = node_env
    monkeypatch.delenv("SLURM_JOB_ID")
    # A person drained the node for a BIOS update; every read of Slurm's node state counts.
    slurm = node01_slurm()
    slurm.set_state(NODE, "MIXED+DRAIN", "alice: BIOS update", user="alice", when=T0)
    when = [T0]
    monkeypatch.setattr(nodepath, "utcnow", lambda: when[0])
    (root / "dev/kmsg").open("a").write(XID79)
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    pending = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    assert json.loads(pending.read_text())["why"] == "foreign_drain"
    # Half a day of five-minute sweeps while the person's drain stands (each a whole sweep in
    # this process: a day of them was most of a minute of the suite).
    for k in range(1, 12 * 12):
        when[0] = T0 + timedelta(minutes=5 * k)
        assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    assert slurm.calls == [] and pending.exists()  # never drained over, never forgotten
    # Every sweep asking would be 144 reads; the backoff (5 min doubling to 60, jittered)
    # leaves about one an hour after the first few (13, 15 and 15 in three runs).
    assert slurm.reads <= 22, slurm.reads
    held = [json.loads(x) for x in (root / NODE_STATE / "spool/pending.jsonl").read_text()
            .splitlines() if '"action"' in x]
    assert len(held) == slurm.reads and {r["action"] for r in held} == {"held_under_drain"}

    # The person resumes it; a job starts there: the prolog does not wait for the backoff.
    slurm.resume(NODE)
    slurm.calls.clear()
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    assert nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm) == 1
    # job 777 is another job on the node: a prolog's drain now requeues it
    assert [c[0] for c in slurm.calls] == ["drain", "requeue"] and "xid79" in slurm.calls[0][2]
    assert not pending.exists()
