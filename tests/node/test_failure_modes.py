"""One failure mode per test: copy `healthy`, break one thing, assert the exact finding and
the node's verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsc_health.collect import mounts
from rsc_health.model import Level, Severity, Status

from .conftest import bad

GPU3_PCI = "0000:5d:00"  # gpu3 in the healthy fixture (NVML bus id 00000000:5D:00.0)


def only_bad(node, **kw):
    findings, verdict = node.check(**kw)
    return bad(findings), verdict


def kmsg_xid(node, seq: int, text: str) -> None:
    node.append("dev/kmsg", f"3,{seq},36500000000,-;NVRM: Xid (PCI:{GPU3_PCI}): {text}\n")


XID_CASES = [
    (79, "79, pid=2814, name=python3, GPU has fallen off the bus.", Severity.DRAIN_NOW, True),
    (48, "48, pid=2814, name=python3, An uncorrectable double bit error (DBE) has been "
         "detected on GPU in the framebuffer at partition 6, subpartition 0.",
     Severity.DRAIN_NOW, True),
    (95, "95, pid=2814, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No",
     Severity.DRAIN_NOW, True),
    (64, "64, pid=2814, name=python3, Row Remapper Error: (0x00000005d28c03a0) - All "
         "reserved rows for bank are remapped", Severity.DRAIN_NOW, True),
    (74, "74, pid=2814, name=python3, NVLink: fatal error detected on link 4(0x0, 0x0, "
         "0x10000, 0x0, 0x0, 0x0, 0x0)", Severity.DRAIN_NOW, True),
    (119, "119, pid=2814, name=python3, Timeout after 6s of waiting for RPC response from "
          "GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
     Severity.DRAIN_NOW, True),
    (63, "63, pid=2814, name=python3, Row Remapping Event: Channel 0x1, Bank 0x4",
     Severity.DRAIN_AFTER_JOB, False),
    (94, "94, pid=2814, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
     Severity.DRAIN_AFTER_JOB, False),
]


@pytest.mark.parametrize(("xid", "text", "severity", "repair"), XID_CASES,
                         ids=[f"xid{c[0]}" for c in XID_CASES])
def test_xid_event_is_judged_by_the_catalog(node, xid, text, severity, repair):
    kmsg_xid(node, 1400, text)
    found, verdict = only_bad(node)
    assert len(found) == 1
    f = found[0]
    assert (f.family, f.component, f.code, f.severity, f.repair) == (
        "xid", "gpu3", f"xid{xid}", severity, repair)
    assert f.data["pid"] == "2814" and f.data["process"] == "python3"
    expected = Level.DRAIN_NOW if severity is Severity.DRAIN_NOW else Level.DRAIN_AFTER_JOB
    assert verdict.level is expected
    assert verdict.reason.startswith(
        f"rsc_health:{'now' if expected is Level.DRAIN_NOW else 'job'}:xid{xid}:gpu3 XID {xid}")


def test_xid79_drains_now_and_is_not_auto_resumable(node):
    kmsg_xid(node, 1400, "79, pid=2814, name=python3, GPU has fallen off the bus.")
    _, verdict = only_bad(node)
    assert verdict.level is Level.DRAIN_NOW and verdict.auto_resumable is False


def test_xid_counts_once_across_sweeps_and_again_after_reboot(node):
    kmsg_xid(node, 1400, "79, pid=2814, name=python3, GPU has fallen off the bus.")
    assert only_bad(node)[1].level is Level.DRAIN_NOW
    found, verdict = only_bad(node)  # judged once, then consumed by the cursor
    assert found == [] and verdict.level is Level.OK
    # Reboot: a new boot id and a fresh ring buffer whose sequence numbers restart low.
    node.write("proc/sys/kernel/random/boot_id", "0f3c5d7e-1111-4a2b-9c3d-5e6f7a8b9c0d\n")
    node.write("dev/kmsg", f"3,12,900000,-;NVRM: Xid (PCI:{GPU3_PCI}): 79, GPU has fallen "
                           "off the bus.\n")
    found, verdict = only_bad(node)
    assert [f.code for f in found] == ["xid79"] and verdict.level is Level.DRAIN_NOW


def test_application_xid13_only_warns_but_is_recorded(node):
    kmsg_xid(node, 1400, "13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
                         "(GPC 0, TPC 1, SM 0): Out Of Range Address")
    found, verdict = only_bad(node)
    assert [(f.code, f.status, f.severity) for f in found] == [
        ("xid13", Status.WARN, Severity.WARN)]
    assert found[0].data["pid"] == "<unknown>"
    assert verdict.level is Level.WARN


@pytest.mark.parametrize(("line", "severity"), [
    ("145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 "
     "0x00100000 0x00000004)", Severity.WARN),
    ("149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", Severity.DRAIN_NOW),
])
def test_nvlink5_xids_take_their_severity_from_the_line(node, line, severity):
    kmsg_xid(node, 1400, line)
    found, _ = only_bad(node)
    assert [f.severity for f in found] == [severity]


def test_uncorrectable_ecc_drains_now_for_repair(node):
    node.nvml(lambda d: d["devices"][5]["ecc"]["volatile"].update(uncorrected=2))
    found, verdict = only_bad(node)
    assert [(f.family, f.component, f.code, f.severity, f.repair) for f in found] == [
        ("ecc", "gpu5", "ecc_dbe", Severity.DRAIN_NOW, True)]
    assert verdict.reason == "rsc_health:now:ecc_dbe:gpu5 uncorrectable ECC errors: 2"


def test_row_remap_pending_drains_after_the_job_and_a_reset_clears_it(node):
    node.nvml(lambda d: d["devices"][2]["remapped_rows"].update(pending=True, correctable=1))
    found, verdict = only_bad(node)
    assert [(f.component, f.code, f.severity, f.repair) for f in found] == [
        ("gpu2", "remap_pending", Severity.DRAIN_AFTER_JOB, False)]
    assert verdict.level is Level.DRAIN_AFTER_JOB and verdict.auto_resumable


def test_row_remap_failure_drains_now(node):
    node.nvml(lambda d: d["devices"][2]["remapped_rows"].update(failure=True, uncorrectable=8))
    found, verdict = only_bad(node)
    assert [(f.component, f.code, f.severity, f.repair) for f in found] == [
        ("gpu2", "remap_failed", Severity.DRAIN_NOW, True)]
    assert verdict.level is Level.DRAIN_NOW and not verdict.auto_resumable


def test_nvlink_down_drains_now(node):
    node.nvml(lambda d: d["devices"][7]["nvlink"][11].update(state=0))
    found, verdict = only_bad(node)
    assert [(f.family, f.component, f.code, f.severity) for f in found] == [
        ("nvlink", "gpu7", "nvlink_down", Severity.DRAIN_NOW)]
    assert found[0].reason == "gpu7 17 of 18 NVLinks active (down: 11)"
    assert verdict.level is Level.DRAIN_NOW


def test_gpu_lost_in_nvml_drains_now(node):
    node.nvml(lambda d: d["devices"].__setitem__(4, {"index": 4,
                                                     "error": "NVML_ERROR_GPU_IS_LOST"}))
    found, verdict = only_bad(node)
    assert [(f.family, f.component, f.code) for f in found] == [("gpu", "gpu4", "gpu_lost")]
    assert verdict.level is Level.DRAIN_NOW


@pytest.mark.parametrize(("error", "code"), [("NVML_ERROR_LIBRARY_NOT_FOUND", "nvml_missing"),
                                             ("NVML_ERROR_DRIVER_NOT_LOADED",
                                              "driver_not_loaded")])
def test_nvml_unusable_drains_now(node, error, code):
    node.write("rsc_health/nvml.json", f'{{"error": "{error}"}}')
    found, verdict = only_bad(node)
    assert [(f.family, f.component, f.code) for f in found] == [("gpu", "nvml", code)]
    assert verdict.level is Level.DRAIN_NOW


def test_not_supported_fields_are_absent_not_failures(node):
    def edit(d):
        for dev in d["devices"]:
            dev["temperature"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
            dev["remapped_rows"] = {"error": "NVML_ERROR_NOT_SUPPORTED"}
    node.nvml(edit)
    found, verdict = only_bad(node)
    assert found == [] and verdict.level is Level.OK


def test_missing_gpu_drains_now(node):
    node.nvml(lambda d: (d["devices"].pop(), d.update(device_count=7)))
    found, _ = only_bad(node)
    assert [(f.component, f.code, f.reason) for f in found] == [
        ("gpus", "gpu_missing", "7 of 8 GPUs visible")]


def test_pcie_x16_downtrained_to_x8_drains_after_job(node):
    gpu = node.path("sys/bus/pci/devices/0000:9a:00.0")
    (gpu / "current_link_width").write_text("8\n")
    found, verdict = only_bad(node)
    assert [(f.family, f.component, f.code, f.severity, f.repair) for f in found] == [
        ("pcie", "0000:9a:00.0", "pcie_downtrained", Severity.DRAIN_AFTER_JOB, True)]
    assert found[0].reason == "0000:9a:00.0 (gpu) link x8, capable of x16"
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_aer_fatal_on_the_bridge_above_a_gpu_drains_now(node):
    aer = node.path("sys/bus/pci/devices/0000:99:00.0/aer_dev_fatal")  # switch port over gpu4
    aer.write_text(aer.read_text().replace("CmpltTO 0", "CmpltTO 1")
                   .replace("TOTAL_ERR_FATAL 0", "TOTAL_ERR_FATAL 1"))
    found, verdict = only_bad(node)
    assert [(f.component, f.code, f.severity, f.data["kind"]) for f in found] == [
        ("0000:99:00.0", "aer_fatal", Severity.DRAIN_NOW, "bridge")]
    assert verdict.level is Level.DRAIN_NOW


@pytest.mark.parametrize(("state", "phys"), [("1: DOWN", "3: Disabled"),
                                             ("1: DOWN", "2: Polling")])
def test_ib_port_down_or_polling_drains_now_and_may_auto_resume(node, state, phys):
    port = node.path("sys/class/infiniband/mlx5_6/ports/1")
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_text(phys + "\n")
    found, verdict = only_bad(node)
    assert [(f.component, f.code, f.severity, f.repair) for f in found] == [
        ("mlx5_6/1", "ib_down", Severity.DRAIN_NOW, False)]
    assert verdict.level is Level.DRAIN_NOW and verdict.auto_resumable


def test_ib_rate_200_instead_of_400_drains_after_job(node):
    node.write("sys/class/infiniband/mlx5_1/ports/1/rate", "200 Gb/sec (4X HDR)\n")
    found, verdict = only_bad(node)
    assert [(f.component, f.code, f.reason) for f in found] == [
        ("mlx5_1/1", "ib_rate", "mlx5_1/1 at 200 Gb/s, expected 400")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_symbol_errors_climbing_between_sweeps_drain_after_job(node):
    counter = node.path("sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error")
    counter.write_text("40\n")
    assert only_bad(node)[1].level is Level.OK  # first sweep: a baseline, not a verdict
    assert only_bad(node)[1].level is Level.OK  # unchanged
    counter.write_text("57\n")
    found, verdict = only_bad(node)
    assert [(f.component, f.code, f.data["delta"]) for f in found] == [
        ("mlx5_2/1", "ib_symbol_errors", 17)]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_counter_reset_by_reboot_counts_from_zero(node):
    counter = node.path("sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error")
    counter.write_text("500\n")
    node.check()
    node.write("proc/sys/kernel/random/boot_id", "0f3c5d7e-1111-4a2b-9c3d-5e6f7a8b9c0d\n")
    counter.write_text("0\n")
    assert only_bad(node)[1].level is Level.OK
    counter.write_text("13\n")  # over the default 10 per sweep
    assert [f.data["delta"] for f in only_bad(node)[0]] == [13]


def test_mount_missing_drains_now_and_may_auto_resume(node):
    mounts_file = node.path("proc/mounts")
    mounts_file.write_text("".join(
        line + "\n" for line in mounts_file.read_text().splitlines() if "/checkpoint" not in line
    ))
    found, verdict = only_bad(node)
    assert [(f.component, f.code, f.repair) for f in found] == [
        ("/checkpoint", "mount_missing", False)]
    assert verdict.level is Level.DRAIN_NOW and verdict.auto_resumable


def test_mount_read_only_drains_now(node):
    mounts_file = node.path("proc/mounts")
    mounts_file.write_text(mounts_file.read_text().replace(
        "/home nfs4 rw,", "/home nfs4 ro,"))
    found, _ = only_bad(node)
    assert [(f.component, f.code, f.reason) for f in found] == [
        ("/home", "mount_ro", "/home (nfs4) is read-only")]


def test_hung_mount_is_a_finding_not_a_hang(node, monkeypatch):
    import threading

    release = threading.Event()
    real = mounts.statvfs

    def statvfs(path):
        if path.endswith("/checkpoint"):
            release.wait(30)  # a Lustre server that never answers
        return real(path)

    monkeypatch.setattr(mounts, "statvfs", statvfs)
    cfg = node.config
    cfg.data["mounts"]["probe_timeout_s"] = 1.0  # ample for the live probes
    from rsc_health.engine import run
    from rsc_health.policy import decide

    findings = run(cfg, node.root)
    release.set()
    found = bad(findings)
    assert [(f.component, f.code, f.severity) for f in found] == [
        ("/checkpoint", "mount_hung", Severity.DRAIN_NOW)]
    assert decide(findings).level is Level.DRAIN_NOW


def test_collector_crash_is_a_checker_error_that_never_drains(node, monkeypatch):
    from rsc_health.checks import REGISTRY, state
    from rsc_health.record import replace  # Family is a node-side record

    def boom(root, env):
        raise RuntimeError("sysfs exploded")

    monkeypatch.setattr(state, "REGISTRY", tuple(
        replace(f, collect=boom) if f.name == "infiniband" else f for f in REGISTRY))
    found, verdict = only_bad(node)
    assert [(f.family, f.status) for f in found] == [("checker", Status.ERROR)]
    assert verdict.level is Level.CHECKER_ERROR and verdict.reason == ""


def test_an_unreadable_probe_record_is_a_checker_error_naming_it(node):
    node.write("rsc_health/mount_probes.json", '["not", "a mapping"]\n')
    cfg = node.path("config.toml")
    replay = 'probe_replay_file = "rsc_health/mount_probes.json"'
    text = cfg.read_text().replace("probe_timeout_s = 2.0", f"probe_timeout_s = 2.0\n{replay}")
    cfg.write_text(text)
    found, verdict = only_bad(node)
    assert [(f.family, f.status) for f in found] == [("checker", Status.ERROR)]
    assert "mount_probes.json" in found[0].reason
    assert verdict.level is Level.CHECKER_ERROR


def xid154(node, seq: int, to: str) -> None:
    kmsg_xid(node, seq, f"154, GPU recovery action changed from 0x0 (None) to {to}")


def test_xid154_gpu_reset_required_drains_now_and_waits_for_a_person(node):
    kmsg_xid(node, 1500, "119, pid=77, name=train.py, Timeout after 45s of waiting for RPC "
                         "response from GPU3 GSP! Expected function 76 (GSP_RM_CONTROL)")
    xid154(node, 1501, "0x1 (GPU Reset Required)")
    found, verdict = only_bad(node)
    reset = [f for f in found if f.code == "xid154"]
    assert [(f.component, f.severity, f.repair) for f in reset] == [
        ("gpu3", Severity.DRAIN_NOW, True)]
    assert reset[0].data["recovery_action"] == "gpu_reset"
    assert "to gpu reset" in reset[0].reason
    assert verdict.level is Level.DRAIN_NOW and not verdict.auto_resumable


@pytest.mark.parametrize(("to", "level"), [
    ("0x2 (Node Reboot Required)", Level.DRAIN_NOW),
    ("0x4 (Drain and Reset)", Level.DRAIN_NOW),
    ("0x3 (Drain P2P)", Level.DRAIN_AFTER_JOB),
    ("0x9 (Something Newer)", Level.DRAIN_AFTER_JOB),  # a value this release does not know
    ("0x0 (None)", Level.OK),
])
def test_xid154_acts_on_the_recovery_action_the_driver_names(node, to, level):
    xid154(node, 1500, to)
    assert node.check()[1].level is level


def test_xid154_back_to_none_after_a_reset_in_the_same_read_does_not_drain(node):
    xid154(node, 1500, "0x1 (GPU Reset Required)")
    kmsg_xid(node, 1501, "154, GPU recovery action changed from 0x1 (GPU Reset Required) to "
                         "0x0 (None)")
    found, verdict = only_bad(node)
    assert found == [] and verdict.level is Level.OK


def test_an_xid_storm_is_one_finding_with_a_count(node):
    for seq in range(1400, 1450):
        kmsg_xid(node, seq, "13, pid=77, name=train.py, Graphics SM Warp Exception on "
                            "(GPC 0, TPC 1, SM 0): Out Of Range Address")
    kmsg_xid(node, 1450, "79, pid=77, name=train.py, GPU has fallen off the bus.")
    found, verdict = only_bad(node)
    assert sorted((f.code, f.data["count"]) for f in found) == [("xid13", 50), ("xid79", 1)]
    assert verdict.causes[0].code == "xid79"


def test_a_healthy_ndr_port_counting_receive_errors_and_one_symbol_error_stays_in_service(node):
    """Real healthy NDR ports count receive errors and overruns under load; one symbol error
    since the last sweep is noise, not a cable to replace (issue 11)."""
    base = "sys/class/infiniband/mlx5_2/ports/1/counters/"
    node.check()
    for name, value in (("symbol_error", "1"), ("port_rcv_errors", "37"),
                        ("excessive_buffer_overrun_errors", "12"),
                        ("port_rcv_remote_physical_errors", "5"), ("port_xmit_discards", "400")):
        node.write(base + name, value + "\n")
    assert only_bad(node)[1].level is Level.OK


def test_a_nic_link_below_its_capable_speed_drains_after_job_and_a_gpu_link_does_not(node):
    import glob

    nic = node.path("sys/bus/pci/devices/0000:1a:00.0")
    (nic / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    gpus = [p for p in glob.glob(str(node.path("sys/bus/pci/devices/*")))
            if open(p + "/class").read().strip() == "0x030200"]
    with open(gpus[0] + "/current_link_speed", "w") as fh:  # idle GPU at Gen1
        fh.write("2.5 GT/s PCIe\n")
    found, verdict = only_bad(node)
    assert [(f.component, f.code) for f in found] == [("0000:1a:00.0", "pcie_speed")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_host_memory_errors_from_edac(node):
    """The `host` family (one file, one registry line): an uncorrectable host memory error
    drains now for a DIMM swap; corrected errors climbing fast drain after the job."""
    for mc in ("mc0", "mc1"):
        node.write(f"sys/devices/system/edac/mc/{mc}/ue_count", "0\n")
        node.write(f"sys/devices/system/edac/mc/{mc}/ce_count", "4\n")
    assert only_bad(node)[1].level is Level.OK
    node.write("sys/devices/system/edac/mc/mc1/ce_count", "900\n")
    found, verdict = only_bad(node)
    assert [(f.component, f.code) for f in found] == [("mc1", "edac_ce_rising")]
    node.write("sys/devices/system/edac/mc/mc0/ue_count", "1\n")
    found, verdict = only_bad(node)
    assert [(f.component, f.code) for f in found] == [("mc0", "edac_ue")]
    assert verdict.level is Level.DRAIN_NOW
    node.write("sys/devices/system/edac/mc/mc0/ue_count", "garbage\n")
    assert only_bad(node)[1].level is Level.CHECKER_ERROR


@pytest.mark.parametrize("flags", [{"failure": {"error": "NVML_ERROR_UNKNOWN"}},
                                   {"pending": {"error": "NVML_ERROR_TIMEOUT"}},
                                   {"failure": "0"}, {"pending": float("nan")}],
                         ids=["failure_error", "pending_error", "failure_text", "pending_nan"])
def test_a_remap_flag_nvml_did_not_answer_is_a_checker_error_not_a_drain(node, flags):
    """An NVML error answer (or a value that is not 0/1) in a row-remap flag was truthy, so it
    drained the node now for remap_failed (a repair code) or after the job."""
    node.nvml(lambda d: d["devices"][2]["remapped_rows"].update(flags))
    found, verdict = only_bad(node)
    assert not [f for f in found if f.family == "remap"]
    assert verdict.level is Level.CHECKER_ERROR


def _automount(node, line_after: str | None):
    """/home behind autofs (a direct map), not mounted yet: the table shows autofs's trigger
    on /home. statvfs there makes the kernel mount it (LOOKUP_AUTOMOUNT), which the probe's
    statvfs stands in for here by adding `line_after` to the table (None: the automount
    fails, the server refuses)."""
    import errno

    mounts_file = node.path("proc/mounts")
    lines = mounts_file.read_text().splitlines()
    nfs = next(line for line in lines if " /home nfs4 " in line)
    mounts_file.write_text("".join(
        (("auto.home /home autofs rw,relatime,fd=7,pgrp=1,timeout=300,minproto=5,"
          "maxproto=5,direct 0 0") if line == nfs else line) + "\n" for line in lines))
    real = mounts.statvfs

    def statvfs(path):
        if path.endswith("/home"):
            if line_after is None:
                raise OSError(errno.ENOENT, "No such file or directory")
            with open(mounts_file, "a") as fh:
                fh.write(line_after.replace("{nfs}", nfs) + "\n")
        return real(path)

    return statvfs


def test_an_automounted_path_not_mounted_yet_is_mounted_by_the_probe_and_passes(
        node, monkeypatch):
    """autofs unmounts an idle /home after its timeout: between jobs the table shows only
    its trigger (fstype autofs). That was mount_missing, DRAIN_NOW, on every idle node of a
    fleet that automounts. The probe's statvfs mounts it; the table read after it judges."""
    monkeypatch.setattr(mounts, "statvfs", _automount(node, "{nfs}"))
    found, verdict = only_bad(node)
    assert found == [] and verdict.level is Level.OK


