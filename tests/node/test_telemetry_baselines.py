"""The telemetry family's rates stay true when what it reads changes between runs: a field or
an NVLink that does not answer one run, GPUs numbered again, an HCA counter garbled once,
more ports than it reads, and readings no GPU gives. Each gave a false rate or a false
warning before (a rise over two intervals divided by one, one link's history counted as new
errors, one GPU's counters against another's)."""

from __future__ import annotations

import json
import shutil

import pytest

from rsc_health import ConfigError, engine
from rsc_health.checks import telemetry
from rsc_health.collect.gpu import UNANSWERED
from rsc_health.config import load_config
from rsc_health.model import Severity, Status
from tests.node.test_telemetry import CFG, _sample, _saved, _state
from tests.node.test_telemetry_links_memory import _doc

UNKNOWN = {"error": "NVML_ERROR_UNKNOWN"}


def _warned(findings) -> list[tuple[str, str]]:
    assert all(f.severity <= Severity.WARN for f in findings)  # telemetry never drains
    return [(f.component, f.code) for f in findings if f.status is Status.WARN]


# -- NVLink errors, per link ---------------------------------------------------------------

def _links(doc: dict, gpu: int, count: int = 18, each: int = 500) -> None:
    doc["devices"][gpu]["nvlink"] = [
        {"link": i, "state": True, "replay": each, "recovery": 0, "crc_flit": 2 * each,
         "crc_data": 0} for i in range(count)]


def test_a_link_that_does_not_answer_one_run_adds_no_errors_then_or_after():
    """18 links with 500 replays and 1000 CRC errors each since the driver loaded: link 17's
    replay counter not answering one run made the GPU's sum fall, a fall read as a reset,
    and the whole sum (26,500 errors) a new rise: 88/s and a warning, then 1.7/s when the
    link came back. No counter moved: the rate is 0 in every run."""
    docs = [_doc(), _doc(), _doc()]
    for d in docs:
        _links(d, 2)
    docs[1]["devices"][2]["nvlink"][17]["replay"] = UNKNOWN
    first = _state(docs[0], 1_000_000)
    second = _state(docs[1], 1_300_000, _saved(first))
    # the engine keeps the baselines read; link 17's is not among them (a rate family)
    third = _state(docs[2], 1_600_000, _saved(second))
    for state in (second, third):
        findings = telemetry.check(state, CFG)
        assert _sample(findings)["gpus"]["gpu2"]["nvlink_error_rate"] == 0.0
        assert ("gpu2", "gpu_nvlink_errors") not in _warned(findings)


def test_new_errors_on_one_link_are_counted_beside_a_link_that_reset():
    """Link 3 counts 3,000 new CRC errors while link 5's counters restart (a retrain): the
    rate is link 3's rise plus link 5's count since its restart, never link 5's history."""
    before, after = _doc(), _doc()
    _links(before, 2)
    _links(after, 2)
    after["devices"][2]["nvlink"][3]["crc_flit"] += 3000
    after["devices"][2]["nvlink"][5].update(replay=0, crc_flit=30)
    first = _state(before, 1_000_000)
    rate = _sample(telemetry.check(_state(after, 1_300_000, _saved(first)), CFG))[
        "gpus"]["gpu2"]["nvlink_error_rate"]
    assert rate == pytest.approx(3030 / 300)


# -- GPUs numbered again -----------------------------------------------------------------

def test_gpus_numbered_again_without_a_reboot_keep_their_own_counters():
    """GPU 0 fell off the bus and the driver was reloaded: the other seven are GPUs 0-6 now.
    Keyed by index, each was judged against its neighbour's counters (hours of HW slowdown
    apart): seven 100% slowdown warnings and absurd replay rates, though no counter moved."""
    before = _doc()
    for i, dev in enumerate(before["devices"]):
        dev["telemetry"]["event_time_ns"]["hw_slowdown"] = i * 3600 * 10**9
        dev["pcie"]["replay"] = i * 1000
        dev["telemetry"]["nvlink_kib"] = {"tx": i * 10**9, "rx": i * 10**9}
    after = json.loads(json.dumps(before))
    after["devices"] = after["devices"][1:]
    after["device_count"] = 7
    for i, dev in enumerate(after["devices"]):
        dev["index"] = i
    first = _state(before, 1_000_000)
    findings = telemetry.check(_state(after, 1_300_000, _saved(first)), CFG)
    assert _warned(findings) == []
    gpus = _sample(findings)["gpus"]
    assert sorted(gpus) == [f"gpu{i}" for i in range(7)]
    for fig in gpus.values():
        assert fig["hw_frac"] == 0.0 and fig["pcie_replay_rate"] == 0.0
        assert fig["nvlink_data_rate"] == 0.0


def test_a_gpu_without_a_uuid_fit_for_a_key_is_keyed_by_its_index():
    doc = _doc()
    doc["devices"][1]["uuid"] = "GPU-../../evil\n"
    doc["devices"][2]["uuid"] = UNKNOWN
    state = _state(doc, 1_000_000)
    assert telemetry._prefix(state.gpu.gpus[1]) == "tm/gpu1/"
    assert telemetry._prefix(state.gpu.gpus[2]) == "tm/gpu2/"
    assert telemetry._prefix(state.gpu.gpus[3]) == f"tm/{doc['devices'][3]['uuid']}/"


