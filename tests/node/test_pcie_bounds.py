"""PCIe widths and speeds the kernel never prints are the checker's problem, never a drain."""

from __future__ import annotations

import pytest

from rsc_health.model import Level, Status

from .conftest import bad

GPU = "sys/bus/pci/devices/0000:9a:00.0"
NIC = "sys/bus/pci/devices/0000:1a:00.0"


@pytest.mark.parametrize(("where", "attr", "text"), [
    (GPU, "current_link_width", "-4"),
    (GPU, "current_link_width", "1e30"),
    (GPU, "current_link_width", "x8junk"),
    (GPU, "current_link_width", "7"),
    (GPU, "max_link_width", "99999999999999999999"),
    (NIC, "current_link_speed", "1e30 GT/s PCIe"),
    (NIC, "max_link_speed", "99.0 GT/s PCIe"),
    (NIC, "current_link_speed", "-4 GT/s"),
])
def test_an_impossible_pcie_width_or_speed_is_a_checker_error_not_a_drain(node, where, attr,
                                                                          text):
    """`-4` and `1e30` as a GPU's link width drained it (issue 21: parse_int read 1e30 as x1)."""
    node.write(f"{where}/{attr}", text + "\n")
    findings, verdict = node.check()
    found = bad(findings)
    assert [(f.family, f.status, f.component) for f in found] == [
        ("checker", Status.ERROR, where.rsplit("/", 1)[1])], found
    assert attr in found[0].reason and repr(text) in found[0].reason
    assert verdict.level is Level.CHECKER_ERROR


@pytest.mark.parametrize(("attr", "text"), [("current_link_width", "8"),
                                            ("current_link_speed", "16 GT/s")])
def test_the_kernel_s_own_formats_are_still_judged(node, attr, text):
    node.write(f"{NIC}/{attr}", text + "\n")
    found = bad(node.check()[0])
    assert [f.code for f in found] == ["pcie_downtrained" if "width" in attr else "pcie_speed"]


def test_an_unknown_speed_says_nothing(node):
    node.write(f"{NIC}/current_link_speed", "Unknown\n")
    assert bad(node.check()[0]) == []