def test_an_automount_that_fails_still_drains(node, monkeypatch):
    monkeypatch.setattr(mounts, "statvfs", _automount(node, None))
    found, verdict = only_bad(node)
    assert [(f.component, f.code) for f in found] == [("/home", "mount_missing")]
    assert "autofs" in found[0].reason and verdict.level is Level.DRAIN_NOW


def test_a_statvfs_child_that_dies_is_a_checker_error_not_a_hung_mount(node, monkeypatch):
    """The statvfs child is killed (the OOM killer, a crash in a FUSE library) before it
    answers. It was read as every mount hung: mount_hung, a drain-now, and a hang recorded
    toward the next run. Nothing waits in the kernel: it is the checker's error, no drain."""
    import os
    import signal

    from rsc_health.engine import run
    from rsc_health.policy import decide

    def statvfs(path):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(mounts, "statvfs", statvfs)
    findings = run(node.config, node.root)
    found = bad(findings)
    assert found and all(f.family == "checker" and f.status is Status.ERROR for f in found)
    assert not any(f.code == "mount_hung" for f in findings)
    assert any("killed by signal 9" in f.reason for f in found)
    assert decide(findings).level is Level.CHECKER_ERROR


def test_a_hung_mount_and_a_hung_ib_read_are_waited_for_together_not_one_after_the_other(
        node, monkeypatch):
    """The statvfs child started only after the IB wait: a node whose IB counter read and a
    mount both hang paid [infiniband] read_timeout_s and then [mounts] probe_timeout_s (7.3 s
    of the prolog's 12 s at the defaults). Every abandonable child starts before any wait."""
    import threading
    import time

    from rsc_health.collect import ibports
    from rsc_health.engine import run

    release = threading.Event()
    real = mounts.statvfs

    def statvfs(path):
        if path.endswith("/checkpoint"):
            release.wait(30)
        return real(path)

    monkeypatch.setattr(mounts, "statvfs", statvfs)
    monkeypatch.setattr(ibports, "_asker", lambda root, names: lambda emit: time.sleep(30))
    cfg = node.config
    cfg.data["mounts"]["probe_timeout_s"] = 1.5
    cfg.data["infiniband"]["read_timeout_s"] = 1.5
    t0 = time.monotonic()
    findings = run(cfg, node.root)
    took = time.monotonic() - t0
    release.set()
    codes = {f.code for f in findings}
    assert {"mount_hung", "ib_hung"} <= codes
    assert took < 2.6, f"{took:.1f}s: the waits did not overlap (3.0 s and more one after another)"


