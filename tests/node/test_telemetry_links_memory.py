"""The telemetry family's NVLink throughput, row-remap pressure and InfiniBand error rates
(issue 25 item 1): read through pynvml's real names with NVML's per-field error semantics
(faked at the pynvml boundary), from the 8-GPU healthy fixture and the real H200 capture's
shapes; figures and warnings, never drains."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from rsc_health import engine
from rsc_health.checks import telemetry
from rsc_health.collect.gpu import ALL_LINKS, NvmlBackend, parse_answers
from rsc_health.model import Metric, Severity, Status
from tests.node.test_nvml_backend import FakeNvml
from tests.node.test_telemetry import CFG, _sample, _saved, _state

REAL = Path(__file__).resolve().parents[1] / "fixtures/real/h200-vm-2026-11-26"
HEALTHY = Path(__file__).resolve().parents[1] / "fixtures/nodes/healthy/rsc_health/nvml.json"
TX, RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX


def _doc(busy: bool = True) -> dict:
    doc = json.loads(HEALTHY.read_text())
    for dev in doc["devices"]:
        dev["telemetry"]["utilization"]["gpu"] = 95 if busy else 0
    return doc


def _no_warning_drains(findings) -> None:
    assert findings and all(f.severity <= Severity.WARN for f in findings)


# -- the live backend --------------------------------------------------------------------

def test_the_live_backend_asks_nvlink_throughput_summed_over_every_link(monkeypatch):
    """NVML sums a throughput field over all links only for scopeId UINT_MAX; the backend asks
    that, so the figure is the GPU's, not link 0's (1/18 of it on the fake)."""
    asked: list = []
    fake = FakeNvml()
    fake.install(monkeypatch)
    real_call = pynvml.nvmlDeviceGetFieldValues

    def spy(handle, ids):
        asked.append(list(ids))
        return real_call(handle, ids)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", spy)
    tele = NvmlBackend(telemetry=True).read()["devices"][0]["telemetry"]
    assert [(TX, ALL_LINKS), (RX, ALL_LINKS)] in asked
    assert tele["nvlink_kib"] == {"tx": fake.nvlink_kib[TX], "rx": fake.nvlink_kib[RX]}
    assert tele["remap_histogram"] == {"max": 3072, "high": 0, "partial": 0, "low": 0,
                                       "none": 0}


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED,
                                  pynvml.NVML_ERROR_NO_PERMISSION])
def test_throughput_and_histogram_nvml_refuses_are_absent_not_checker_errors(monkeypatch, code):
    """Off NVLink (the real H200 VM) the throughput fields answer NOT_SUPPORTED each in its
    slot; a histogram NVML refuses (NOT_SUPPORTED before Ampere, NO_PERMISSION in a locked
    container) is absent too: no field error, no metric, nothing warns."""
    fake = FakeNvml(fail={"nvmlDeviceGetRowRemapperHistogram": code})
    fake.unsupported_fields = {TX, RX}
    fake.install(monkeypatch)
    doc = NvmlBackend(telemetry=True).read()
    assert all(g.field_errors == {} for g in parse_answers(doc).gpus)
    tele = doc["devices"][0]["telemetry"]
    assert tele["nvlink_kib"]["tx"] == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    first = _state(doc, 1_000_000)
    second = _state(doc, 1_300_000, _saved(first))
    findings = telemetry.check(second, CFG)
    metrics = _sample(findings)["metrics"]
    assert Metric.NVLINK_DATA_RATE not in metrics and Metric.REMAP_LOW_BANKS not in metrics
    assert metrics[Metric.REMAPPED_ROWS]["value"] == 1.0  # nvmlDeviceGetRemappedRows answered
    assert not [f for f in findings if f.status is not Status.OK]


def test_a_pynvml_without_the_histogram_call_leaves_it_absent(monkeypatch):
    FakeNvml().install(monkeypatch)
    monkeypatch.delattr(pynvml, "nvmlDeviceGetRowRemapperHistogram")
    doc = NvmlBackend(telemetry=True).read()
    assert doc["devices"][0]["telemetry"]["remap_histogram"] == {
        "error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
    assert all(g.field_errors == {} for g in parse_answers(doc).gpus)


def test_the_real_h200_answers_give_pressure_zero_and_no_nvlink_figure():
    """The H200 capture's own answers: remapped rows [0, 0, 0, 0], all 3,072 banks at max,
    NVLink throughput NOT_SUPPORTED (no peers)."""
    g = json.loads((REAL / "nvml-idle.json").read_text())["gpus"][0]
    fields = g["telemetry"]["fields"]
    doc = {"driver_version": "580.159.04", "device_count": 1, "devices": [{
        "index": 0, "remapped_rows": dict(zip(("correctable", "uncorrectable", "pending",
                                                "failure"), g["remapped_rows"], strict=True)),
        "nvlink": [],
        "telemetry": {"utilization": {"gpu": 100, "memory": 40},
                      "nvlink_kib": {"tx": fields["NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"],
                                     "rx": fields["NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"]},
                      "remap_histogram": g["row_remapper_histogram"]}}]}
    first = _state(doc, 1_000_000)
    findings = telemetry.check(_state(doc, 1_300_000, _saved(first)), CFG)
    metrics = _sample(findings)["metrics"]
    assert metrics[Metric.REMAPPED_ROWS] == {"value": 0.0, "component": "gpu0"}
    assert metrics[Metric.REMAP_LOW_BANKS] == {"value": 0.0, "component": "gpu0"}
    assert Metric.NVLINK_DATA_RATE not in metrics
    assert [f.status for f in findings] == [Status.OK]


# -- NVLink throughput as a rate ---------------------------------------------------------

def test_nvlink_throughput_is_bytes_per_second_of_the_slowest_busy_gpu():
    first_doc, second_doc = _doc(), _doc()
    gib = 1024 * 1024  # KiB in a GiB
    for i, dev in enumerate(second_doc["devices"]):
        kib = dev["telemetry"]["nvlink_kib"]
        # 300 s at 20 GiB/s each way; GPU 6 at 5 GiB/s; GPU 7 idle, sending nothing.
        per_s = 0 if i == 7 else (5 if i == 6 else 20)
        kib["tx"] += per_s * gib * 300
        kib["rx"] += per_s * gib * 300
    second_doc["devices"][7]["telemetry"]["utilization"]["gpu"] = 0
    first = _state(first_doc, 1_000_000)
    findings = telemetry.check(_state(second_doc, 1_300_000, _saved(first)), CFG)
    metric = _sample(findings)["metrics"][Metric.NVLINK_DATA_RATE]
    assert metric["component"] == "gpu6"  # the idle GPU 7 is not the node's slowest
    assert metric["value"] == pytest.approx(2 * 5 * 2**30, rel=1e-6)
    _no_warning_drains(findings)


def test_an_nvlink_counter_that_went_down_counts_from_zero_never_negative():
    first_doc, second_doc = _doc(), _doc()
    for dev in first_doc["devices"]:
        dev["telemetry"]["nvlink_kib"] = {"tx": 10**15, "rx": 10**15}
    for dev in second_doc["devices"]:
        dev["telemetry"]["nvlink_kib"] = {"tx": 300, "rx": 300}  # a driver reload
    first = _state(first_doc, 1_000_000)
    metric = _sample(telemetry.check(_state(second_doc, 1_300_000, _saved(first)), CFG))[
        "metrics"][Metric.NVLINK_DATA_RATE]
    assert metric["value"] == pytest.approx(600 * 1024 / 300)


@pytest.mark.parametrize("garbage", ["123", -1, True, 2**64, 1.5, None, [], {"error": 4},
                                     {"error": "NVML_ERROR_NO_PERMISSION"}])
def test_garbled_throughput_histogram_and_rows_are_absent_never_a_crash(garbage):
    doc = _doc()
    dev = doc["devices"][2]
    dev["telemetry"]["nvlink_kib"] = {"tx": garbage, "rx": 5}
    dev["telemetry"]["remap_histogram"] = {"max": 3072, "low": garbage, "none": 0}
    dev["remapped_rows"] = {"correctable": garbage, "uncorrectable": 0}
    first = _state(doc, 1_000_000)
    second = _state(doc, 1_300_000, _saved(first))
    assert telemetry._prefix(second.gpu.gpus[2]) + "nvlink_tx_kib" not in second.counters
    assert telemetry._prefix(second.gpu.gpus[2]) + "nvlink_rx_kib" in second.counters
    findings = telemetry.check(second, CFG)
    gpus = _sample(findings)["gpus"]
    assert "nvlink_data_rate" not in gpus["gpu2"]
    assert "remap_low_banks" not in gpus["gpu2"] and "remapped_rows" not in gpus["gpu2"]
    assert gpus["gpu3"]["remap_low_banks"] == 0.0  # the other GPUs still say theirs
    _no_warning_drains(findings)


# -- row-remap pressure ------------------------------------------------------------------

def test_banks_low_on_remap_rows_warn_and_never_drain():
    doc = _doc()
    doc["devices"][4]["telemetry"]["remap_histogram"].update(max=3068, partial=2, low=1, none=1)
    doc["devices"][4]["remapped_rows"].update(correctable=9, uncorrectable=2)
    findings = telemetry.check(_state(doc, 1_000_000), CFG)
    warned = [f for f in findings if f.status is Status.WARN]
    assert [(f.component, f.code) for f in warned] == [("gpu4", "gpu_remap_low")]
    assert warned[0].data["banks"] == 2 and warned[0].data["remapped_rows"] == 11.0
    metrics = _sample(findings)["metrics"]
    assert metrics[Metric.REMAP_LOW_BANKS] == {"value": 2.0, "component": "gpu4"}
    assert metrics[Metric.REMAPPED_ROWS] == {"value": 11.0, "component": "gpu4"}
    _no_warning_drains(findings)


def test_partial_availability_alone_does_not_warn():
    doc = _doc()
    doc["devices"][1]["telemetry"]["remap_histogram"].update(max=3000, high=60, partial=12)
    findings = telemetry.check(_state(doc, 1_000_000), CFG)
    assert [f.status for f in findings] == [Status.OK]


def test_a_gpu_without_a_row_remapper_counts_its_retired_pages():
    doc = _doc()
    dev = doc["devices"][0]
    dev["remapped_rows"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}  # V100: page retirement
    dev["retired_pages"] = {"sbe": 40, "dbe": 3, "pending": 0}
    dev["telemetry"]["remap_histogram"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
    gpus = _sample(telemetry.check(_state(doc, 1_000_000), CFG))["gpus"]
    assert gpus["gpu0"]["remapped_rows"] == 43.0
    assert "remap_low_banks" not in gpus["gpu0"]


# -- NVLink errors past their line -------------------------------------------------------

def test_nvlink_errors_above_the_line_warn_below_it_do_not():
    first_doc, second_doc = _doc(), _doc()
    second_doc["devices"][2]["nvlink"][5]["crc_flit"] = 30  # 0.1/s over 300 s
    second_doc["devices"][3]["nvlink"][0]["replay"] = 2  # 0.0067/s: under 0.01/s
    first = _state(first_doc, 1_000_000)
    findings = telemetry.check(_state(second_doc, 1_300_000, _saved(first)), CFG)
    warned = [(f.component, f.code) for f in findings if f.status is Status.WARN]
    assert warned == [("gpu2", "gpu_nvlink_errors")]
    _no_warning_drains(findings)


def test_a_site_without_the_lines_gets_figures_and_no_warnings():
    cfg = {**CFG, "telemetry": {**CFG["telemetry"], "warn_above": {}}}
    first_doc, second_doc = _doc(), _doc()
    second_doc["devices"][2]["nvlink"][5]["crc_flit"] = 3000
    second_doc["devices"][4]["telemetry"]["remap_histogram"]["none"] = 5
    first = _state(first_doc, 1_000_000)
    findings = telemetry.check(_state(second_doc, 1_300_000, _saved(first)), cfg)
    assert [f.status for f in findings] == [Status.OK]
    assert _sample(findings)["metrics"][Metric.NVLINK_ERROR_RATE]["value"] == 10.0


# -- InfiniBand error counters as rates, through the engine ------------------------------

def test_ib_error_counters_become_the_worst_ports_rate_through_the_engine(node):
    cfg = node.config
    engine.run(cfg, node.root, only={"telemetry"})
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))
    port = "sys/class/infiniband/mlx5_6/ports/1/counters/"
    node.write(port + "symbol_error", "600\n")
    node.write(port + "port_rcv_errors", "300\n")
    node.write(port + "port_xmit_discards", "900000\n")  # congestion: not an error here
    node.write("sys/class/infiniband/mlx5_1/ports/1/counters/link_error_recovery", "3\n")
    findings = engine.run(cfg, node.root, only={"telemetry"}, save_state=False)
    sample = _sample(findings)
    err = sample["metrics"][Metric.IB_ERROR_RATE]
    assert err["component"] == "mlx5_6/1"
    # the symbol errors only: receive errors are not this link's own physical errors
    assert err["value"] == pytest.approx(2.0, rel=0.01)
    _no_warning_drains(findings)


def _ib_interval(node) -> None:
    """A first run that saved the ports' counters 300 s ago."""
    engine.run(node.config, node.root, only={"telemetry"})
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))


