"""A qualification tool is what decides whether a repaired node goes back into service: one
that someone else could have replaced (a gpu_burn a user may write, or one in a directory a
user may write) could print passing figures for a broken node. Like dcgmi, systemctl and the
site checks, a tool that is not root's (or this user's) and writable by no one else, on a
path no one else can swap, is not run: the test proves nothing (inconclusive), never a pass.
Before, it was run and believed: exit 0, pass."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_qualify_run import Node, _fleet, _setup


@pytest.mark.parametrize("how", ["tool-0777", "directory-0777"])
def test_a_tool_someone_else_could_replace_is_not_run_and_proves_nothing(tmp_path, how):
    cfg, db = _setup(tmp_path)
    first = _fleet(tmp_path, cfg, db)
    assert [r.exit_code for r in first] == [4, 4, 4, 4, 0]
    node = Node(tmp_path, "gpu100")
    if how == "tool-0777":
        (node.bin / "gpu_burn").chmod(0o777)
    else:
        node.bin.chmod(0o777)
    result = node.run(cfg, db)
    doc = json.loads(result.output)
    assert result.exit_code == 4 and doc["verdict"] == "inconclusive", result.output[-600:]
    assert "refused" in doc["reason"]
    node.bin.chmod(0o755)
    (node.bin / "gpu_burn").chmod(0o755)
    again = node.run(cfg, db)
    assert again.exit_code == 0, again.output[-600:]
