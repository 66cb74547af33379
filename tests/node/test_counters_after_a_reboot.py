"""Counter baselines across a reboot, whichever stage runs first after it (helper-204's
attack, and the rest of its class): a run that does not judge a family keeps no baseline of
it for the new boot, and the first run that judges it sees its whole value since boot."""

from __future__ import annotations

import json

import pytest

from rsc_health import checks, nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import node01_slurm

NEW_BOOT = "99999999-8888-7777-6666-555555555555\n"


def _nvlink_errors_since_boot(root):
    p = root / "rsc_health/nvml.json"
    doc = json.loads(p.read_text())
    doc["devices"][0]["nvlink"][0]["crc_flit"] = 5000
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize("first", ["sweep", "prolog"])
def test_nvlink_errors_since_a_reboot_are_judged_whoever_runs_first_after_it(
        node_env, monkeypatch, first):  # noqa: F811
    """A sweep takes baselines. The node reboots (new boot id); a flaky NVLink logs 5000
    CRC errors from boot on. The module's rule: a changed boot id means the counters were
    reset, the errors since then are the current value. With the sweep first after the
    boot it drains (nvlink_errors). With a job's prolog first (jobs start the moment the
    node is back; the sweep is on a 5-minute timer) the prolog, which does not judge
    nvlink, stores 5000 as the new boot's baseline and the sweep after it sees +0: the
    link's errors are never judged, and the node keeps taking jobs."""
    root = node_env
    slurm = node01_slurm()
    monkeypatch.delenv("SLURM_JOB_ID")
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    (root / "proc/sys/kernel/random/boot_id").write_text(NEW_BOOT)
    _nvlink_errors_since_boot(root)
    if first == "prolog":
        monkeypatch.setenv("SLURM_JOB_ID", "5001")
        nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm)
        monkeypatch.delenv("SLURM_JOB_ID")
    slurm.calls.clear()
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    assert any(c[0] == "drain" and "nvlink_errors" in c[2] for c in slurm.calls), slurm.calls


EDAC_UE = "sys/devices/system/edac/mc/mc0/ue_count"


@pytest.mark.parametrize("first", ["sweep", "prolog"])
def test_a_host_memory_ue_after_a_reboot_is_judged_whoever_runs_first_after_it(
        node_env, monkeypatch, first):  # noqa: F811
    """Same with the host family (counters_own: the prolog does not read EDAC at all). The
    prolog after the reboot writes counters.json for the new boot without any edac/ key, so
    the first sweep has no baseline for mc0 and takes the uncorrectable error the DIMM
    logged since boot as its baseline: edac_ue (drain now, repair) is never said."""
    root = node_env
    slurm = node01_slurm()
    monkeypatch.delenv("SLURM_JOB_ID")
    assert (root / EDAC_UE).read_text().strip() == "0"
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    (root / "proc/sys/kernel/random/boot_id").write_text(NEW_BOOT)
    if first == "prolog":
        monkeypatch.setenv("SLURM_JOB_ID", "5001")
        nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm)
        monkeypatch.delenv("SLURM_JOB_ID")
    (root / EDAC_UE).write_text("1\n")  # a UE the node survived, a minute into the boot
    slurm.calls.clear()
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    assert any(c[0] == "drain" and "edac_ue" in c[2] for c in slurm.calls), slurm.calls


def _prolog(monkeypatch, slurm, job="5001", stage="prolog"):
    monkeypatch.setenv("SLURM_JOB_ID", job)
    nodepath.run_stage(stage, slurm_factory=lambda c, d: slurm)
    monkeypatch.delenv("SLURM_JOB_ID")


def _sweep(slurm):
    slurm.calls.clear()
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    return slurm.calls


def _reboot(root, monkeypatch, slurm):
    monkeypatch.delenv("SLURM_JOB_ID")
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    (root / "proc/sys/kernel/random/boot_id").write_text(NEW_BOOT)


AER = "sys/devices/pci0000:b7/0000:b7:01.0/aer_dev_nonfatal"


