"""A suspect whose onset fell out of the detector's window is still judged against its peers.

`detect` reads [failslow] lookback_min (60) minutes. A node slow since before that is already
slow in the window's first slots, where the levelled metrics take each node's level and the
step-time tests look for its start: without the open episode's word, a node an earlier window
found slow (its onset seen) would be excused as a role or a steady offset, its evidence would
stop renewing while it stays slow, and its episode would expire a day later with the node as
slow as ever (core.find_runs, core._levelled, historian.suspects.active, read by load.detect).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import insert

from rsc_health.config import load_config
from rsc_health.historian import schema
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow import SuspectEvidence, detect, detect_frame

from .test_failslow_detect import NODES, T0, _samples
from .test_failslow_detect import _steps as _rank_steps

CFG = load_config(None)


# job 9100 on the eight nodes, running since three hours before the window
MEMBER = pd.DataFrame({"job_id": "9100", "node": NODES, "start": T0 - timedelta(hours=3),
                       "end": T0 + timedelta(hours=3)})


def _nvlink(slow: str | None, share: float, sweeps: int = 12) -> pd.DataFrame:
    """A 12-sweep window of NVLink bytes per second, one node at `share` of its peers from the
    first sweep on (its onset was before the window)."""
    rng = np.random.default_rng(4)
    table = 8e10 * np.exp(rng.normal(0, 0.03, (len(NODES), 1))
                          + rng.normal(0, 0.04, (len(NODES), sweeps)))
    return _samples(NODES, "nvlink_data_rate",
                    lambda i, s: float(table[i, s]) * (share if NODES[i] == slow else 1.0), sweeps)


def test_nvlink_at_half_its_peers_since_before_the_window_renews_only_as_a_suspect():
    samples = _nvlink("gpu005", 0.5)
    # judged against its own level in the window, the node is level with itself: excused
    assert detect_frame(samples, MEMBER, None, CFG) == []
    found = detect_frame(samples, MEMBER, None, CFG, suspects={"gpu005"})
    assert [(e.node, e.metric) for e in found] == [("gpu005", "nvlink_data_rate")]
    assert 0.4 < found[0].value / found[0].peer_median < 0.6


def test_being_a_suspect_is_not_evidence_a_healthy_suspect_is_not_renewed():
    samples = _nvlink("gpu005", 0.5)
    found = detect_frame(samples, MEMBER, None, CFG, suspects={"gpu002", "gpu005", "nowhere"})
    assert [e.node for e in found] == ["gpu005"]
    assert detect_frame(_nvlink(None, 1.0), MEMBER, None, CFG,
                        suspects=set(NODES)) == []


def _steps(slow: str | None, factor: float, windows: int = 24) -> pd.DataFrame:
    """Eight ranks a node, one step line each per 150 s; `slow`'s rank 3 `factor` slower from
    the first step on."""
    noise = np.exp(np.random.default_rng(11).normal(0, 0.02, (len(NODES), 8, windows)))
    return _rank_steps(NODES, [""] * len(NODES),
                       lambda i, r, w: 0.5 * noise[i, r, w]
                       * (factor if NODES[i] == slow and r == 3 else 1.0), windows, job="9100")


def test_a_rank_slow_since_before_the_window_is_a_steady_offset_unless_its_node_is_a_suspect():
    steps = _steps("gpu007", 1.1)
    assert detect_frame(None, MEMBER, steps, CFG) == []
    found = detect_frame(None, MEMBER, steps, CFG, suspects={"gpu007"})
    assert [(e.node, e.source) for e in found] == [("gpu007", "steps")]
    # the same offset with its onset inside the window is found without the episode's word
    late = _steps("gpu007", 1.0).assign(seconds=lambda f: f["seconds"].where(
        ~((f["node"] == "gpu007") & (f["rank"] == 6 * 8 + 3) & (f["step"] >= 8)),
        f["seconds"] * 1.1))
    assert [e.node for e in detect_frame(None, MEMBER, late, CFG)] == ["gpu007"]


def test_the_historians_open_episode_keeps_a_slow_nodes_evidence_renewing(historian):
    start = T0 - timedelta(hours=3)
    with historian.begin() as conn:
        pk = conn.execute(insert(schema.jobs).values(
            job_id="9100", job_id_display="9100", state="RUNNING", submit=start, start=start,
            end=None, nnodes=len(NODES), instance_key=f"9100:{start}:{start}")
            .returning(schema.jobs.c.id)).scalar_one()
        conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in NODES])
        # the historian keeps one row per node and step: its slowest rank's
        rows = _steps("gpu007", 1.1).sort_values("seconds").drop_duplicates(
            ["node", "step"], keep="last")
        conn.execute(insert(schema.step_times), rows.to_dict("records"))
    now = T0 + timedelta(hours=1)
    assert detect(historian, now, CFG) == []
    ev = SuspectEvidence(node="gpu007", metric="step_seconds", value=0.54, peer_median=0.5,
                         deviation=5.0, since=start + timedelta(minutes=40),
                         last=start + timedelta(minutes=55), job_ids=("9100",), source="steps",
                         detail="found when its onset was in the window")
    assert hs.record(historian, [ev], start + timedelta(hours=1),
                     expire_after=timedelta(hours=24)) == {"gpu007": "new"}
    found = detect(historian, now, CFG)
    assert [(e.node, e.source, e.job_ids) for e in found] == [("gpu007", "steps", ("9100",))]
    assert hs.record(historian, found, now, expire_after=timedelta(hours=24)) == {
        "gpu007": "renewed"}
    assert hs.active(historian)[0].last_evidence > ev.last + timedelta(hours=2)
    # once the episode is over (a person cleared it), the node is judged as any other again
    hs.clear(historian, "gpu007", now, who="alice", why="reseated the riser")
    assert detect(historian, now, CFG) == []


def test_a_historian_lost_while_reading_the_open_episodes_is_an_error_never_no_suspects(
        historian, monkeypatch):
    # the window's reads succeed, then the database goes away as the open episodes are read:
    # the detector says it could not see, as for any of its reads, and never "no suspects"
    from sqlalchemy.exc import OperationalError

    from rsc_health.historian.db import HistorianUnavailable
    from rsc_health.historian.failslow import load

    def gone(engine):
        raise OperationalError("SELECT suspects", {}, Exception("server closed the connection"))

    monkeypatch.setattr(load, "active", gone)
    with pytest.raises(HistorianUnavailable, match="server closed the connection"):
        detect(historian, T0 + timedelta(hours=1), CFG)
