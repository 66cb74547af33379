"""`healthctl check --from SNAPSHOT` promises to judge "new since the last sweep" exactly as
the node did (commands/node.py _local_state): the snapshot carries counters.json. Since the
baselines keep the CLOCK_MONOTONIC time of the node's sweep (time_ms/<family>), the replay
measures the span from the node's boot clock to the *replaying* host's boot clock: on a
management host up longer than the node, a burst of corrected ECC errors the node drains on
replays as a rise "over the last N days", judged against N days of the per-sweep limit."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rsc_health.checks import state as checks_state
from rsc_health.cli import cli


def invoke(node, *args):
    return CliRunner().invoke(
        cli, ["--root", str(node.root), "--config", str(node.root / "config.toml"), *args])


def codes(doc):
    return {f["code"] for f in doc["findings"] if f["status"] != "ok"}


def test_a_replayed_snapshot_judges_an_ecc_burst_as_the_node_did(node, tmp_path, monkeypatch):
    node.check(sweep=True)  # the node's sweep: baselines and their time on record
    node.nvml(lambda d: d["devices"][0]["ecc"]["volatile"].update(corrected=5000))
    direct = json.loads(invoke(node, "check", "--json").output)
    assert "ecc_sbe_rising" in codes(direct)  # 5000 > 1000 a sweep: the node drains
    snap = tmp_path / "snap.json"
    assert invoke(node, "snapshot", "--out", str(snap)).exit_code == 0
    # Replayed on a management host that has been up 30 days (its CLOCK_MONOTONIC).
    monkeypatch.setattr(checks_state, "_now_ms", lambda: 30 * 86_400_000)
    res = CliRunner().invoke(cli, ["check", "--from", str(snap), "--json"])
    replayed = json.loads(res.output)
    assert "ecc_sbe_rising" in codes(replayed), [
        f["reason"] for f in replayed["findings"] if f["family"] == "ecc"][:2]
