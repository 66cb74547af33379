"""`healthctl sim` writes the files and honours its options over the [sim] defaults."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.sim import FILES


def test_sim_command_writes_every_file_with_the_requested_rate_and_lemons(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "sim", "--nodes", "16", "--days", "5", "--seed", "2", "--out", str(out), "--rf", "50",
        "--lemon-share", "0.125", "--json", "--no-progress",
    ], env={"RSC_HEALTH_CONFIG": "/dev/null"})
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["nodes"] == 16 and summary["lemons"] == 2 and summary["jobs"] > 100
    assert all((out / name).is_file() for name in FILES)
    truth = json.loads((out / "truth.json").read_text())
    assert truth["rf_per_node_day"] == 0.05 and len(truth["lemon_nodes"]) == 2
    assert summary["failures"] == len(truth["failures"])


def test_sim_command_text_summary_names_the_files(tmp_path):
    result = CliRunner().invoke(
        cli, ["sim", "--nodes", "4", "--days", "1", "--out", str(tmp_path), "--no-progress"],
        env={"RSC_HEALTH_CONFIG": "/dev/null"},
    )
    assert result.exit_code == 0, result.output
    assert "simulated 4 nodes x 1 days" in result.output
    assert "sacct.txt" in result.output and "truth.json" in result.output


def test_default_config_sim_section_lists_every_key_with_the_code_default():
    from dataclasses import asdict

    from rsc_health.config import load_config
    from rsc_health.sim import SimConfig

    section = load_config("/dev/null").section("sim")
    assert set(section) == set(asdict(SimConfig()))
    assert asdict(SimConfig.from_mapping(section)) == asdict(SimConfig())
