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


def _counting(monkeypatch, tmp_path) -> Counter:
    """Every IB file read, counted: the reads happen in the reader's child, so each is logged
    to a file (appends from the child land there) and counted when asked."""
    log = tmp_path / "ib-reads.log"
    real = sysfs.read_text

    def read_text(path):
        if "infiniband" in str(path):
            with open(log, "a") as fh:
                fh.write(f"{path}\n")
        return real(path)

    monkeypatch.setattr(ibports, "read_text", read_text)

    class Seen(Counter):
        def refresh(self) -> Seen:
            self.clear()
            self.update(log.read_text().splitlines() if log.exists() else [])
            return self

    return Seen()


def test_a_sweep_reads_each_port_file_once_for_both_families(node, monkeypatch, tmp_path):
    seen = _counting(monkeypatch, tmp_path)
    findings = engine.run(node.config, node.root, only={"infiniband", "telemetry"})
    seen.refresh()
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
    """Nothing is read (no child forked) once the stage's deadline has passed; the ports not
    listed are not judged (no "HCA missing" for a read never made), said once."""
    state = NodeState()
    env = CollectEnv(node.config, deadline=time.monotonic() - 1.0, state=state)
    from rsc_health.checks import infiniband, telemetry
    assert infiniband.collect(node.root, env) is None
    read = telemetry.collect(node.root, env)
    assert read["ports"] == []
    said = [e[2] for e in state.errors if e[1] == ibports.SOURCE]
    assert len(said) == 1 and said[0].startswith("stage deadline passed")
    assert not state.hung_probes


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


def test_an_hca_past_the_port_cap_is_not_judged_missing(tmp_path):
    """Before, a wanted HCA whose ports fell past MAX_PORTS (SR-IOV virtual functions sort
    among the physical ones) was `HCA not present`: a drain for what the checker did not
    read. Now it is not judged; the cap is said as a collector error."""
    from rsc_health.checks import infiniband

    for i in range(ibports.MAX_PORTS + 6):
        port = tmp_path / f"sys/class/infiniband/mlx5_{i:04d}/ports/1"
        port.mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
    last = f"mlx5_{ibports.MAX_PORTS + 5:04d}"
    state = NodeState()
    env = CollectEnv({}, state=state)
    state.extra["infiniband"] = infiniband.collect(tmp_path, env)
    found = infiniband.check(state, {"infiniband": {"hcas": ["mlx5_0000", last]}})
    assert "ib_missing" not in {f.code for f in found}
    assert any("not read" in e[2] for e in state.errors)


def test_a_read_never_made_keeps_the_hang_on_record(node):
    """Past the stage's deadline the ports are not read: the run did not ask the ib probe, so a
    hang on record (and its count of sweeps) stays as it was, not cleared as if it answered."""
    from datetime import datetime

    from rsc_health.checks import infiniband
    from rsc_health.collect import hangs

    state = NodeState()
    record = {"since": "2026-11-27T01:00:00+00:00", "sweeps": 2}
    env = CollectEnv(node.config, deadline=time.monotonic() - 1.0, state=state,
                     hangs_before={hangs.IB: record})
    assert infiniband.collect(node.root, env) is None
    assert hangs.IB not in state.probes_asked
    kept = hangs.update({"boot_id": None, "probes": {hangs.IB: record}}, "b",
                        set(state.probes_asked), {}, datetime.now(),
                        sweep=True)
    assert kept[hangs.IB]["sweeps"] == 2


def test_a_reader_child_that_is_killed_is_a_checker_error_not_a_hang(tmp_path, monkeypatch):
    """The IB reader's child dies without an answer (the OOM killer, a crash). It was read as
    a hang: recorded toward [infiniband] hang_sweeps, whose drain is for a wedged HCA. Now it is
    the run's checker error; no hang is recorded, no port judged missing."""
    import os
    import signal

    (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters").mkdir(parents=True)
    monkeypatch.setattr(ibports, "_asker",
                        lambda root, names: lambda emit: os.kill(os.getpid(), signal.SIGKILL))
    state = NodeState()
    env = CollectEnv({}, state=state)
    read = ibports.reader(tmp_path, env)
    assert read.ports() == [] and not read.listed and not read.hung
    ibports.said(read, env, "infiniband")
    assert state.hung_probes == {}
    assert any("exited without an answer (killed by signal 9)" in e[2] for e in state.errors)


def test_a_port_file_asked_for_by_path_or_by_str_gets_the_one_answer(node):
    """The families ask for port files by str (their port dirs), a snapshot by pathlib.Path
    (commands.node: `ib.text(root / rel)`), an operator may give --root with a trailing or
    doubled slash: each finds the answer the reader's child read, as Path equality did."""
    from pathlib import Path

    node.write("sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error", "40\n")
    root = str(node.root)
    read = ibports.reader(root + "//", CollectEnv(node.config, state=NodeState()),
                          ibports.port_files(["sys/class/infiniband/*/ports/*/counters/"
                                              "symbol_error"]))
    pdir = next(p for h, n, p in read.ports() if (h, n) == ("mlx5_2", "1"))
    assert pdir == f"{root}/sys/class/infiniband/mlx5_2/ports/1"
    rel = "sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error"
    assert read.text(f"{pdir}/counters/symbol_error") == "40"
    assert read.text(Path(root) / rel) == "40"
    assert read.text(f"{root}//sys/class/infiniband/mlx5_2/ports/1/./counters/symbol_error") \
        == "40"
    assert read.text(f"{root}/{rel}.other") is None
    assert ibports.reader(Path(root), read_env := CollectEnv(node.config)) is not read
    read_env.shared[ibports.SHARED_KEY] = read
    assert ibports.reader(Path(root), read_env) is read  # the run's one reader, by either
