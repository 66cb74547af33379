"""Copies of a node fixture start with no node state, whatever was run against the fixture."""

from __future__ import annotations

from click.testing import CliRunner

from rsc_health.cli import cli
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node


def test_a_copy_leaves_behind_the_state_a_check_wrote_into_the_fixture(tmp_path):
    fixture = copy_node(tmp_path / "fixture")
    # What `healthctl --root tests/fixtures/nodes/healthy check` does to the fixture itself.
    result = CliRunner().invoke(
        cli, ["--root", str(fixture), "--config", str(fixture / "config.toml"), "check"]
    )
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (fixture / NODE_STATE).iterdir())
    assert "counters.json" in written

    copy = copy_node(tmp_path / "copy", fixture)

    assert not (copy / NODE_STATE).exists()
    assert (copy / "proc" / "mounts").read_text() == (fixture / "proc" / "mounts").read_text()
    assert (copy / "rsc_health" / "nvml.json").is_file()