def test_pcie_aer_errors_after_a_reboot_are_judged_when_a_job_started_first(
        node_env, monkeypatch):  # noqa: F811
    """PCIe AER counters come from the pcie family's own read, which no job start runs: the
    prolog's file for the new boot must not leave them to the sweep as a first baseline."""
    root, slurm = node_env, node01_slurm()
    _reboot(root, monkeypatch, slurm)
    _prolog(monkeypatch, slurm)
    text = (root / AER).read_text().replace("TOTAL_ERR_NONFATAL 0", "TOTAL_ERR_NONFATAL 3")
    (root / AER).write_text(text)
    calls = _sweep(slurm)
    assert any(c[0] == "drain" and "aer_nonfatal" in c[2] for c in calls), calls


def test_job_starts_and_ends_before_the_first_sweep_all_leave_the_since_boot_rise(
        node_env, monkeypatch):  # noqa: F811
    """Several jobs start and end before the timer's first sweep of the boot: each run keeps
    the record of what no run of this boot has judged yet, and writes nothing when it is the
    same (a quiet job start pays no write)."""
    root, slurm = node_env, node01_slurm()
    _reboot(root, monkeypatch, slurm)
    _nvlink_errors_since_boot(root)
    _prolog(monkeypatch, slurm, "5001")
    path = root / NODE_STATE / "counters.json"
    saved = json.loads(path.read_text())
    assert saved["unjudged"] == ["host", "nvlink", "pcie"], saved
    assert not any(k.startswith(("nvlink/", "edac/", "aer/", "pcie_replay/"))
                   for k in saved["counters"]), saved
    _prolog(monkeypatch, slurm, "5001", stage="epilog")
    _prolog(monkeypatch, slurm, "5002")
    assert json.loads(path.read_text()) == saved
    calls = _sweep(slurm)
    assert any(c[0] == "drain" and "nvlink_errors" in c[2] for c in calls), calls
    assert "unjudged" not in json.loads(path.read_text())  # judged whole once: baselines now


def test_a_check_that_fails_on_the_first_sweep_after_a_reboot_keeps_no_baseline(
        node_env, monkeypatch):  # noqa: F811
    """A family whose check raised judged nothing it read: on a new boot there is no
    earlier baseline to keep, and the values it read are not one either (the next sweep
    would see +0): the next run that judges it sees the whole rise since boot."""
    root, slurm = node_env, node01_slurm()
    _reboot(root, monkeypatch, slurm)
    _nvlink_errors_since_boot(root)

    def broken(state, cfg):
        raise RuntimeError("bug")

    real = checks.CHECKS["nvlink"]
    monkeypatch.setitem(checks.CHECKS, "nvlink", broken)
    _sweep(slurm)
    monkeypatch.setitem(checks.CHECKS, "nvlink", real)
    calls = _sweep(slurm)
    assert any(c[0] == "drain" and "nvlink_errors" in c[2] for c in calls), calls


def test_a_sweep_first_after_a_reboot_leaves_no_record_of_unjudged_counters(
        node_env, monkeypatch):  # noqa: F811
    """The sweep runs every family: it judges every since-boot rise itself."""
    root, slurm = node_env, node01_slurm()
    _reboot(root, monkeypatch, slurm)
    _sweep(slurm)
    saved = json.loads((root / NODE_STATE / "counters.json").read_text())
    assert "unjudged" not in saved and any(k.startswith("nvlink/") for k in saved["counters"])


def test_the_record_of_unjudged_families_is_read_as_safely_as_the_counters(tmp_path):
    """A garbled "unjudged" costs nothing but itself; a file without one (every file written
    before it) reads as before."""
    from rsc_health.collect import counters

    path = tmp_path / "counters.json"
    path.write_text(json.dumps({"boot_id": "b", "counters": {"a": 1}, "unjudged": "nvlink"}))
    assert counters.load(path) == {"boot_id": "b", "counters": {"a": 1}}
    path.write_text(json.dumps({"boot_id": "b", "counters": {}, "unjudged": [1, "nvlink"]}))
    assert counters.load(path)["unjudged"] == ["nvlink"]
    counters.save(path, {"a": 1}, "b")
    assert json.loads(path.read_text()) == {"boot_id": "b", "counters": {"a": 1}}
