"""Fleet telemetry and suspects in the historian's Prometheus metrics, read back with
prometheus_client's own text parser: fleet aggregates labelled by metric and stat (as many
series at 400 nodes as at 20), per-node series only for suspects, garbled values and hostile
names exported whole."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import create_engine

from rsc_health.config import load_config
from rsc_health.exporter.historian import build, exposition
from rsc_health.historian import db, schema
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow.evidence import SuspectEvidence
from rsc_health.model import Metric

from .test_exporter_trust import HOSTILE, export, samples

CFG = load_config(None)
NOW = datetime.utcnow().replace(microsecond=0)


def _historian(tmp_path, name="h.db"):
    url = f"sqlite:///{tmp_path / name}"
    eng = create_engine(url)
    db.create(eng)
    return url, eng


def _samples(eng, nodes, *, hot=(), when=NOW - timedelta(minutes=2), extra=None):
    """One sweep of every node a few minutes ago (and an older one, superseded), a node of
    `hot` with a GPU at 90 C and its clock at half; `extra`: {metric: value} for every node."""
    rows = []
    for age, t in ((1, when - timedelta(minutes=5)), (0, when)):
        for i, node in enumerate(nodes):
            row = {"time": t, "node": node, "sm_clock_ratio": 0.95 + 0.0001 * (i % 10),
                   "sm_clock_ratio_c": "gpu0", "gpu_temp_c": 60.0 + i % 7,
                   "gpu_temp_c_c": "gpu1", "pcie_link_ratio": 1.0, "pcie_link_ratio_c": "gpu0"}
            if node in hot and age == 0:
                row.update(gpu_temp_c=90.0, sm_clock_ratio=0.5)
            row.update(extra or {})
            rows.append(row)
    names = [c.name for c in schema.telemetry_samples.columns]
    with eng.begin() as conn:
        conn.execute(schema.telemetry_samples.insert(),
                     [{k: r.get(k) for k in names} for r in rows])


def _export(eng) -> dict[str, list]:
    return samples(exposition(build(eng, CFG, NOW)).decode())


def _series(got: dict[str, list], prefix: str) -> int:
    return sum(len(v) for k, v in got.items() if k.startswith(prefix))


def test_fleet_telemetry_is_aggregates_whose_series_do_not_grow_with_the_fleet(tmp_path):
    url_small, small = _historian(tmp_path, "small.db")
    url_big, big = _historian(tmp_path, "big.db")
    _samples(small, [f"n{i:03d}" for i in range(20)], hot={"n007"})
    _samples(big, [f"n{i:04d}" for i in range(400)], hot={"n0007", "n0123", "n0399"})
    a, b = _export(small), _export(big)
    for prefix in ("rsc_health_telemetry_", "rsc_health_node_suspect", "rsc_health_suspect"):
        assert _series(a, prefix) == _series(b, prefix), prefix
    # Not one telemetry series carries a node label.
    assert not [s for k, v in b.items() if k.startswith("rsc_health_telemetry_") for s in v
                if "node" in s.labels]
    nodes = {s.labels["metric"]: s.value for s in b["rsc_health_telemetry_nodes"]}
    assert nodes["gpu_temp_c"] == 400 and nodes["sm_clock_ratio"] == 400
    assert nodes["throttle_hw_frac"] == 0  # no node sent it
    past = {s.labels["metric"]: s.value for s in b["rsc_health_telemetry_nodes_past_warn"]}
    # Each node's newest sample only: the three hot ones at 90 C (the line is 85) and at half
    # clock (under 0.6); their older, healthy sample does not count.
    assert past["gpu_temp_c"] == 3 and past["sm_clock_ratio"] == 3
    assert past["pcie_link_ratio"] == 0  # 1.0 is at its line, not under it
    spread = {(s.labels["metric"], s.labels["stat"]): s.value
              for s in b["rsc_health_telemetry_fleet"]}
    assert spread[("gpu_temp_c", "max")] == 90.0
    assert spread[("sm_clock_ratio", "min")] == 0.5
    assert 60.0 <= spread[("gpu_temp_c", "p50")] <= 66.0
    assert ("throttle_hw_frac", "p50") not in spread  # nothing to spread
    small.dispose()
    big.dispose()


def test_samples_older_than_two_sweep_slots_are_not_the_fleets_now(tmp_path):
    _url, eng = _historian(tmp_path)
    _samples(eng, ["a1", "a2"], when=NOW - timedelta(minutes=30))
    got = _export(eng)
    assert {s.labels["metric"]: s.value for s in got["rsc_health_telemetry_nodes"]} == {
        m.value: 0 for m in Metric}
    assert "rsc_health_telemetry_fleet" not in got
    eng.dispose()


def test_suspects_by_metric_and_episodes_ended_today_are_counted(tmp_path):
    _url, eng = _historian(tmp_path)

    def ev(node, metric, source):
        return SuspectEvidence(node=node, metric=metric, value=0.6, peer_median=0.99,
                               deviation=9.0, since=NOW - timedelta(hours=2),
                               last=NOW - timedelta(hours=1), job_ids=("1",), source=source,
                               detail="")

    t0 = NOW - timedelta(hours=1)
    hs.record(eng, [ev("a", "sm_clock_ratio", "telemetry"), ev("b", "sm_clock_ratio",
                                                               "telemetry"),
                    ev("c", "step_seconds", "steps"), ev("d", "ib_xmit_wait_rate", "telemetry")],
              t0, expire_after=timedelta(hours=24))
    hs.clear(eng, "d", t0 + timedelta(minutes=5), who="alice", why="cable reseated")
    got = _export(eng)
    by = {(s.labels["metric"], s.labels["source"]): s.value
          for s in got["rsc_health_suspect_nodes_by_metric"]}
    assert by == {("sm_clock_ratio", "telemetry"): 2, ("step_seconds", "steps"): 1}
    ended = {s.labels["state"]: s.value for s in got["rsc_health_suspect_episodes_ended_24h"]}
    assert ended == {"confirmed": 0, "cleared": 1, "expired": 0}
    [total] = got["rsc_health_suspect_nodes"]
    assert total.value == 3
    eng.dispose()


@pytest.mark.parametrize("value", [-5.0, 9.9e29, 1e-300, 0.0])
def test_garbled_finite_values_export_as_numbers_the_parser_reads(tmp_path, value):
    _url, eng = _historian(tmp_path)
    _samples(eng, ["a1", "a2", "a3"], extra={"ib_xmit_wait_rate": value,
                                             "ib_xmit_wait_rate_c": 'p"o\nrt'})
    got = _export(eng)
    spread = {(s.labels["metric"], s.labels["stat"]): s.value
              for s in got["rsc_health_telemetry_fleet"]}
    assert spread[("ib_xmit_wait_rate", "max")] == pytest.approx(value)
    eng.dispose()


def test_hostile_suspect_names_and_fleet_telemetry_through_the_export_command(tmp_path):
    """The command end to end (a subprocess writing the textfile): hostile node names among
    the samples and the suspects come back whole where a node label belongs, nowhere else."""
    url, eng = _historian(tmp_path)
    _samples(eng, HOSTILE, hot={HOSTILE[0]})
    now = datetime.utcnow()
    hs.record(eng, [SuspectEvidence(node=HOSTILE[0], metric="sm_clock_ratio", value=0.5,
                                    peer_median=0.95, deviation=12.0, since=now, last=now,
                                    job_ids=("7",), source="telemetry", detail="")], now,
              expire_after=timedelta(hours=24))
    eng.dispose()
    out = tmp_path / "fleet.prom"
    proc = export(url, out)
    assert proc.returncode == 0, proc.stderr
    got = samples(out.read_text())
    assert [s.labels["node"] for s in got["rsc_health_node_suspect"]] == [HOSTILE[0]]
    nodes = {s.labels["metric"]: s.value for s in got["rsc_health_telemetry_nodes"]}
    assert nodes["gpu_temp_c"] == len(HOSTILE)
    past = {s.labels["metric"]: s.value for s in got["rsc_health_telemetry_nodes_past_warn"]}
    assert past["gpu_temp_c"] == 1
