"""Counters judged against the previous sweep, missing hardware, and the time budget."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from rsc_health.collect import mounts
from rsc_health.engine import run
from rsc_health.model import Level, Severity

from .conftest import bad


@pytest.mark.parametrize("gap_s", [0.0, 1.1], ids=["at_once", "a_second_apart"])
def test_nvlink_crc_errors_rising_between_sweeps_drain_after_job(node, gap_s):
    node.check()  # baseline
    time.sleep(gap_s)
    node.nvml(lambda d: d["devices"][6]["nvlink"][3].update(crc_flit=12))
    found, verdict = node.check()
    # The nvlink family's judgement only: when the two runs are a second or more apart (a
    # loaded machine), telemetry also turns the rise into a rate and warns (gpu_nvlink_errors,
    # tests/node/test_telemetry_links_memory.py); under a second it has no interval.
    assert [(f.component, f.code, f.data["rising"]) for f in bad(found)
            if f.family == "nvlink"] == [("gpu6", "nvlink_errors", {"3/crc_flit": 12})]
    assert {f.family for f in bad(found)} <= {"nvlink", "telemetry"}
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_aggregate_uncorrectable_ecc_rising_drains_now_even_after_volatile_reset(node):
    node.check()
    node.nvml(lambda d: d["devices"][0]["ecc"]["aggregate"].update(uncorrected=1))
    found, verdict = node.check()
    assert [(f.component, f.code) for f in bad(found)] == [("gpu0", "ecc_dbe")]
    assert verdict.level is Level.DRAIN_NOW


def test_missing_hca_drains_now(node):
    shutil.rmtree(node.path("sys/class/infiniband/mlx5_7"))
    found, verdict = node.check(only={"infiniband"})
    assert [(f.component, f.code, f.severity) for f in bad(found)] == [
        ("mlx5_7", "ib_missing", Severity.DRAIN_NOW)]


def test_budget_bounds_a_hung_mount_and_overrun_is_reported(node, monkeypatch):
    release = threading.Event()
    real_statvfs, real_finish = mounts.statvfs, mounts.finish
    timeouts = []
    monkeypatch.setattr(mounts, "statvfs",
                        lambda p: release.wait(30) if p.endswith("/home") else real_statvfs(p))
    monkeypatch.setattr(mounts, "finish",
                        lambda probing, t: timeouts.append(t) or real_finish(probing, t))
    findings = run(node.config, node.root, only={"mount"}, budget_s=3.0)
    release.set()
    assert timeouts == [1.5]  # half the budget, not the config's 2 s
    assert [(f.component, f.code) for f in bad(findings)] == [("/home", "mount_hung")]
    over = run(node.config, node.root, only={"mount"}, budget_s=0.0)
    # With no budget left the probes get 0.05 s (a forked child may need more: then they are
    # reported hung too); the overrun itself is always a checker finding.
    assert "checker" in [f.family for f in bad(over)]
    assert {f.family for f in bad(over)} <= {"checker", "mount"}


def test_partial_run_keeps_the_other_families_baselines(node):
    counter = node.path("sys/class/infiniband/mlx5_0/ports/1/counters/link_downed")
    node.check()
    node.check(only={"mount"})
    counter.write_text("1\n")
    found, _ = node.check(only={"infiniband"})
    assert [f.code for f in bad(found)] == ["ib_link_downed"]


def test_gpu_pcie_replays_rising_past_the_limit_drain_after_job(node):
    node.check()
    node.nvml(lambda d: d["devices"][3]["pcie"].update(replay=100))
    assert bad(node.check()[0]) == []  # within replays_per_sweep
    node.nvml(lambda d: d["devices"][3]["pcie"].update(replay=350))
    found, verdict = node.check()
    assert [(f.component, f.code, f.data["delta"]) for f in bad(found)] == [
        ("gpu3", "pcie_replay", 250)]
    assert verdict.level is Level.DRAIN_AFTER_JOB


IB = "sys/class/infiniband/mlx5_2/ports/1/counters/"
# No hardware counter holds these: beyond 64 bits, not a decimal, not ASCII digits.
GARBAGE = ["1" + "0" * 30, str(2**64), "5" * 400, "1e30", "7junk", "\u0661\u0662\u0663"]


@pytest.mark.parametrize("value", GARBAGE, ids=["1e30_digits", "2^64", "400_digits", "1e30",
                                              "7junk", "arabic_indic"])
def test_a_garbage_ib_counter_is_a_checker_error_not_a_drain_and_hides_no_later_rise(
        node, value):
    node.write(IB + "link_downed", "0\n")  # limit 0: any real increase drains after the job
    node.check()
    node.write(IB + "link_downed", value + "\n")
    found, verdict = node.check()
    assert not [f for f in found if f.code == "ib_link_downed"]
    assert verdict.level is Level.CHECKER_ERROR
    node.write(IB + "link_downed", "2\n")  # a real rise after the garbage read still counts
    found, verdict = node.check()
    assert [(f.code, f.data["delta"]) for f in bad(found)] == [("ib_link_downed", 2)]


@pytest.mark.parametrize(("path", "text"), [
    ("sys/devices/system/edac/mc/mc0/ue_count", str(2**64)),
    ("sys/bus/pci/devices/0000:99:00.0/aer_dev_fatal", f"TOTAL_ERR_FATAL {10**30}"),
])
def test_a_host_or_aer_count_beyond_64_bits_never_drains(node, path, text):
    node.write("sys/devices/system/edac/mc/mc0/ce_count", "0\n")
    node.write("sys/devices/system/edac/mc/mc0/ue_count", "0\n")
    node.check()
    node.write(path, text + "\n")
    found, verdict = node.check()
    assert verdict.level is Level.CHECKER_ERROR, [f.reason for f in bad(found)]


@pytest.mark.parametrize("edit", [
    lambda d: d["devices"][1]["ecc"]["aggregate"].update(uncorrected=2**64 - 1),
    lambda d: d["devices"][1]["ecc"]["volatile"].update(uncorrected=True),
    lambda d: d["devices"][1]["ecc"]["volatile"].update(uncorrected=10**30),
    lambda d: d["devices"][1]["pcie"].update(replay=10**30),
    lambda d: d["devices"][1]["nvlink"][2].update(crc_flit=2**64),
], ids=["aggregate_2^64-1", "volatile_true", "volatile_1e30", "replay_1e30", "crc_2^64"])
def test_an_nvml_count_no_gpu_can_hold_is_a_checker_error_not_a_drain(node, edit):
    node.check()
    node.nvml(edit)
    found, verdict = node.check()
    assert verdict.level is Level.CHECKER_ERROR, [f.reason for f in bad(found)]
