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


def test_a_hung_mount_in_a_snapshot_replays_as_hung(node, tmp_path, monkeypatch):
    import threading

    from rsc_health.collect import mounts

    release = threading.Event()
    real = mounts.statvfs

    def statvfs(path):
        if path.endswith("/checkpoint"):
            release.wait(30)  # the Lustre server on the captured node never answers
        return real(path)

    cfg = node.root / "config.toml"
    cfg.write_text(cfg.read_text().replace("probe_timeout_s = 2.0", "probe_timeout_s = 0.5"))
    snap = tmp_path / "snap.json"
    monkeypatch.setattr(mounts, "statvfs", statvfs)
    assert invoke(node, "snapshot", "--out", str(snap)).exit_code == 0
    release.set()
    monkeypatch.setattr(mounts, "statvfs", real)  # the machine replaying it answers at once
    assert json.loads(snap.read_text())["mount_probes"]["/checkpoint"]["hung"] is True

    res = CliRunner().invoke(cli, ["check", "--from", str(snap), "--json", "--only", "mount"])

    assert res.exit_code == 3, res.output
    found = [(f["component"], f["code"]) for f in json.loads(res.output)["findings"]
             if f["status"] != "ok"]
    assert found == [("/checkpoint", "mount_hung")]


def test_a_snapshot_without_probe_records_still_replays(node, tmp_path):
    snap = tmp_path / "snap.json"
    assert invoke(node, "snapshot", "--out", str(snap)).exit_code == 0
    doc = json.loads(snap.read_text())
    del doc["mount_probes"]  # written before probes were recorded
    snap.write_text(json.dumps(doc))
    res = CliRunner().invoke(cli, ["check", "--from", str(snap), "--only", "mount"])
    assert res.exit_code == 0, res.output


def test_snapshot_records_the_node_s_name_not_the_root_directory(node, tmp_path, monkeypatch):
    """A loop over the PCI bridges reused the name `node`: every snapshot of a node with a
    GPU recorded its root directory as the node's name."""
    monkeypatch.setenv("SLURMD_NODENAME", "gpu042")
    snap = tmp_path / "snap.json"
    assert invoke(node, "snapshot", "--out", str(snap)).exit_code == 0
    doc = json.loads(snap.read_text())
    assert doc["links"], "the fixture has PCI devices: the loop that shadowed the name ran"
    assert doc["node"] == "gpu042"


def test_a_snapshot_carries_no_database_password(node, tmp_path):
    cfg = node.root / "config.toml"
    cfg.write_text(cfg.read_text() + '\n[historian]\nurl = "postgresql://rsc:hunter2@db/rsc"\n')
    snap = tmp_path / "snap.json"
    assert invoke(node, "snapshot", "--out", str(snap)).exit_code == 0
    assert "hunter2" not in snap.read_text()
    assert json.loads(snap.read_text())["config"]["historian"]["url"] == "postgresql://rsc:***@db/rsc"
    assert CliRunner().invoke(cli, ["check", "--from", str(snap)]).exit_code == 0


def test_a_fifo_at_a_state_files_name_never_holds_the_snapshot(node, tmp_path):
    """The snapshot carries the node's state files (XID cursor, counter baselines); they were
    read with read_text: a FIFO at one's name held `healthctl snapshot` for ever (and a
    symlink to /dev/zero would have read until memory ran out). Now read_bounded, as every
    other file the snapshot carries: that file is left out, the rest is written."""
    import os
    import subprocess
    import sys

    from tests.fixtures.nodes.node_copy import NODE_STATE

    assert invoke(node, "check").exit_code == 0
    state = node.root / NODE_STATE
    state.mkdir(parents=True, exist_ok=True)
    (state / "counters.json").write_text('{"boot_id": "b", "counters": {}}')
    os.mkfifo(state / "xid_cursor.json")
    snap = tmp_path / "snap.json"

    done = subprocess.run(
        [sys.executable, "-m", "rsc_health.cli", "--root", str(node.root), "--config",
         str(node.root / "config.toml"), "snapshot", "--out", str(snap)],
        capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    state_files = json.loads(snap.read_text())["state"]
    assert "xid_cursor.json" not in state_files and "counters.json" in state_files