def _check_on_a_hung_mount(node, monkeypatch):
    import threading

    from rsc_health.engine import run

    release = threading.Event()
    real = mounts.statvfs
    monkeypatch.setattr(mounts, "statvfs",
                        lambda p: release.wait(30) if p.endswith("/checkpoint") else real(p))
    cfg = node.config
    cfg.data["mounts"]["probe_timeout_s"] = 0.5
    findings = run(cfg, node.root, only={"mount"}, save_state=False)
    release.set()
    assert "mount_hung" in {f.code for f in findings}


def test_a_check_keeps_its_hang_record_only_where_no_symlink_leads(node, monkeypatch, tmp_path):
    """`healthctl check --root DIR` keeps its own record of the children it abandoned; a state
    directory reached through a symlink (planted in a tree someone else controls) gets none:
    root never writes where the tree's owner points. The same tree without it keeps one."""
    from rsc_health.config import state_dir
    from rsc_health.engine import CHECK_HANGS_FILE

    sdir = Path(state_dir(node.config, node.root))
    sdir.mkdir(parents=True, exist_ok=True)
    _check_on_a_hung_mount(node, monkeypatch)
    assert (sdir / CHECK_HANGS_FILE).exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for p in sdir.iterdir():
        p.unlink()
    sdir.rmdir()
    sdir.symlink_to(elsewhere)
    _check_on_a_hung_mount(node, monkeypatch)
    assert not (elsewhere / CHECK_HANGS_FILE).exists()
