"""InfiniBand PortCounters saturate: the IB spec has them stop at all ones, and the kernel's
sysfs shows them at their PMA width (drivers/infiniband/core/sysfs.c PORT_PMA_ATTR:
symbol_error 16 bits, link_downed and link_error_recovery 8, local_link_integrity_errors and
excessive_buffer_overrun_errors 4, port_xmit_wait 32). A counter held at its maximum shows a
delta of 0 every sweep whatever the link does: a port whose symbol errors climbed for weeks
was silently judged clean for ever after, and its congestion or error rate read as the best of
its job's peers. A saturated counter is now said (a checker error naming the counter and how
to clear it), and its rate is absent, never 0."""

from __future__ import annotations

from rsc_health import engine
from rsc_health.checks import infiniband
from rsc_health.model import Level, Status

from .conftest import bad

PORT = "sys/class/infiniband/mlx5_2/ports/1/counters"


def test_a_symbol_error_counter_stuck_at_its_16_bit_maximum_is_said_not_judged_clean(node):
    counter = node.path(f"{PORT}/symbol_error")
    counter.write_text("65535\n")
    node.check()  # the baseline
    findings, verdict = node.check()
    found = [(f.component, f.status, f.reason) for f in bad(findings)]
    assert len(found) == 1, found
    comp, status, reason = found[0]
    assert (comp, status) == ("mlx5_2/1", Status.ERROR)
    assert "symbol_error" in reason and "65535" in reason and "perfquery" in reason
    assert verdict.level is Level.CHECKER_ERROR


def test_a_counter_that_climbs_into_saturation_still_drains_on_what_it_counted(node):
    counter = node.path(f"{PORT}/symbol_error")
    counter.write_text("65000\n")
    node.check()
    counter.write_text("65535\n")  # +535 counted, then it stopped
    findings, verdict = node.check()
    codes = sorted(f.code for f in bad(findings) if f.code)
    assert "ib_symbol_errors" in codes
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_4_bit_counter_at_15_is_saturated_a_16_bit_one_at_15_is_not():
    assert infiniband.saturated("local_link_integrity_errors", 15)
    assert infiniband.saturated("excessive_buffer_overrun_errors", 15)
    assert not infiniband.saturated("symbol_error", 15)
    assert infiniband.saturated("link_downed", 255)
    assert not infiniband.saturated("port_xmit_discards", 65534)
    assert infiniband.saturated("port_xmit_wait", 2**32 - 1)
    # The data counters may be 64-bit (PortCountersExtended): never judged saturated.
    assert not infiniband.saturated("port_xmit_data", 2**32 - 1)
    assert not infiniband.saturated("no_such_counter", 2**64 - 1)


def test_a_saturated_xmit_wait_gives_no_congestion_rate_never_zero(node):
    """Two sweeps five minutes apart; mlx5_2/1's port_xmit_wait held at its 32-bit maximum
    (the most congested port of the node, stopped counting) has no rate; mlx5_4/1's real
    climb is the node's worst."""
    import json

    wait = node.path(f"{PORT}/port_xmit_wait")
    wait.write_text(f"{2**32 - 1}\n")
    cfg = node.config
    engine.run(cfg, node.root, only={"telemetry"})
    saved = node.root / "var/lib/rsc_health/counters.json"
    state = json.loads(saved.read_text())
    state["counters"]["tm/time_ms"] -= 300_000
    saved.write_text(json.dumps(state))
    node.write("sys/class/infiniband/mlx5_4/ports/1/counters/port_xmit_wait", "30000000\n")
    findings = engine.run(cfg, node.root, only={"telemetry"}, save_state=False)
    (sample,) = [f.data for f in findings if "ports" in f.data]
    (mine,) = [p for p in sample["ports"] if p["port"] == "mlx5_2/1"]
    assert "port_xmit_wait_rate" not in mine
    others = [p for p in sample["ports"] if p["port"] != "mlx5_2/1"]
    assert others and all("port_xmit_wait_rate" in p for p in others)
    assert sample["metrics"]["ib_xmit_wait_rate"]["component"] == "mlx5_4/1"