def test_ib_error_rate_is_the_links_own_physical_errors_not_receive_or_fabric_errors(node):
    """Receive errors (local buffer overruns and malformed packets as well as bad CRCs), packets
    a link elsewhere marked bad (remote physical) and overruns are what healthy NDR ports count
    under load (the infiniband family tolerates 100 a sweep of each): a port counting them is
    not the worst port. Symbol errors, link recoveries, link integrity errors and link downs
    are this link's own; their sum per second is ib_error_rate. The port's figures keep every
    counter's rate."""
    _ib_interval(node)
    busy = "sys/class/infiniband/mlx5_2/ports/1/counters/"
    node.write(busy + "port_rcv_errors", "90\n")
    node.write(busy + "port_rcv_remote_physical_errors", "60\n")
    node.write(busy + "excessive_buffer_overrun_errors", "12\n")
    cable = "sys/class/infiniband/mlx5_5/ports/1/counters/"
    node.write(cable + "symbol_error", "8\n")
    node.write(cable + "link_error_recovery", "1\n")
    node.write(cable + "local_link_integrity_errors", "3\n")
    findings = engine.run(node.config, node.root, only={"telemetry"}, save_state=False)
    sample = _sample(findings)
    err = sample["metrics"][Metric.IB_ERROR_RATE]
    assert err["component"] == "mlx5_5/1"
    assert err["value"] == pytest.approx(12 / 300, rel=0.01)
    ports = {p["port"]: p for p in sample["ports"]}
    assert ports["mlx5_2/1"]["error_rate"] == 0.0
    assert ports["mlx5_2/1"]["port_rcv_errors_rate"] == pytest.approx(90 / 300, rel=0.01)
    _no_warning_drains(findings)


