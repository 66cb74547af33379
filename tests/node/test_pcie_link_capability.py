"""A PCIe link is judged against what both its ends can do, not the card's own capability:
the kernel's max_link_* is one device's Link Capabilities, and a link trains to the lesser."""

from __future__ import annotations

import pytest

from rsc_health.model import Level, Severity

from .conftest import bad

SWITCH_PORT = "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:02.0"  # above the HCA
HCA = f"{SWITCH_PORT}/0000:1a:00.0"  # ConnectX-7 (class 0x020700), Gen5 x16
GPU_PORT = "sys/devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0"
GPU = f"{GPU_PORT}/0000:9a:00.0"


def _drains(found):
    return [(f.component, f.code) for f in bad(found) if f.severity >= Severity.DRAIN_AFTER_JOB]


@pytest.mark.parametrize("attr,port_max,now", [
    ("speed", "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
    ("width", "8", "8"),
], ids=["gen5_nic_under_gen4_port", "x16_nic_in_x8_slot"])
def test_nic_at_the_best_its_upstream_port_allows_is_not_drained(node, attr, port_max, now):
    """A Gen5 ConnectX-7 under a Gen4 port, or a x16 card in a slot wired x8, was drained for
    repair for ever (tester h1): it trains at the best its link can ever do."""
    cur, mx = f"current_link_{attr}", f"max_link_{attr}"
    node.write(f"{SWITCH_PORT}/{mx}", port_max + "\n")
    node.write(f"{SWITCH_PORT}/{cur}", now + "\n")
    node.write(f"{HCA}/{cur}", now + "\n")  # the HCA keeps its own max (32 GT/s, x16)
    found, verdict = node.check(only={"pcie"})
    assert _drains(found) == []
    assert verdict.level < Level.DRAIN_AFTER_JOB


def test_an_x8_card_in_an_x16_slot_drains_neither_the_card_nor_the_port(node):
    node.write(f"{GPU}/max_link_width", "8\n")
    node.write(f"{GPU}/current_link_width", "8\n")
    node.write(f"{GPU_PORT}/current_link_width", "8\n")  # the port's x16, at its card's x8
    found, verdict = node.check(only={"pcie"})
    assert _drains(found) == []
    assert verdict.level is Level.OK


@pytest.mark.parametrize("attr,now,code", [
    ("speed", "16.0 GT/s PCIe", "pcie_speed"),
    ("width", "8", "pcie_downtrained"),
], ids=["gen5_nic_under_gen5_port_at_gen4", "x16_nic_in_x16_slot_at_x8"])
def test_a_link_below_what_both_its_ends_can_do_still_drains(node, attr, now, code):
    """Both ends Gen5 x16 (the fixture's): a link trained below that is a bad riser or slot."""
    node.write(f"{SWITCH_PORT}/current_link_{attr}", now + "\n")
    node.write(f"{HCA}/current_link_{attr}", now + "\n")
    found, verdict = node.check(only={"pcie"})
    drains = _drains(found)
    assert ("0000:1a:00.0", code) in drains
    assert verdict.level is Level.DRAIN_AFTER_JOB
    hca = next(f for f in bad(found) if f.component == "0000:1a:00.0")
    assert hca.repair and "capable of " + ("32" if attr == "speed" else "x16") in hca.reason


@pytest.mark.parametrize("attr,port_max", [("speed", "Unknown"), ("speed", "Unknown speed"),
                                           ("width", None)],
                         ids=["speed_unknown", "speed_unknown_old", "width_missing"])
def test_a_port_whose_capability_is_unknown_leaves_the_card_s_own(node, attr, port_max):
    """A port that does not say what it can do limits nothing: the card's own capability."""
    if port_max is None:
        node.path(f"{SWITCH_PORT}/max_link_{attr}").unlink()
    else:
        node.write(f"{SWITCH_PORT}/max_link_{attr}", port_max + "\n")
    now = "16.0 GT/s PCIe" if attr == "speed" else "8"
    node.write(f"{HCA}/current_link_{attr}", now + "\n")
    found, verdict = node.check(only={"pcie"})
    assert ("0000:1a:00.0", "pcie_speed" if attr == "speed" else "pcie_downtrained") in \
        _drains(found)
    assert verdict.level is Level.DRAIN_AFTER_JOB
