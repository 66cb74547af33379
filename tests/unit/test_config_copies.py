"""A config hands out copies of its trees (a node's view, a packaged default): changing one
never changes the config it came from, whatever the value holds. The copier walks TOML's
tables and arrays itself (no copy/weakref imports at every job start) and deep-copies
anything else a caller put in."""

from __future__ import annotations

import datetime

from rsc_health.config import Config, load_config, packaged_default


def test_a_node_view_is_a_copy_whose_nested_tables_and_lists_are_its_own(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nprolog_families = ["gpu", "xid"]\n'
                    '[nodes."gpu-a*".gpu]\ncount = 4\n')
    cfg = load_config(site)
    view = cfg.for_node("gpu-a01")
    assert view.get("gpu.count") == 4 and cfg.get("gpu.count") == 0
    view.data["slurm"]["prolog_families"].append("sxid")
    view.data["gpu"]["count"] = 99
    assert cfg.get("slurm.prolog_families") == ["gpu", "xid"]
    assert cfg.for_node("gpu-a01").get("gpu.count") == 4


def test_a_packaged_default_handed_out_twice_is_two_copies():
    first = packaged_default("slurm")
    first["prolog_families"].clear()
    assert packaged_default("slurm")["prolog_families"]


def test_leaves_are_kept_and_values_toml_cannot_hold_are_deep_copied():
    when = datetime.datetime(2026, 11, 26, 21, 0, tzinfo=datetime.UTC)
    odd = {"pairs": ({1, 2}, [3])}
    cfg = Config({"x": {"when": when, "odd": odd, "n": None, "f": 1.5}}, None, {})
    view = cfg.for_node("n1").data["x"]
    assert view["when"] == when and view["n"] is None and view["f"] == 1.5
    assert view["odd"] == odd
    view["odd"]["pairs"][0].add(9)
    view["odd"]["pairs"][1].append(9)
    assert odd == {"pairs": ({1, 2}, [3])}


def test_a_config_given_up_takes_the_node_view_in_its_own_tables_with_the_same_values(
        tmp_path):
    """The node path's job start gives its freshly loaded config up (for_node(given_up=True)):
    no copy of the whole tree, the same view a copy gives, and the overrides stay the
    config's own."""
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nprolog_families = ["gpu", "xid"]\n'
                    '[nodes."gpu-a*".gpu]\ncount = 4\n'
                    '[nodes."gpu-a*".slurm]\nprolog_families = ["gpu"]\n')
    copied = load_config(site).for_node("gpu-a01", "p1")
    cfg = load_config(site)
    tables = cfg.data
    view = cfg.for_node("gpu-a01", "p1", given_up=True)
    assert view.data is tables and view.data == copied.data
    assert view.get("gpu.count") == 4 and view.get("slurm.prolog_families") == ["gpu"]
    view.data["slurm"]["prolog_families"].append("sxid")
    assert cfg.overrides["nodes"]["gpu-a*"]["slurm"]["prolog_families"] == ["gpu"]
    assert load_config(site).for_node("gpu-b01").get("gpu.count") == 0