# -- a counter missed for a run, through the engine --------------------------------------

def _nvml(node, edit) -> None:
    path = node.root / "rsc_health/nvml.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _five_minutes_ago(node) -> None:
    path = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(path.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    path.write_text(json.dumps(state))


def _sweep(node) -> list:
    return engine.run(node.config, node.root, only={"telemetry"})


def _gpu4(hw_ns, replay):
    def edit(doc: dict) -> None:
        dev = doc["devices"][4]
        dev["telemetry"] = doc.pop("_telemetry", {}).get("4", dev["telemetry"])
        dev["telemetry"]["utilization"]["gpu"] = 95
        dev["telemetry"]["event_time_ns"]["hw_slowdown"] = hw_ns
        dev["pcie"]["replay"] = replay
    return edit


@pytest.mark.parametrize("missed", ["fields", "pass"])
def test_a_gpu_counter_missed_one_run_gives_the_next_no_rate_not_two_intervals_rise(node,
                                                                                    missed):
    """GPU 4 is in HW slowdown 20% of the time (60 s and 20 replays each 5 minutes). Its two
    fields did not answer one run (or the whole telemetry pass was abandoned, NVML hung):
    the next run divided 10 minutes' rise by 5 and warned at 40%. Now that run has no HW
    figure and no replay rate for GPU 4, and the run after is right again."""
    _nvml(node, _gpu4(0, 0))
    _sweep(node)
    _five_minutes_ago(node)
    if missed == "fields":
        _nvml(node, _gpu4(UNKNOWN, UNKNOWN))
    else:
        def abandoned(doc: dict) -> None:  # each GPU's telemetry UNANSWERED (gpu.py)
            doc["_telemetry"] = {"4": doc["devices"][4]["telemetry"]}  # for the next run
            for dev in doc["devices"]:
                dev["telemetry"] = dict(UNANSWERED)
            doc["devices"][4]["pcie"]["replay"] = 20  # read in the main pass, as ever
        _nvml(node, abandoned)
    _sweep(node)
    _five_minutes_ago(node)
    _nvml(node, _gpu4(120 * 10**9, 40))
    findings = _sweep(node)
    assert ("gpu4", "gpu_hw_throttle") not in _warned(findings)
    gpu4 = _sample(findings)["gpus"]["gpu4"]
    assert "hw_frac" not in gpu4
    if missed == "fields":
        assert "pcie_replay_rate" not in gpu4
    else:
        assert gpu4["pcie_replay_rate"] == pytest.approx(20 / 300, rel=1e-3)
    _five_minutes_ago(node)
    _nvml(node, _gpu4(180 * 10**9, 60))
    findings = _sweep(node)
    gpu4 = _sample(findings)["gpus"]["gpu4"]
    assert gpu4["hw_frac"] == pytest.approx(0.2, abs=1e-3)
    assert gpu4["pcie_replay_rate"] == pytest.approx(20 / 300, rel=1e-3)
    assert ("gpu4", "gpu_hw_throttle") not in _warned(findings)  # 20%: under the line


def test_an_hca_counter_garbled_one_run_gives_the_next_no_rate_and_no_error_sum(node):
    """mlx5_3/1 congested at 200,000 ticks/s with 0.04 symbol errors/s: both files garbled for
    one run, the next read 2x (400,000/s, and 0.08/s past the 0.07 warn line). Now: no wait
    rate and no error sum that run (a sum without its symbol errors would read 0), then the
    true rates."""
    port = "sys/class/infiniband/mlx5_3/ports/1/counters/"

    def counts(wait: str, symbols: str) -> None:
        node.write(port + "port_xmit_wait", wait + "\n")
        node.write(port + "symbol_error", symbols + "\n")

    counts("0", "0")
    _sweep(node)
    _five_minutes_ago(node)
    counts("not a number", "garbled")
    _sweep(node)
    _five_minutes_ago(node)
    counts(str(120_000_000), "24")
    (p,) = [p for p in _sample(_sweep(node))["ports"] if p["port"] == "mlx5_3/1"]
    assert "port_xmit_wait_rate" not in p and "error_rate" not in p
    _five_minutes_ago(node)
    counts(str(180_000_000), "36")
    (p,) = [p for p in _sample(_sweep(node))["ports"] if p["port"] == "mlx5_3/1"]
    assert p["port_xmit_wait_rate"] == pytest.approx(200_000, rel=0.01)
    assert p["error_rate"] == pytest.approx(0.04, rel=0.01)


def test_a_run_that_read_no_telemetry_keeps_the_baselines_for_the_next(node):
    """The family read nothing at all (its collect failed): its clock is not moved either, so
    the next run's rate is the rise over the whole time since, divided by that time."""
    _nvml(node, _gpu4(0, 0))
    _sweep(node)
    saved = json.loads((node.root / "var/lib/rsc_health/counters.json").read_text())
    merged = dict(saved["counters"])
    engine._forget_unread(merged, {"xid/other": 1}, ["telemetry"])
    assert merged == saved["counters"]
    engine._forget_unread(merged, {"tm/time_ms": 1}, ["telemetry"])
    assert [k for k in merged if k.startswith("tm/")] == ["tm/time_ms"]


# -- more ports than are read ---------------------------------------------------------------

def test_past_the_port_limit_the_physical_hcas_are_read_and_virtual_functions_left(node):
    """40 HCAs of 2 ports: in plain name order mlx5_10..mlx5_37 came before mlx5_4..mlx5_9, so
    configured HCAs mlx5_4-7 went unread and unjudged. Physical functions first, in natural
    order: the eight configured HCAs are read; what is left is the virtual functions', and
    it is said."""
    base = node.root / "sys/class/infiniband"
    for i in range(8, 40):
        shutil.copytree(base / "mlx5_0", base / f"mlx5_{i}", symlinks=True)
        (base / f"mlx5_{i}/device").mkdir(exist_ok=True)
        (base / f"mlx5_{i}/device/physfn").mkdir(exist_ok=True)  # an SR-IOV VF
    for hca in base.iterdir():
        if not (hca / "ports/2").exists():
            shutil.copytree(hca / "ports/1", hca / "ports/2", symlinks=True)
    findings = engine.run(node.config, node.root, only={"telemetry", "infiniband"},
                          save_state=False)
    names = [p["port"] for p in _sample(findings)["ports"]]
    assert len(names) == 64
    assert {f"mlx5_{i}/{p}" for i in range(8) for p in (1, 2)} <= set(names)
    assert names[:4] == ["mlx5_0/1", "mlx5_0/2", "mlx5_1/1", "mlx5_1/2"]
    assert "mlx5_9/1" in names and "mlx5_10/1" in names
    assert not [f for f in findings if f.code == "ib_missing"]
    said = [f.reason for f in findings if f.status is Status.ERROR]
    assert any("more than 64 ports: 16 not read" in r for r in said)


def test_natural_order_puts_nine_before_ten():
    from rsc_health.collect.ibports import natural

    names = ["mlx5_10", "mlx5_9", "mlx5_1", "ibp3s0", "mlx5_bond_0", "mlx5_2", "²"]
    assert sorted(names, key=natural) == ["ibp3s0", "mlx5_1", "mlx5_2", "mlx5_9", "mlx5_10",
                                          "mlx5_bond_0", "²"]


# -- readings no GPU gives, and a rate over no time ---------------------------------------

def test_readings_no_gpu_gives_are_absent_not_ratios():
    """0xFFFFFFFF as a maximum clock, a maximum PCIe width or a utilization, and power at
    thousands of times the limit: no ratio of 4e-7, no x4294967295 link, no busy GPU."""
    doc = _doc(busy=False)
    na = 0xFFFFFFFF
    devs = doc["devices"]
    devs[0]["telemetry"]["max_clocks"]["sm"] = na
    devs[1]["pcie"]["max_width"] = na
    devs[2]["telemetry"]["utilization"]["gpu"] = na
    devs[3]["telemetry"]["power_mw"] = na
    devs[4]["pcie"]["max_gen"] = na
    findings = telemetry.check(_state(doc, 1_000_000), CFG)
    gpus = _sample(findings)["gpus"]
    assert "sm_clock_ratio" not in gpus["gpu0"] and "mem_clock_ratio" in gpus["gpu0"]
    assert "pcie_link_ratio" not in gpus["gpu1"]
    assert gpus["gpu2"]["busy"] is False
    assert "power_ratio" not in gpus["gpu3"] and "power_ratio" in gpus["gpu5"]
    assert gpus["gpu4"]["pcie_link_ratio"] == 1.0  # the width alone, as for an idle GPU
    assert _warned(findings) == []


def test_a_minimum_interval_of_zero_is_refused_and_a_zero_interval_gives_no_rate(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text("[telemetry]\nmin_interval_s = 0\n")
    with pytest.raises(ConfigError, match="min_interval_s"):
        load_config(site)
    cfg = json.loads(json.dumps(CFG))
    cfg["telemetry"]["min_interval_s"] = 0  # a config that got past the check somehow
    first = _state(_doc(), 1_000_000)
    second = _state(_doc(), 1_000_000, _saved(first))
    assert telemetry.interval_s(second, cfg["telemetry"]) is None
    findings = telemetry.check(second, cfg)
    assert _sample(findings)["interval_s"] is None



def test_a_negative_temperature_is_a_garbled_answer_not_the_coldest_gpu():
    """NVML's temperature is unsigned: -40 is no GPU's (its coolant is at room temperature or
    above). It was taken, and the node reported the fleet's coldest sample."""
    doc = _doc(busy=False)
    doc["devices"][0]["temperature"] = -40
    doc["devices"][1]["temperature"] = 0
    gpus = _sample(telemetry.check(_state(doc, 1_000_000), CFG))["gpus"]
    assert "temp_c" not in gpus["gpu0"]
    assert gpus["gpu1"]["temp_c"] == 0.0 and gpus["gpu2"]["temp_c"] > 0
