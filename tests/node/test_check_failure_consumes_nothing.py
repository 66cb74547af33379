"""A family's check that raises is a checker error and the other families are still judged
(engine). Before, the run then saved that family's cursor all the same: the XIDs it read and
never judged were consumed, and the XID 79 behind the failure was never seen again. Here the
failure is the xid family meeting a bus id NVML answered as a number (a garbled answer the gpu
family reads as a value); the kernel log is read past it only once it was judged."""

from __future__ import annotations

from rsc_health.engine import run

from .conftest import bad

XID79 = ("3,1400,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off "
         "the bus.\n")


def test_an_xid_check_that_fails_consumes_no_xid(node):
    node.append("dev/kmsg", XID79)
    good = node.path("rsc_health/nvml.json").read_text()
    node.nvml(lambda d: d["devices"][0].update(pci_bus_id=12345))
    findings = run(node.config, node.root, only={"xid", "gpu"})
    assert [f.code for f in findings if f.family == "checker"] == ["xid_error"]
    assert not [f for f in findings if f.code == "xid79"]
    node.path("rsc_health/nvml.json").write_text(good)  # NVML answers right again
    findings, verdict = node.check(only={"xid"})
    assert [f.code for f in bad(findings)] == ["xid79"] and verdict.drains


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
