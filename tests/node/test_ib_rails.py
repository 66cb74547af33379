"""What the infiniband family judges as the fabric's rails: the InfiniBand ports of physical
functions, and every HCA that [infiniband] hcas names."""

from __future__ import annotations

import shutil

import pytest

from rsc_health.model import Level

from .conftest import bad

IB = "sys/class/infiniband"


def _unconfigured(node) -> None:
    """The packaged [infiniband] hcas = []: the fixture's site list of mlx5_0..mlx5_7 gone."""
    cfg = node.path("config.toml")
    cfg.write_text(cfg.read_text().replace(
        'hcas = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", '
        '"mlx5_7"]\n', ""))
    assert "hcas" not in cfg.read_text()


def _vf(node, name: str = "mlx5_8", state: str = "4: ACTIVE") -> None:
    """An SR-IOV virtual function's HCA (its device has a physfn), its port in `state`."""
    shutil.copytree(node.path(f"{IB}/mlx5_0"), node.path(f"{IB}/{name}"))
    node.write(f"{IB}/{name}/device/physfn/uevent", "PCI_SLOT_NAME=0000:18:00.0\n")
    node.write(f"{IB}/{name}/ports/1/state", state + "\n")


def _link_layer(node, layer: str) -> None:
    """The site config's [infiniband] link_layer."""
    cfg = node.path("config.toml")
    cfg.write_text(cfg.read_text().replace("[infiniband]\n",
                                           f'[infiniband]\nlink_layer = "{layer}"\n', 1))
    assert f'link_layer = "{layer}"' in cfg.read_text()


def test_ib_an_sriov_vf_port_left_down_does_not_drain_a_healthy_node(node):
    """SR-IOV on a ConnectX-7 in IB mode: a VF (mlx5_8, device/physfn present) whose vport
    policy is the default ("Down") shows `1: DOWN` / `5: LinkUp`. The node's 8 physical
    ports are all ACTIVE at 400. With the packaged [infiniband] hcas = [] the VF's port was
    judged like a rail: ib_down, drain now."""
    _unconfigured(node)
    _vf(node, state="1: DOWN")
    findings, verdict = node.check()
    found = [(f.component, f.code, f.severity.name) for f in bad(findings)
             if f.family == "infiniband"]
    assert found == [] and verdict.level < Level.DRAIN_AFTER_JOB, (found, verdict.level)


def test_ib_a_vf_port_does_not_stand_in_for_a_missing_rail_in_the_port_count(node):
    """[infiniband] count = 8 with hcas = []: mlx5_3 never came up this boot (a dead HCA),
    and SR-IOV made one VF (mlx5_8, physfn, policy Follow: ACTIVE). 7 physical ports + 1 VF
    made 8: the missing rail went unseen."""
    _unconfigured(node)
    cfg = node.path("config.toml")
    cfg.write_text(cfg.read_text().replace("[infiniband]\n", "[infiniband]\ncount = 8\n"))
    _vf(node)
    shutil.rmtree(node.path(f"{IB}/mlx5_3"))
    findings, verdict = node.check()
    codes = [(f.component, f.code) for f in bad(findings) if f.family == "infiniband"]
    assert ("hcas", "ib_missing") in codes, codes
    assert verdict.level is Level.DRAIN_NOW


def test_ib_a_vf_named_in_hcas_is_judged_as_a_rail(node):
    """An HCA the site lists is a rail whatever it is: a listed VF left DOWN drains."""
    _vf(node, state="1: DOWN")
    cfg = node.path("config.toml")
    cfg.write_text(cfg.read_text().replace('"mlx5_7"]', '"mlx5_7", "mlx5_8"]'))
    findings, verdict = node.check()
    assert ("mlx5_8/1", "ib_down") in [(f.component, f.code) for f in bad(findings)]
    assert verdict.level is Level.DRAIN_NOW


def test_ib_a_configured_rail_that_came_up_as_ethernet_is_not_judged_healthy(node):
    """[infiniband] hcas lists mlx5_0..mlx5_7 (the fixture's site config). After a firmware
    update reset a VPI card's LINK_TYPE_P1 to ETH, mlx5_3's port comes up with link_layer
    `Ethernet` (RoCE), ACTIVE at 400: the compute fabric has lost a rail. The HCA was
    "present" and its only port filtered out as not InfiniBand: nothing was said. An
    InfiniBand site says its rails must be InfiniBand ([infiniband] link_layer)."""
    _link_layer(node, "InfiniBand")
    node.write(f"{IB}/mlx5_3/ports/1/link_layer", "Ethernet\n")
    findings, verdict = node.check()
    found = [(f.component, f.code) for f in bad(findings) if f.family == "infiniband"]
    assert found == [("mlx5_3", "ib_missing")], found
    assert verdict.level is Level.DRAIN_NOW


