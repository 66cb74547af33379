"""The wall clock stepping backwards or forwards between runs (NTP stepping a node whose RTC
was off, a VM restored from a snapshot): the node path keys nothing it judges on wall time
(counter baselines: the boot id; the kmsg cursor: the sequence number; durations:
time.monotonic), so a step neither drains, nor loses or doubles a fault, nor crashes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import node01_slurm, slurm_away

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _at(monkeypatch, when: datetime) -> None:
    monkeypatch.setattr(nodepath, "utcnow", lambda: when)
    monkeypatch.setattr(nodepath.time, "time", lambda: when.timestamp())


def test_clock_steps_between_runs_neither_drain_nor_lose_nor_double_a_fault(
        node_env, monkeypatch):  # noqa: F811 - pytest fixture by name
    root = node_env
    healthy = node01_slurm()
    _at(monkeypatch, T0)
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: healthy) == 0

    # A day back: nothing new, nothing drains.
    _at(monkeypatch, T0 - timedelta(days=1))
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: healthy) == 0
    assert healthy.calls == []

    # Still a day back: an XID 79 while slurmctld is away; the verdict is kept.
    (root / "dev/kmsg").open("a").write(XID79)
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm_away()) == 0
    assert (root / NODE_STATE / nodepath.PENDING_VERDICT_FILE).exists()

    # A year forward: the kept verdict is carried out by the next prolog, once.
    _at(monkeypatch, T0 + timedelta(days=365))
    slurm = node01_slurm()
    assert nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm) == 1
    # job 777 is another job on the node: a prolog's drain now requeues it
    assert [c[0] for c in slurm.calls] == ["drain", "requeue"] and "xid79" in slurm.calls[0][2]
    assert not (root / NODE_STATE / nodepath.PENDING_VERDICT_FILE).exists()

    # Back to T0 again: the XID is not news a second time.
    _at(monkeypatch, T0)
    again = slurm  # Slurm as the prolog left it
    again.calls.clear()
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: again)
    assert [c for c in again.calls if c[0] == "drain"] == []

    lines = (root / NODE_STATE / "spool" / "pending.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    xids = {r["id"] for r in records if r.get("code") == "xid79"}
    assert len(xids) == 1
    beats = [r for r in records if r["kind"] == "heartbeat"]
    assert len(beats) == 5 and all(b["duration_s"] >= 0 for b in beats)
