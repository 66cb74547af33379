"""InfiniBand PortCounters saturate: the IB spec has them stop at all ones, and the kernel's
sysfs shows them at their PMA width (drivers/infiniband/core/sysfs.c PORT_PMA_ATTR:
symbol_error 16 bits, link_downed and link_error_recovery 8, local_link_integrity_errors and
excessive_buffer_overrun_errors 4, port_xmit_wait 32). A counter held at its maximum shows a
delta of 0 every sweep whatever the link does: a port whose symbol errors climbed for weeks
was silently judged clean for ever after, and its congestion or error rate read as the best of
its job's peers. A saturated counter is now said (a warning naming the counter and how to
clear it), and its rate is absent, never 0."""

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
    assert (comp, status) == ("mlx5_2/1", Status.WARN)
    assert "symbol_error" in reason and "65535" in reason and "perfquery" in reason
    # A warning: the clean sweeps an auto-resume waits for still count.
    assert verdict.level is Level.WARN


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


# -- an HCA that vanishes between sweeps ------------------------------------------------------

IB = "sys/class/infiniband"


def _unconfigured(node) -> None:
    """The packaged defaults: no [infiniband] hcas list, no port count."""
    cfg = node.path("config.toml")
    cfg.write_text(cfg.read_text().replace(
        'hcas = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", '
        '"mlx5_7"]\n', ""))
    assert "hcas" not in cfg.read_text()


def _missing(node):
    findings, verdict = node.check()
    return [(f.code, f.reason) for f in bad(findings) if f.code == "ib_missing"], verdict


def test_an_hca_that_falls_off_the_bus_mid_boot_drains_though_none_was_configured(node):
    """[infiniband] hcas = [] and count = 0 (the defaults): an HCA gone from sysfs between two
    sweeps took its ports and their checks with it, and the node stayed in service without a
    rail. Now fewer physical ports than this boot has seen at once drain it (ib_missing, as a
    configured HCA missing does), every sweep until it is back or the node reboots."""
    import shutil

    _unconfigured(node)
    assert _missing(node)[0] == []
    shutil.rmtree(node.path(f"{IB}/mlx5_3"))
    for _ in range(2):  # said again at the next sweep: the high-water mark is kept
        found, verdict = _missing(node)
        assert len(found) == 1 and "7 of the 8" in found[0][1] and "mlx5_3/1" in found[0][1]
        assert verdict.level is Level.DRAIN_NOW
    node.write("proc/sys/kernel/random/boot_id", "0f3c5d7e-1111-4a2b-9c3d-5e6f7a8b9c0d\n")
    assert _missing(node)[0] == []  # a new boot: what it has is what it has


def test_a_renamed_hca_or_a_virtual_function_removed_is_no_loss(node):
    import shutil

    _unconfigured(node)
    _missing(node)
    node.path(f"{IB}/mlx5_3").rename(node.path(f"{IB}/mlx5_9"))  # a driver rebind's new name
    assert _missing(node)[0] == []
    shutil.copytree(node.path(f"{IB}/mlx5_0"), node.path(f"{IB}/mlx5_10"))
    node.write(f"{IB}/mlx5_10/device/physfn/uevent", "PCI_SLOT_NAME=0000:18:00.0\n")
    assert _missing(node)[0] == []
    shutil.rmtree(node.path(f"{IB}/mlx5_10"))  # SR-IOV VFs come and go at will
    assert _missing(node)[0] == []
