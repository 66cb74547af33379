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
