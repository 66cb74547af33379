"""The telemetry family: NVML's telemetry answers (live through pynvml's real names, faked at
the pynvml boundary; and the real H200 capture) become one node-level sample per run and
warnings, never drains."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pynvml
import pytest

from rsc_health import engine
from rsc_health.checks import telemetry
from rsc_health.checks.state import NodeState
from rsc_health.collect import counters as counters_mod
from rsc_health.collect.gpu import NvmlBackend, parse_answers
from rsc_health.config import PACKAGED_DEFAULTS, _read_toml
from rsc_health.model import Metric, Severity, Status
from tests.node.test_nvml_backend import FakeNvml

REAL = Path(__file__).resolve().parents[1] / "fixtures/real/h200-vm-2026-11-26"
CFG = _read_toml(PACKAGED_DEFAULTS)
BOOT = "boot-1"


def _state(doc: dict, time_ms: int, previous: dict | None = None, ports=()) -> NodeState:
    """The state the engine builds: NVML parsed, the family's read, its counters and deltas
    against `previous` (what counters.json held)."""
    state = NodeState(boot_id=BOOT)
    state.gpu = parse_answers(doc)
    state.nvml_answers = doc
    state.extra["telemetry"] = {"time_ms": time_ms, "ports": list(ports)}
    state.counters = telemetry.counters(state)
    state.deltas = counters_mod.deltas(previous or {}, state.counters, BOOT)
    return state


def _saved(state: NodeState) -> dict:
    return {"boot_id": state.boot_id, "counters": dict(state.counters)}


def _sample(findings):
    (f,) = [f for f in findings if f.status is Status.OK and "metrics" in f.data]
    return f.data


# -- the real H200 capture ---------------------------------------------------------------

def _h200_series() -> list[dict]:
    return [json.loads(line) for line in gzip.open(REAL / "nvml-telemetry-4hz.jsonl.gz")]


def _h200_doc(row: dict) -> dict:
    """One 4 Hz row of the capture (nvml_dump.py's layout) as NvmlBackend's answers, the
    maxima and enforced limit from the same GPU's idle dump."""
    static = json.loads((REAL / "nvml-idle.json").read_text())["gpus"][0]
    g = row["gpus"][0]
    fields = g["fields"]
    event = {key: fields[f"NVML_FI_DEV_CLOCKS_EVENT_REASON_{name}"] for key, name in (
        ("sw_power_cap", "SW_POWER_CAP"), ("sw_thermal", "SW_THERM_SLOWDOWN"),
        ("hw_thermal", "HW_THERM_SLOWDOWN"), ("hw_power_brake", "HW_POWER_BRAKE_SLOWDOWN"))}
    return {"driver_version": "580.159.04", "device_count": 1, "devices": [{
        "index": 0, "uuid": static["uuid"], "pci_bus_id": static["pci"]["busId"],
        "name": static["name"], "temperature": g["temperature_c"],
        "throttle_reasons": g["clocks_event_reasons"],
        "pcie": {"gen": g["pcie_gen"], "max_gen": static["pcie_max_gen"],
                 "width": g["pcie_width"], "max_width": static["pcie_max_width"],
                 "replay": g["pcie_replay"]},
        "nvlink": [],
        "telemetry": {
            "clocks": {"sm": g["clocks"]["sm"], "mem": g["clocks"]["mem"]},
            "max_clocks": {"sm": static["max_clocks"]["sm"], "mem": static["max_clocks"]["mem"]},
            "power_mw": g["power_mw"],
            "enforced_power_limit_mw": static["enforced_power_limit_mw"],
            "utilization": g["utilization"],
            "violation_ns": {k: v["violationTime"] for k, v in g["violation"].items()
                             if k in ("power", "thermal", "sync_boost", "board_limit",
                                      "reliability")},
            "event_time_ns": event,
        },
    }]}


def test_the_healthy_h200_under_load_spends_a_third_in_power_cap_and_does_not_warn():
    """94 s of gpu-burn and GEMMs on a real H200: 32 s in SW power cap at up to 733 W of a
    700 W limit. Sampled at the ends, the fraction and the power ratio come out as measured,
    and nothing warns: power capping is what a healthy GPU does at full load."""
    rows = _h200_series()
    first, last = rows[0], rows[-1]
    before = _state(_h200_doc(first), int(first["t"] * 1000))
    after = _state(_h200_doc(last), int(last["t"] * 1000), _saved(before))
    findings = telemetry.check(after, CFG)
    sample = _sample(findings)
    assert sample["interval_s"] == pytest.approx(93.55, abs=0.01)
    power = sample["metrics"][Metric.THROTTLE_POWER_FRAC]
    assert power["value"] == pytest.approx(32.2017 / 93.555, abs=1e-3)
    assert power["component"] == "gpu0"
    assert sample["metrics"][Metric.THROTTLE_HW_FRAC]["value"] == 0.0
    assert [f for f in findings if f.status is not Status.OK] == []


def test_every_busy_moment_of_the_h200_capture_samples_without_a_warning():
    """Sampled at every one of the 375 rows (a sweep at each instant of the run): the SM clock
    held down by the power cap (1,395 of 1,980 MHz at the lowest) is a ratio peers compare,
    never a warning; nor is 733 W against a 700 W limit."""
    rows = _h200_series()
    previous, ratios = None, []
    for row in rows:
        state = _state(_h200_doc(row), int(row["t"] * 1000), previous)
        findings = telemetry.check(state, CFG)
        assert [f.code for f in findings if f.status is not Status.OK] == []
        metrics = _sample(findings)["metrics"]
        if Metric.SM_CLOCK_RATIO in metrics:
            ratios.append(metrics[Metric.SM_CLOCK_RATIO]["value"])
        assert 0 < metrics[Metric.POWER_RATIO]["value"] < 1.1
        previous = _saved(state)
    assert ratios and min(ratios) == pytest.approx(1395 / 1980, abs=0.02)


# -- the live backend, through pynvml's names -----------------------------------------

def test_the_live_backend_reads_telemetry_only_when_asked(monkeypatch):
    FakeNvml().install(monkeypatch)
    plain = NvmlBackend().read()["devices"][0]
    assert "telemetry" not in plain  # a prolog asks NVML nothing more
    dev = NvmlBackend(telemetry=True).read()["devices"][0]
    tele = dev["telemetry"]
    assert tele["clocks"] == {"sm": 1395, "mem": 2619}
    assert tele["max_clocks"] == {"sm": 1980, "mem": 2619}
    assert tele["utilization"] == {"gpu": 100, "memory": 38}
    assert tele["violation_ns"]["power"] == 32_201_738_944
    assert tele["event_time_ns"]["sw_power_cap"] == 32_201_738_944
    assert tele["event_time_ns"]["hw_thermal"] == 0
    assert dev["throttle_reasons"] == 4  # the new call's answer, not the deprecated one's


@pytest.mark.parametrize("lacking", ["pynvml", "driver"])
def test_clock_event_reasons_fall_back_to_the_deprecated_call(monkeypatch, lacking):
    """A pynvml without nvmlDeviceGetCurrentClocksEventReasons (older), or a driver that
    answers FUNCTION_NOT_FOUND for it: the deprecated ...ThrottleReasons gives the bitmask."""
    if lacking == "pynvml":
        FakeNvml().install(monkeypatch)
        monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    else:
        FakeNvml(fail={"nvmlDeviceGetCurrentClocksEventReasons":
                       pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}).install(monkeypatch)
    assert NvmlBackend().read()["devices"][0]["throttle_reasons"] == 1


def test_a_pynvml_with_neither_clock_reason_call_leaves_the_field_absent(monkeypatch):
    FakeNvml().install(monkeypatch)
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    doc = NvmlBackend().read()
    assert doc["devices"][0]["throttle_reasons"] == {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
    assert parse_answers(doc).gpus[0].field_errors == {}


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NO_PERMISSION,
                                  pynvml.NVML_ERROR_NOT_SUPPORTED])