def test_a_4_bit_overrun_counter_stopped_at_15_no_longer_hides_a_ports_error_rate(node):
    """excessive_buffer_overrun_errors is 4 bits wide and fills on healthy ports under load; it
    is not summed into ib_error_rate, so the port's symbol errors still give a rate."""
    port = "sys/class/infiniband/mlx5_3/ports/1/counters/"
    node.write(port + "excessive_buffer_overrun_errors", "15\n")
    _ib_interval(node)
    node.write(port + "symbol_error", "9\n")
    sample = _sample(engine.run(node.config, node.root, only={"telemetry"}, save_state=False))
    ports = {p["port"]: p for p in sample["ports"]}
    assert ports["mlx5_3/1"]["error_rate"] == pytest.approx(9 / 300, rel=0.01)
    assert sample["metrics"][Metric.IB_ERROR_RATE]["component"] == "mlx5_3/1"


def test_an_ib_error_counter_that_went_down_gives_no_negative_rate(node):
    port = "sys/class/infiniband/mlx5_0/ports/1/counters/"
    node.write(port + "symbol_error", "5000\n")
    engine.run(node.config, node.root, only={"telemetry"})
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))
    node.write(port + "symbol_error", "0\n")  # the HCA was reset
    sample = _sample(engine.run(node.config, node.root, only={"telemetry"}, save_state=False))
    assert sample["metrics"][Metric.IB_ERROR_RATE]["value"] >= 0.0


