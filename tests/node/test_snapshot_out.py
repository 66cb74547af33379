"""`healthctl snapshot --out PATH` runs as root on a node and writes a file a person names,
often in /tmp. It wrote through whatever stood at that name: a symlink another user planted
there (to /etc/shadow, a state file) was followed and its target overwritten, a FIFO blocked
the snapshot for ever, and two snapshots to one name could interleave into one garbled file.
It now writes as root writes every file (durable.write_atomic): a fresh name renamed into
place."""

from __future__ import annotations

import json
import os
import threading

from .test_cli_node import invoke


def test_a_symlink_planted_at_the_out_name_is_replaced_not_followed(node, tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    secret = tmp_path / "shadow"
    secret.write_text("root:secret\n")
    out = shared / "snap.json"
    out.symlink_to(secret)
    res = invoke(node, "snapshot", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert secret.read_text() == "root:secret\n"
    assert not out.is_symlink()
    assert json.loads(out.read_text())["schema"] == "rsc_health.snapshot/1"


def test_a_fifo_at_the_out_name_does_not_hold_the_snapshot(node, tmp_path):
    out = tmp_path / "snap.json"
    os.mkfifo(out)
    result = {}
    worker = threading.Thread(target=lambda: result.update(
        res=invoke(node, "snapshot", "--out", str(out))), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # release it: open the FIFO's other end
        with open(out, "rb") as fh:
            fh.read()
        worker.join(10)
        raise AssertionError("the snapshot waited on a FIFO at its --out name")
    assert result["res"].exit_code == 0, result["res"].output
    assert json.loads(out.read_text())["schema"] == "rsc_health.snapshot/1"