def test_a_refused_telemetry_field_is_absent_not_a_checker_error(monkeypatch, code):
    fake = FakeNvml(fail={"nvmlDeviceGetPowerUsage": code,
                          "nvmlDeviceGetViolationStatus": code})
    fake.unsupported_fields = {pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN}
    fake.install(monkeypatch)
    doc = NvmlBackend(telemetry=True).read()
    report = parse_answers(doc)
    assert all(g.field_errors == {} for g in report.gpus)
    state = _state(doc, 1_000_000)
    metrics = _sample(telemetry.check(state, CFG))["metrics"]
    assert Metric.POWER_RATIO not in metrics
    assert metrics[Metric.SM_CLOCK_RATIO]["value"] == pytest.approx(1395 / 1980, abs=1e-4)
    prefix = f"tm/{state.gpu.gpus[0].uuid}/event/"
    assert prefix + "hw_thermal" not in state.counters
    assert prefix + "sw_power_cap" in state.counters


# -- rates over the interval -----------------------------------------------------------

def _doc_with(**event_ns) -> dict:
    doc = json.loads((Path(__file__).resolve().parents[1]
                      / "fixtures/nodes/healthy/rsc_health/nvml.json").read_text())
    for dev in doc["devices"]:
        dev["telemetry"]["utilization"]["gpu"] = 95
        dev["telemetry"]["clocks"]["sm"] = 1755
    doc["devices"][3]["telemetry"]["event_time_ns"].update(event_ns)
    return doc