def test_an_nvlink_counter_that_jumps_past_any_links_bandwidth_gives_no_rate():
    """A jump no NVLink carries (a garbled read, a reset the driver did not show as one) is no
    figure at all, not a huge rate."""
    first_doc, second_doc = _doc(), _doc()
    for dev in second_doc["devices"]:
        dev["telemetry"]["nvlink_kib"]["tx"] += 2**50  # 1 PiB in 300 s
    first = _state(first_doc, 1_000_000)
    sample = _sample(telemetry.check(_state(second_doc, 1_300_000, _saved(first)), CFG))
    assert Metric.NVLINK_DATA_RATE not in sample["metrics"]


def test_a_saturated_ib_error_counter_gives_no_rate_not_zero(node):
    """PortCounters stop at their width's maximum (symbol_error: 16 bits): a port that sat at
    65535 through the interval can no longer show its errors; its rate is absent."""
    port = "sys/class/infiniband/mlx5_0/ports/1/counters/"
    node.write(port + "symbol_error", "65535\n")
    engine.run(node.config, node.root, only={"telemetry"})
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))
    findings = engine.run(node.config, node.root, only={"telemetry"}, save_state=False)
    ports = {p["port"]: p for p in _sample(findings)["ports"]}
    assert "error_rate" not in ports["mlx5_0/1"]
    assert ports["mlx5_1/1"]["error_rate"] == 0.0  # an unsaturated port still says 0


def test_the_ib_error_rate_warn_line_is_the_infiniband_tolerances_of_the_summed_counters():
    """The rollups count ib_error_rate samples past [telemetry] warn_above.ib_error_rate: the
    infiniband family's per-sweep tolerances of the counters the rate sums (symbol 10, link
    recovery 1, link downed 0, link integrity 10: 21 in 300 s), not of the receive, remote
    physical and overrun counters it no longer sums (100 each)."""
    from rsc_health.checks.infiniband import DEFAULT_LIMITS
    from rsc_health.config import load_config

    line = load_config(None).get("telemetry.warn_above")["ib_error_rate"]
    assert line == pytest.approx(sum(DEFAULT_LIMITS[c] for c in telemetry.IB_ERRORS) / 300,
                                 abs=0.001)
