"""Copies of a node fixture start with no node state, whatever was run against the fixture."""

from __future__ import annotations

from rsc_health import engine
from rsc_health.config import load_config
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node


def test_a_copy_leaves_behind_the_state_a_check_wrote_into_the_fixture(tmp_path):
    fixture = copy_node(tmp_path / "fixture")
    # What a sweep run against the fixture itself (--root) leaves there (`check` is read-only).
    engine.run(load_config(fixture / "config.toml"), fixture, save_state=True)
    written = sorted(p.name for p in (fixture / NODE_STATE).iterdir())
    assert "counters.json" in written

    copy = copy_node(tmp_path / "copy", fixture)

    assert not (copy / NODE_STATE).exists()
    assert (copy / "proc" / "mounts").read_text() == (fixture / "proc" / "mounts").read_text()
    assert (copy / "rsc_health" / "nvml.json").is_file()
