"""A GPU the driver declares lost, as the driver prints it (NVIDIA open-gpu-kernel-modules):

  osHandleGpuLost(pGpu, bEmitXid) logs `Xid 79` only when bEmitXid, and always its own
  NV_DEV_PRINTF line: "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." On Blackwell a
  SEC_FAULT lockdown logs `Xid 110` ("SEC_FAULT: <field>", SEC_FAULT_ERROR in nverror.h),
  then calls osHandleGpuLost(pGpu, NV_FALSE): the GPU "is as good as lost" until a cold reset,
  and no Xid 79 is printed.

Only `NVRM: Xid` lines were read and XID 110 was not in the catalog (an unknown XID only
warns): a node whose GPU the driver had shut down kept taking jobs."""

from __future__ import annotations

from rsc_health.collect import kmsg
from rsc_health.engine import run
from rsc_health.model import Level, Status
from rsc_health.policy import decide

LOST = "3,800,5000000,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."
SERIAL = "3,801,5000001,-;NVRM: GPU 0000:3b:00.0: GPU serial number is 1654922006536."
SEC_FAULT = ("3,799,4999999,-;NVRM: Xid (PCI:0000:3b:00): 110, pid='<unknown>', "
             "name=<unknown>, SEC_FAULT: _FSP_L5_WDT")
XID79 = ("3,798,4999998,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.")


def _xid(node, *records: str):
    node.write("dev/kmsg", "".join(r + "\n" for r in records))
    findings = run(node.config, node.root, only={"xid"}, save_state=False)
    return [f for f in findings if f.family == "xid" and f.status is not Status.OK], \
        decide(findings)


def test_a_gpu_lost_without_its_xid_line_drains_the_node(node):
    bad, verdict = _xid(node, LOST, SERIAL)
    assert [(f.code, f.data["pci"]) for f in bad] == [("xid79", "0000:3b:00")]
    assert verdict.level is Level.DRAIN_NOW and bad[0].repair


def test_a_security_fault_lockdown_drains_now_for_repair(node):
    bad, verdict = _xid(node, SEC_FAULT, LOST, SERIAL)
    assert sorted(f.code for f in bad) == ["xid110", "xid79"]
    assert verdict.level is Level.DRAIN_NOW
    assert next(f for f in bad if f.code == "xid110").repair


def test_an_xid79_and_the_drivers_lost_line_are_one_event(node):
    bad, _ = _xid(node, XID79, LOST, SERIAL)
    assert [(f.code, f.data["count"]) for f in bad] == [("xid79", 1)]


def test_a_lost_line_another_program_logged_is_not_an_event():
    assert kmsg.parse_line("Nov 27 10:00:00 gpu042 alice: NVRM: GPU 0000:3b:00.0: GPU has "
                           "fallen off the bus.") is None
    ev = kmsg.parse_line("Nov 27 10:00:00 gpu042 kernel: [ 812.1] NVRM: GPU 0000:3b:00.0: "
                         "GPU has fallen off the bus.")
    assert ev is not None and (ev.xid, ev.pci) == (79, "0000:3b:00")


# A GPU the driver could not initialise (NVIDIA open-gpu-kernel-modules: RmInitAdapter's failure
# banner, NV_DEV_PRINTF, then rm_init_adapter's line; both again on each open while it fails).
# NVML still counts it and answers its handle NVML_ERROR_UNKNOWN; no Xid line is printed.
INIT_FAILED = ("3,9001,912345678,-;NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! "
               "(0x62:0x55:2385)")
INIT_MINOR = ("3,9002,912345690,-;NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor "
              "number 3")


def test_a_gpu_the_driver_failed_to_initialise_drains_the_node_for_repair(node):
    # Only Xid lines and "fallen off the bus" were read: the node kept taking jobs.
    bad, verdict = _xid(node, INIT_FAILED, INIT_MINOR)
    assert [(f.code, f.component, f.data["count"]) for f in bad] == [
        ("gpu_init_failed", "0000:3b:00", 2)]
    assert verdict.level is Level.DRAIN_AFTER_JOB and bad[0].repair


def test_an_init_failure_is_named_by_the_gpu_nvml_gives_that_bus_id(node):
    # The kernel's "0000:3a:00.0" is NVML's "00000000:3A:00.0": gpu2.
    bad, _ = _xid(node, INIT_FAILED.replace("3b:00", "3a:00"))
    assert [(f.code, f.component) for f in bad] == [("gpu_init_failed", "gpu2")]


def test_an_init_failure_is_judged_once_not_again_on_every_sweep(node):
    node.write("dev/kmsg", INIT_FAILED + "\n")
    first = run(node.config, node.root, only={"xid"}, sweep=True)
    again = run(node.config, node.root, only={"xid"}, sweep=True)
    assert "gpu_init_failed" in [f.code for f in first]
    assert decide(again).level is Level.OK


def test_init_failure_lines_another_program_logged_or_the_drivers_detail_are_not_events():
    line = "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1227)"
    assert kmsg.parse_line(f"Apr 17 10:23:33 gpu042 alice: {line}") is None
    assert kmsg.parse_line("3,5,6,-;NVRM: RmInitAdapter: osInitNvMapping failed, bailing out "
                           "of RmInitAdapter") is None
    ev = kmsg.parse_line(f"Apr 17 10:23:33 gpu042 kernel: {line.replace('3b', '3B')}")
    assert ev is not None and (ev.xid, ev.pci) == (kmsg.INIT_FAILED_XID, "0000:3b:00")