def test_first_run_has_no_rate_and_the_second_warns_on_hw_slowdown():
    first = _state(_doc_with(hw_thermal=5 * 10**9), 1_000_000)
    sample = _sample(telemetry.check(first, CFG))
    assert sample["interval_s"] is None
    assert Metric.THROTTLE_HW_FRAC not in sample["metrics"]
    # 300 s later GPU 3 spent 180 s of them in HW thermal slowdown.
    second = _state(_doc_with(hw_thermal=185 * 10**9), 1_300_000, _saved(first))
    findings = telemetry.check(second, CFG)
    warned = [f for f in findings if f.status is Status.WARN]
    assert [(f.component, f.code) for f in warned] == [("gpu3", "gpu_hw_throttle")]
    assert warned[0].severity is Severity.WARN and "hw_thermal" in warned[0].reason
    metric = _sample(findings)["metrics"][Metric.THROTTLE_HW_FRAC]
    assert metric == {"value": 0.6, "component": "gpu3"}


def test_a_counter_that_went_down_gives_no_negative_rate():
    """A driver reload restarts NVML's counters: the rate counts from zero, never below."""
    first = _state(_doc_with(hw_thermal=900 * 10**9, sw_power_cap=10**12), 1_000_000)
    second = _state(_doc_with(hw_thermal=3 * 10**9, sw_power_cap=0), 1_300_000, _saved(first))
    metrics = _sample(telemetry.check(second, CFG))["metrics"]
    assert metrics[Metric.THROTTLE_HW_FRAC]["value"] == pytest.approx(0.01)
    assert metrics[Metric.THROTTLE_POWER_FRAC]["value"] == 0.0


@pytest.mark.parametrize("later_ms", [1_000_000 - 60_000, 1_000_500, 1_000_000 + 7_200_000])
def test_a_clock_step_a_blink_or_a_long_gap_gives_no_rate(later_ms):
    first = _state(_doc_with(), 1_000_000)
    second = _state(_doc_with(hw_thermal=10**11), later_ms, _saved(first))
    sample = _sample(telemetry.check(second, CFG))
    assert sample["interval_s"] is None
    assert Metric.THROTTLE_HW_FRAC not in sample["metrics"]


def test_a_new_boot_gives_no_rate():
    first = _state(_doc_with(), 1_000_000)
    previous = {"boot_id": "boot-0", "counters": dict(first.counters)}
    second = _state(_doc_with(hw_thermal=10**11), 1_300_000, previous)
    assert _sample(telemetry.check(second, CFG))["interval_s"] is None


@pytest.mark.parametrize("garbage", ["1980", -5, True, None, 2**70, 1.5e300, [], {"x": 1},
                                     {"error": 18}])
def test_garbled_telemetry_answers_are_absent_never_a_crash(garbage):
    doc = _doc_with()
    tele = doc["devices"][0]["telemetry"]
    tele["clocks"]["sm"] = garbage
    tele["max_clocks"]["sm"] = garbage
    tele["power_mw"] = garbage
    tele["utilization"] = garbage
    tele["violation_ns"]["thermal"] = garbage
    tele["event_time_ns"] = garbage
    doc["devices"][0]["pcie"]["gen"] = garbage
    state = _state(doc, 1_000_000)
    findings = telemetry.check(state, CFG)
    assert all(f.severity <= Severity.WARN for f in findings)
    assert all(k.startswith("tm/") for k in state.counters)
    assert all(counters_mod.plausible(v) for v in state.counters.values())


