"""The InfiniBand ports are read once a run for every family that asks (rsc_health.collect.ibports):
the infiniband and telemetry families share each counter, rate and link-layer read of a sweep,
and the reader stops at the stage's deadline and at MAX_PORTS instead of walking on."""

from __future__ import annotations

import time
from collections import Counter

from rsc_health import engine
from rsc_health.checks.env import CollectEnv
from rsc_health.checks.state import NodeState
from rsc_health.collect import ibports, sysfs
from rsc_health.model import Metric, Status


def _counting(monkeypatch) -> Counter:
    seen: Counter = Counter()
    real = sysfs.read_text

    def read_text(path):
        if "infiniband" in str(path):
            seen[str(path)] += 1
        return real(path)

    monkeypatch.setattr(ibports, "read_text", read_text)
    return seen


def test_a_sweep_reads_each_port_file_once_for_both_families(node, monkeypatch):
    seen = _counting(monkeypatch)
    findings = engine.run(node.config, node.root, only={"infiniband", "telemetry"})
    assert seen and max(seen.values()) == 1, [p for p, n in seen.items() if n > 1]
    shared = [p for p in seen if p.endswith("/counters/symbol_error")]
    assert len(shared) == 8  # the healthy fixture's 8 HCA ports, read once each
    assert any(f.family == "infiniband" and f.status == Status.OK for f in findings)
    sample = next(f for f in findings if f.family == "telemetry" and f.component == "node")
    # the first run has no rate yet, but both families saw the same ports
    assert {p["port"] for p in sample.data["ports"]} == {
        f.component for f in findings if f.family == "infiniband"}


def test_the_shared_read_gives_both_families_their_rates_on_the_next_sweep(node):
    engine.run(node.config, node.root, only={"infiniband", "telemetry"})
    import json
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))
    node.write("sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error", "40\n")
    findings = engine.run(node.config, node.root, only={"infiniband", "telemetry"},
                          save_state=False)
    sample = next(f for f in findings if f.family == "telemetry" and f.component == "node")
    assert sample.data["metrics"][Metric.IB_ERROR_RATE]["component"] == "mlx5_2/1"
    assert any(f.family == "infiniband" and f.code == "ib_symbol_errors" for f in findings)


def test_past_the_deadline_nothing_more_is_read_and_it_is_said(node):
    state = NodeState()
    env = CollectEnv(node.config, deadline=time.monotonic() - 1.0, state=state)
    from rsc_health.checks import infiniband, telemetry
    ports = infiniband.collect(node.root, env)
    read = telemetry.collect(node.root, env)
    assert ports and all(p.state is None and not p.counters for p in ports)
    assert all(not p["counters"] for p in read["ports"])
    assert [e[2] for e in state.errors if e[1] == ibports.SOURCE][0].startswith(
        "stage deadline passed")


def test_a_tree_of_thousands_of_ports_is_not_walked_to_its_end(tmp_path):
    for i in range(ibports.MAX_PORTS + 30):
        (tmp_path / f"sys/class/infiniband/mlx5_{i:04d}/ports/1/counters").mkdir(parents=True)
    state = NodeState()
    env = CollectEnv({}, state=state)
    read = ibports.reader(tmp_path, env)
    assert len(read.ports()) == ibports.MAX_PORTS
    assert ibports.reader(tmp_path, env) is read  # the run's one reader
    ibports.said(read, env, "infiniband")
    assert any("30 not read" in e[2] for e in state.errors)
