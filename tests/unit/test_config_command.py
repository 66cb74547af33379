"""`healthctl config check | show`: a typo is visible, and one node's effective config prints."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsc_health.cli import cli


def test_config_check_names_the_file_and_key_and_exits_4(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text("[gpu]\ncuont = 8\n")
    result = CliRunner().invoke(cli, ["--config", str(site), "config", "check"])
    assert result.exit_code == 4
    assert "[gpu] cuont" in result.output and str(site) in result.output
    site.write_text('[gpu]\ncount = 8\n[nodes."gpu0*".gpu]\ncount = 4\n')
    ok = CliRunner().invoke(cli, ["--config", str(site), "config", "check"])
    assert ok.exit_code == 0 and "1 node override" in ok.output


def test_config_show_prints_one_nodes_effective_config(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text('[gpu]\ncount = 8\n[nodes."gpu0*".gpu]\ncount = 4\n'
                    '[partitions.big.slurm]\nprolog_budget_s = 20\n')
    out = CliRunner().invoke(cli, ["--config", str(site), "config", "show", "--node", "gpu007",
                                   "--partition", "big"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["node"] == "gpu007" and doc["config"]["gpu"]["count"] == 4
    assert doc["config"]["slurm"]["prolog_budget_s"] == 20
    other = json.loads(CliRunner().invoke(cli, ["--config", str(site), "config", "show",
                                                "--node", "cpu1", "--section", "gpu"]).output)
    assert list(other["config"]) == ["gpu"] and other["config"]["gpu"]["count"] == 8


def test_a_misspelt_family_in_prolog_families_fails_config_check_with_a_did_you_mean(tmp_path):
    """`infiniban` passed config check and silently dropped the InfiniBand check from every
    prolog (issue 21)."""
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nprolog_families = ["gpu", "xid", "infiniban"]\n')
    result = CliRunner().invoke(cli, ["--config", str(site), "config", "check"])
    assert result.exit_code == 4, result.output
    assert str(site) in result.output and "[slurm] prolog_families" in result.output
    assert "'infiniban'" in result.output and "did you mean 'infiniband'?" in result.output
    site.write_text('[partitions.big.slurm]\nepilog_families = ["gpu", "ecc", "remapp"]\n')
    result = CliRunner().invoke(cli, ["--config", str(site), "config", "check"])
    assert result.exit_code == 4 and "[partitions.big] [slurm] epilog_families" in result.output
    assert "did you mean 'remap'?" in result.output
    site.write_text('[slurm]\nprolog_families = ["gpu", "site", "host"]\n')
    assert CliRunner().invoke(cli, ["--config", str(site), "config", "check"]).exit_code == 0