def test_a_busy_gpu_on_a_downtrained_link_warns_an_idle_one_at_gen1_does_not():
    doc = _doc_with()
    doc["devices"][5]["pcie"].update(gen=3)  # busy (95%) at Gen3 of Gen5
    doc["devices"][6]["pcie"].update(gen=1)
    doc["devices"][6]["telemetry"]["utilization"]["gpu"] = 0  # idle at Gen1: power saving
    findings = telemetry.check(_state(doc, 1_000_000), CFG)
    assert [(f.component, f.code) for f in findings if f.status is Status.WARN] == [
        ("gpu5", "gpu_pcie_slow")]
    metric = _sample(findings)["metrics"][Metric.PCIE_LINK_RATIO]
    assert metric == {"value": 0.6, "component": "gpu5"}


# -- the whole engine on the healthy node: HCA counters as rates ----------------------

def test_hca_xmit_wait_becomes_a_rate_through_the_engine(node):
    cfg = node.config
    engine.run(cfg, node.root, only={"telemetry"})
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    # The last sweep was five minutes ago.
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))
    port = "sys/class/infiniband/mlx5_4/ports/1/counters/"
    node.write(port + "port_xmit_wait", "30000000\n")
    node.write(port + "port_xmit_data", str(300 * 10**9 // 4) + "\n")
    findings = engine.run(cfg, node.root, only={"telemetry"}, save_state=False)
    sample = _sample(findings)
    assert sample["interval_s"] == pytest.approx(300, abs=2)
    wait = sample["metrics"][Metric.IB_XMIT_WAIT_RATE]
    assert wait["component"] == "mlx5_4/1"
    assert wait["value"] == pytest.approx(100_000, rel=0.01)
    (p,) = [p for p in sample["ports"] if p["port"] == "mlx5_4/1"]
    assert p["port_xmit_data_rate"] == pytest.approx(10**9, rel=0.01)  # bytes/s, not words
    assert sample["metrics"][Metric.IB_LINK_RATIO]["value"] == 1.0


def test_a_sweep_spools_one_telemetry_record(node, monkeypatch):
    from rsc_health import nodepath
    from tests.node.test_state_dir_read_only import node01_slurm

    monkeypatch.setenv("RSC_HEALTH_ROOT", str(node.root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(node.root / "config.toml"))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: node01_slurm()) == 0
    spool = node.root / "var/lib/rsc_health/spool/pending.jsonl"
    records = [json.loads(line) for line in spool.read_text().splitlines()]
    tele = [r for r in records if r["kind"] == "telemetry"]
    assert len(tele) == 1
    assert tele[0]["node"] == "node01" and tele[0]["source"] == "sweep"
    assert tele[0]["interval_s"] is None  # a first sweep: no rates yet
    assert set(tele[0]["metrics"]) <= {m.value for m in Metric}
    assert tele[0]["metrics"]["gpu_temp_c"] == {"value": 34.0, "component": "gpu0"}
    # A prolog does not run the family: no record, and NVML asked nothing more.
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    nodepath.run_stage("prolog", slurm_factory=lambda c, d: node01_slurm())
    records = [json.loads(line) for line in spool.read_text().splitlines()]
    assert len([r for r in records if r["kind"] == "telemetry"]) == 1


def test_a_fifo_or_a_device_where_a_counter_was_is_skipped_never_waited_on(node):
    """A FIFO at port_xmit_wait would block read() for ever, /dev/zero never ends: that port's
    counter is absent (no rate), the other ports' are read."""
    import os
    import time

    port = node.root / "sys/class/infiniband/mlx5_1/ports/1/counters"
    (port / "port_xmit_wait").unlink()
    os.mkfifo(port / "port_xmit_wait")
    (port / "port_xmit_data").unlink()
    (port / "port_xmit_data").symlink_to("/dev/zero")
    started = time.monotonic()
    read = telemetry.collect(node.root)
    assert time.monotonic() - started < 2
    ports = {p["name"]: p for p in read["ports"]}
    assert set(ports["mlx5_1/1"]["counters"]) == {"port_rcv_data", *telemetry.IB_ERRORS,
                                                *telemetry.IB_LOAD_ERRORS}
    assert set(ports["mlx5_0/1"]["counters"]) == set(telemetry.IB_COUNTERS)


def test_a_hostile_hca_name_and_garbled_counters_do_not_reach_the_sample_as_numbers(node):
    base = node.root / "sys/class/infiniband"
    (base / "mlx5_0").rename(base / 'mlx"5\nx')
    port = base / "mlx5_2/ports/1/counters"
    (port / "port_xmit_wait").write_text("-5\n")
    (port / "port_rcv_data").write_text("12junk\n")
    read = telemetry.collect(node.root)
    ports = {p["name"]: p for p in read["ports"]}
    assert 'mlx"5\nx/1' in ports  # a name, never parsed as anything else
    assert ports["mlx5_2/1"]["counters"] == {"port_xmit_data": 0,
                                             **{c: 0 for c in (*telemetry.IB_ERRORS,
                                                                  *telemetry.IB_LOAD_ERRORS)}}


def test_a_telemetry_call_that_hangs_is_bounded_like_every_nvml_read(monkeypatch, node):
    """nvmlDeviceGetViolationStatus blocks for ever on GPU 2 (a wedged driver): the read is
    abandoned at [gpu] nvml_timeout_s, the hang is said, the GPUs answered before are sampled,
    and nothing drains."""
    import time

    from rsc_health.model import Level
    from rsc_health.policy import decide

    fake = FakeNvml()
    fake.install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 4)
    real = pynvml.nvmlDeviceGetViolationStatus

    def wedged(handle, policy):
        if handle == "h2":
            time.sleep(3600)  # in the forked child, abandoned at the deadline
        return real(handle, policy)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetViolationStatus", wedged)
    cfg = node.config
    cfg.data["gpu"].update(backend="nvml", count=4, nvml_timeout_s=1.0)
    started = time.monotonic()
    findings = engine.run(cfg, node.root, only={"gpu", "telemetry"}, save_state=False)
    assert time.monotonic() - started < 5
    assert any(f.code == "nvml_hung" for f in findings)
    metrics = _sample(findings)["metrics"]
    assert metrics[Metric.SM_CLOCK_RATIO]["component"] in {"gpu0", "gpu1"}
    assert decide(findings).level in (Level.CHECKER_ERROR, Level.WARN)


def test_a_snapshot_replays_rates_over_the_interval_the_node_saw(node, tmp_path, monkeypatch):
    """GPU 3 spent 180 s of the last 300 in HW thermal slowdown: the live check warns. The
    snapshot's replay an hour later judges the same 300 s, not the 3,300 since the sweep."""
    from click.testing import CliRunner

    from rsc_health.cli import cli

    cfg = node.config
    engine.run(cfg, node.root, only={"telemetry"})
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))
    node.nvml(lambda d: d["devices"][3]["telemetry"]["event_time_ns"].update(
        hw_thermal=180 * 10**9))

    def check(*args):
        res = CliRunner().invoke(cli, ["--root", str(node.root), "--config",
                                       str(node.root / "config.toml"), *args])
        assert res.exception is None or isinstance(res.exception, SystemExit), res.output
        return res.output

    def warned(doc):
        return [(f["component"], f["code"]) for f in json.loads(doc)["findings"]
                if f["status"] == "warn"]

    assert warned(check("check", "--json", "--only", "telemetry")) == [
        ("gpu3", "gpu_hw_throttle")]
    snap = tmp_path / "snap.json"
    check("snapshot", "--out", str(snap))
    later = time.time() + 3000
    monkeypatch.setattr(telemetry.time, "time", lambda: later)
    res = CliRunner().invoke(cli, ["--root", str(tmp_path / "elsewhere"), "--config",
                                   os.devnull, "check", "--from", str(snap), "--json",
                                   "--only", "telemetry"])
    assert warned(res.output) == [("gpu3", "gpu_hw_throttle")]
    # A live check now (an hour on) would not: 180 s of 3,300 is under the 25% warn line.
    assert warned(check("check", "--json", "--only", "telemetry")) == []
