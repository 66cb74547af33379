"""[qualify] baseline is what a node is judged by while its GPU model has fewer than
min_peers passes: numbers a user could write would let a slow node pass qualification and go
back into service. Like the site config that names it, the file must be root's (or this
user's), writable by no one else, on a path no one else can swap, and a regular file (a FIFO
there hung `qualify run` for ever before any test). Before, any of these was read and obeyed."""

from __future__ import annotations

import json
import os
import threading

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from tests.unit.test_qualify_run import Node

CONFIG = """
[qualify]
full = ["nccl"]
min_peers = 4
tier_budget_s = 60
baseline = "{baseline}"
[qualify.tests.nccl]
plugin = "nccl_tests"
command = ["all_reduce_perf", "-g", "8"]
timeout_s = 10
"""
# What a user would write: the fleet's all_reduce bus bandwidth a tenth of what it is.
LOW = {"nccl-bw/allreduce_8589934592_busbw": 23.1}


def _setup(tmp_path, baseline):
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG.format(baseline=baseline))
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    return cfg, db


def _run_within(node, cfg, db, seconds=60.0):
    box = {}
    thread = threading.Thread(target=lambda: box.update(r=node.run(cfg, db)), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"qualify run still running after {seconds:.0f} s")
    return box["r"]


def test_a_root_kept_baseline_judges_a_young_fleet(tmp_path):
    base = tmp_path / "kept" / "baseline.json"
    base.parent.mkdir()
    base.write_text(json.dumps({"nccl-bw/allreduce_8589934592_busbw": 231.0}))
    cfg, db = _setup(tmp_path, base)
    slow = _run_within(Node(tmp_path, "gpu001", busbw=231.0 * 0.8), cfg, db)
    doc = json.loads(slow.output)
    assert slow.exit_code == 3 and doc["verdict"] == "fail", slow.output[-400:]
    assert {r["basis"] for r in doc["results"]} == {"baseline"}


@pytest.mark.parametrize("how", ["file-0666", "directory-0777", "fifo"])
def test_a_baseline_someone_else_could_write_is_refused_not_obeyed(tmp_path, how):
    where = tmp_path / "shared"
    where.mkdir()
    base = where / "baseline.json"
    if how == "fifo":
        os.mkfifo(base)
    else:
        base.write_text(json.dumps(LOW))
    if how == "file-0666":
        base.chmod(0o666)
    if how == "directory-0777":
        where.chmod(0o777)
    cfg, db = _setup(tmp_path, base)
    slow = _run_within(Node(tmp_path, "gpu001", busbw=231.0 * 0.8), cfg, db)
    assert slow.exit_code == 1, slow.output[-400:]
    assert "[qualify] baseline" in slow.output
    assert "refused" in slow.output or "not a regular file" in slow.output
