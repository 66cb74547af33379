"""A family's check that raises is a checker error and the other families are still judged
(engine). Before, the run then saved that family's cursor all the same: the XIDs it read and
never judged were consumed, and the XID 79 behind the failure was never seen again. Here the
failure found was the xid family meeting a bus id NVML answered as a number (a garbled answer
the gpu family reads as a value); the kernel log is now read past it only once it was judged,
and such a bus id no longer stops the check."""

from __future__ import annotations

from rsc_health.engine import run

from .conftest import bad

XID79 = ("3,1400,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off "
         "the bus.\n")


def test_an_xid_check_that_fails_consumes_no_xid(node, monkeypatch):
    from rsc_health import checks

    node.append("dev/kmsg", XID79)
    real = checks.CHECKS["xid"]

    def broken(state, cfg):
        raise RuntimeError("a bug in the check")

    monkeypatch.setitem(checks.CHECKS, "xid", broken)
    findings = run(node.config, node.root, only={"xid"})
    assert [f.code for f in bad(findings)] == ["xid_error"]
    monkeypatch.setitem(checks.CHECKS, "xid", real)
    findings, verdict = node.check(only={"xid"})
    assert [f.code for f in bad(findings)] == ["xid79"] and verdict.drains


def test_a_bus_id_nvml_answered_as_a_number_does_not_stop_an_xid_79(node):
    """What made the xid check fail: the bus id compared as text. The XID is judged by the
    address its line names; the GPU's index is only a better name for it."""
    node.append("dev/kmsg", XID79)
    node.nvml(lambda d: d["devices"][0].update(pci_bus_id=12345))
    findings = run(node.config, node.root, only={"xid", "gpu"})
    assert "xid79" in [f.code for f in findings]
    assert "xid_error" not in [f.code for f in findings]


def test_counters_read_by_a_check_that_failed_keep_their_baseline(node, monkeypatch):
    from rsc_health import checks

    counter = node.path("sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error")
    counter.write_text("40\n")
    node.check(only={"infiniband"})  # the baseline
    counter.write_text("57\n")
    real = checks.CHECKS["infiniband"]

    def broken(state, cfg):
        raise RuntimeError("a bug in the check")

    monkeypatch.setitem(checks.CHECKS, "infiniband", broken)
    findings, _ = node.check(only={"infiniband"})
    assert [f.code for f in bad(findings)] == ["infiniband_error"]
    monkeypatch.setitem(checks.CHECKS, "infiniband", real)
    findings, _ = node.check(only={"infiniband"})
    assert [(f.code, f.data["delta"]) for f in bad(findings)] == [("ib_symbol_errors", 17)]
