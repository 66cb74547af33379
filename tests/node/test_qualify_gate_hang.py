"""The qualification gate on a node whose /checkpoint hangs (a real FUSE mount that never
answers statfs): `qualify run` is bounded like `healthctl check` and fails the node on the hung
mount before any test runs, never hangs with it."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from rsc_health.cli import cli
from tests.unit.test_qualify_gate import _config, _marked, _qualify
from tests.unit.test_qualify_run import Node


def test_a_hung_mount_fails_qualification_within_the_checks_budget(hung_mount, tmp_path):
    cfg = _config(tmp_path)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    node = Node(tmp_path, "gpu110")
    ran = _marked(node)
    t0 = time.monotonic()
    res = _qualify(node, cfg, db, hung_mount)
    took = time.monotonic() - t0
    doc = json.loads(res.output)
    assert res.exit_code == 3 and doc["verdict"] == "fail", res.output[-600:]
    assert "/checkpoint" in doc["reason"] and not ran.exists()
    assert took < 10, took  # [mounts] probe_timeout_s = 2 in the fixture: no wait past it
