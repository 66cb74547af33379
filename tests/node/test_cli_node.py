"""`healthctl check` and `healthctl snapshot` through the real CLI."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsc_health.cli import cli


def invoke(node, *args):
    return CliRunner().invoke(
        cli, ["--root", str(node.root), "--config", str(node.root / "config.toml"), *args]
    )


def test_check_table_and_exit_code_ok(node):
    res = invoke(node, "check")
    assert res.exit_code == 0
    assert res.output.splitlines()[-1] == "verdict: OK (exit 0)"


def test_check_json_schema_and_drain_exit_code(node):
    node.write("sys/class/infiniband/mlx5_3/ports/1/state", "1: DOWN\n")
    res = invoke(node, "check", "--json", "--only", "infiniband")
    assert res.exit_code == 3
    doc = json.loads(res.output)
    assert doc["schema"] == "rsc_health.check/1"
    assert doc["verdict"] == {"level": "drain_now", "exit_code": 3, "auto_resumable": True,
                              "reason": "rsc_health:now:ib_down:mlx5_3/1 port DOWN/LinkUp"}
    assert {f["family"] for f in doc["findings"]} == {"infiniband"}
    assert set(doc["findings"][0]) == {"family", "component", "status", "severity", "reason",
                                       "code", "repair", "data"}


def test_snapshot_replays_to_the_same_findings_elsewhere(node, tmp_path):
    node.nvml(lambda d: d["devices"][1]["remapped_rows"].update(failure=True))
    node.write("sys/bus/pci/devices/0000:1a:00.0/current_link_width", "4\n")
    direct = json.loads(invoke(node, "check", "--json").output)
    snap = tmp_path / "snap.json"
    assert invoke(node, "snapshot", "--out", str(snap)).exit_code == 0
    res = CliRunner().invoke(cli, ["check", "--from", str(snap), "--json"])
    assert res.exit_code == 3
    replayed = json.loads(res.output)

    def key(doc):
        return sorted((f["family"], f["component"], f["code"], f["status"])
                      for f in doc["findings"])

    assert key(replayed) == key(direct)
    assert replayed["verdict"]["reason"] == direct["verdict"]["reason"]


def test_broken_config_is_a_checker_error_exit_4_and_names_the_file(tmp_path):
    from click.testing import CliRunner

    from rsc_health.cli import cli

    bad = tmp_path / "config.toml"
    bad.write_text("[gpu\ncount = 8\n")
    result = CliRunner().invoke(cli, ["--config", str(bad), "check", "--root", str(tmp_path)])
    assert result.exit_code == 4
    assert str(bad) in result.output and "not valid TOML" in result.output