def test_ib_an_ethernet_port_beside_an_infiniband_one_on_a_listed_hca_is_not_a_lost_rail(node):
    """A dual-port VPI card with port 2 in ETH mode (storage RoCE) still has its IB rail."""
    shutil.copytree(node.path(f"{IB}/mlx5_3/ports/1"), node.path(f"{IB}/mlx5_3/ports/2"))
    node.write(f"{IB}/mlx5_3/ports/2/link_layer", "Ethernet\n")
    node.write(f"{IB}/mlx5_3/ports/2/state", "1: DOWN\n")
    findings, verdict = node.check()
    assert [f for f in bad(findings) if f.family == "infiniband"] == []
    assert verdict.level < Level.DRAIN_AFTER_JOB


def test_ib_a_roce_site_listing_its_ethernet_rails_does_not_drain(node):
    """A RoCE fabric (ConnectX-7 in ETH mode by design: link_layer Ethernet on every rail)
    lists its 8 rail HCAs in [infiniband] hcas so that an HCA off the bus drains. With the
    packaged link_layer = "any" they are present, their Ethernet ports not judged as IB (the
    link layer said in an ok finding); before, each was ib_missing, drain now, on every node."""
    for i in range(8):
        node.write(f"{IB}/mlx5_{i}/ports/1/link_layer", "Ethernet\n")
    findings, verdict = node.check()
    found = [(f.component, f.code) for f in bad(findings) if f.family == "infiniband"]
    assert found == [] and verdict.level < Level.DRAIN_AFTER_JOB, found
    said = [f.reason for f in findings if f.family == "infiniband" and f.component == "mlx5_0"]
    assert said and "link layer Ethernet" in said[0], said


def test_ib_a_roce_site_still_drains_on_a_listed_hca_gone(node):
    """The RoCE site's reason to list its HCAs holds: one off the bus is ib_missing."""
    for i in range(8):
        node.write(f"{IB}/mlx5_{i}/ports/1/link_layer", "Ethernet\n")
    shutil.rmtree(node.path(f"{IB}/mlx5_5"))
    findings, verdict = node.check()
    found = [(f.component, f.code) for f in bad(findings) if f.family == "infiniband"]
    assert found == [("mlx5_5", "ib_missing")], found
    assert verdict.level is Level.DRAIN_NOW


def test_ib_link_layer_is_a_checked_choice(node):
    """A misspelt [infiniband] link_layer ("IB") is a config error, not silently "any"."""
    from rsc_health.config import ConfigError, load_config

    _link_layer(node, "IB")
    with pytest.raises(ConfigError, match="link_layer"):
        load_config(node.path("config.toml"))


@pytest.mark.parametrize("linked", [False, True], ids=["dirs", "sysfs-links"])
def test_ib_a_snapshot_of_an_sriov_host_replays_its_vf_as_no_rail(node, tmp_path, linked):
    """`healthctl snapshot` on an SR-IOV host whose VF (mlx5_8, device/physfn) is left DOWN
    by its vport policy, hcas = [] as packaged: the live check says OK (a VF is no rail). The
    snapshot carried only the port files, not device/physfn, so `check --from` it took the
    VF for a physical rail: ib_down, drain now, on replay of a healthy node."""
    import json

    from click.testing import CliRunner

    from rsc_health.cli import cli

    def invoke(*args):
        return CliRunner().invoke(
            cli, ["--root", str(node.root), "--config", str(node.root / "config.toml"), *args])

    _unconfigured(node)
    _vf(node, state="1: DOWN")
    if linked:
        # As the kernel lays it out: device and physfn are links into /sys/devices.
        import os

        shutil.rmtree(node.path(f"{IB}/mlx5_8/device"))
        node.write("sys/devices/pci0000:17/0000:18:00.0/uevent", "PCI_SLOT_NAME=0000:18:00.0\n")
        os.makedirs(node.path("sys/devices/pci0000:17/0000:18:00.2"))
        os.symlink("../0000:18:00.0", node.path("sys/devices/pci0000:17/0000:18:00.2/physfn"))
        os.symlink("../../../devices/pci0000:17/0000:18:00.2", node.path(f"{IB}/mlx5_8/device"))
        assert os.path.exists(node.path(f"{IB}/mlx5_8/device/physfn"))
    direct = json.loads(invoke("check", "--json", "--only", "infiniband").output)
    assert direct["verdict"]["level"] == "ok", direct["verdict"]
    snap = tmp_path / "snap.json"
    assert invoke("snapshot", "--out", str(snap)).exit_code == 0
    res = CliRunner().invoke(cli, ["check", "--from", str(snap), "--json", "--only",
                                   "infiniband"])
    replayed = json.loads(res.output)
    assert replayed["verdict"] == direct["verdict"], replayed["verdict"]
