"""BOOT_FAIL is Slurm's own word that a job's host failed (the node did not boot, or came up
unusable, and the job could not be requeued), as NODE_FAIL is. Triage called it a host
failure; attribution, r_f, MTTF and the lemon features did not: a node whose jobs died in its
failed reboots was never attributed, counted or judged. Each now reads the one list
(attribute.HOST_FAIL_STATES), and each is held to it here on the same jobs as NODE_FAIL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import insert, select

from rsc_health.historian import schema
from rsc_health.historian.attribute import HOST_FAIL_STATES, attribute
from rsc_health.historian.lemons.features import lemon_features
from rsc_health.historian.metrics.mttf import mttf_by_size
from rsc_health.historian.metrics.rates import failure_rate, infra_failure_causes
from rsc_health.historian.triage import SLURM_HOST_STATES
from tests.historian.test_attribute import END, _job

H = timedelta(hours=1)


def _down(conn, eid: int, node: str) -> None:
    conn.execute(insert(schema.node_events).values(
        id=eid, node=node, start=END - 30 * timedelta(seconds=1), end=END + 3 * H,
        state="DOWN", reason="Not responding", source="sacctmgr"))


def _rows(engine) -> dict[int, list[tuple]]:
    a = schema.attributions
    with engine.connect() as conn:
        rows = conn.execute(select(a.c.job_pk, a.c.node, a.c.cause, a.c.kind)).all()
    out: dict[int, list[tuple]] = {}
    for pk, node, cause, kind in rows:
        out.setdefault(pk, []).append((node, cause, kind))
    return out


def test_one_list_of_host_failure_states_everywhere():
    assert set(HOST_FAIL_STATES) == {"NODE_FAIL", "BOOT_FAIL"}
    assert SLURM_HOST_STATES == HOST_FAIL_STATES


@pytest.mark.parametrize("state", ["NODE_FAIL", "BOOT_FAIL"])
def test_a_host_failure_goes_to_the_node_down_event_else_unattributed(historian, state):
    with historian.begin() as conn:
        _job(conn, 1, state, ["n1", "n2"])
        _job(conn, 2, state, ["n3"])
        _down(conn, 7, "n2")
    report = attribute(historian)
    assert report.jobs == 2
    assert _rows(historian) == {1: [("n2", "node_down", "event")],
                                2: [(None, "unattributed", "unattributed")]}


@pytest.mark.parametrize("state", ["NODE_FAIL", "BOOT_FAIL"])
def test_a_host_failure_counts_in_r_f_mttf_and_the_causes(historian, state):
    with historian.begin() as conn:
        _job(conn, 1, state, [f"n{i}" for i in range(20)])  # 160 GPUs: a large job
        _job(conn, 2, "COMPLETED", [f"n{i}" for i in range(20, 40)])
        _down(conn, 7, "n3")
    attribute(historian)

    assert failure_rate(historian, large_job_gpus=128).failures == 1
    mttf = mttf_by_size(historian)
    assert int(mttf["failures"].sum()) == 1
    causes = infra_failure_causes(historian)
    assert list(causes["cause"]) == ["node_down"]


@pytest.mark.parametrize("state", ["NODE_FAIL", "BOOT_FAIL"])
def test_a_single_node_host_failure_is_the_nodes_in_the_lemon_features(historian, state):
    with historian.begin() as conn:
        for pk in range(1, 4):
            _job(conn, pk, state, ["n1"], end=END - pk * 24 * H)
        _job(conn, 9, "COMPLETED", ["n2"], end=END - H)
    features = lemon_features(historian, as_of=END + H, window_days=28)
    assert features.loc["n1", "single_node_node_fails"] == 3
    assert features.loc["n1", "single_node_failed_jobs"] == 3
    assert features.loc["n2", "single_node_node_fails"] == 0
