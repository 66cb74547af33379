"""`healthctl check --from FILE` replays a snapshot someone else took: a bug report, a file a
user attached. An operator runs it, often as root. Before, the snapshot chose where the replay
wrote: its config's state_dir could climb out of the replay root ("/../../etc/cron.d") and its
`links` could chain out of it, and the snapshot's `state` files (any plain name, any text)
were written there: a crafted snapshot planted a cron job as root. A garbled snapshot ended in
a traceback or exit 1 (WARN) rather than a checker error."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

from .test_cli_node import invoke


@pytest.fixture
def snap(node, tmp_path, monkeypatch):
    """A real snapshot of the healthy node, and a temp dir the replay root goes under."""
    path = tmp_path / "snap.json"
    assert invoke(node, "snapshot", "--out", str(path)).exit_code == 0
    replays = tmp_path / "t"
    replays.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(replays))
    return path


def _edit(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _replay(path: Path):
    return CliRunner().invoke(cli, ["check", "--from", str(path)])


def test_a_snapshot_whose_state_dir_climbs_out_writes_nothing_outside_the_replay(snap, tmp_path):
    outside = tmp_path / "outside"

    def edit(doc):
        doc["config"].setdefault("node", {})["state_dir"] = "/.." * 40 + str(outside)
        doc["state"]["planted"] = "* * * * * root touch /tmp/owned\n"

    _edit(snap, edit)
    res = _replay(snap)
    assert not outside.exists()
    assert res.exit_code == 0, res.output  # the healthy node is still judged healthy


def test_a_snapshot_whose_links_chain_out_of_the_replay_writes_nothing_outside(snap, tmp_path):
    # root/l1 -> the replay root's parent, root/l1/l2 -> its parent's parent: tmp_path/t.
    def edit(doc):
        doc["links"].update({"l0": ".", "l0/l1": ".", "l1/l2": "."})
        doc["config"].setdefault("node", {})["state_dir"] = "/l1/l2/outside"
        doc["state"]["planted"] = "pwned\n"

    _edit(snap, edit)
    res = _replay(snap)
    assert not (tmp_path / "t" / "outside").exists()
    assert res.exit_code in (0, 4), res.output


def test_a_snapshot_whose_files_go_through_its_links_stay_in_the_replay(snap, tmp_path):
    def edit(doc):
        doc["links"].update({"l0": ".", "l0/l1": ".", "l1/l2": "."})
        doc["mountpoints"] = ["/l1/l2/made"]

    _edit(snap, edit)
    _replay(snap)
    assert not (tmp_path / "t" / "made").exists()


@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe garbage", b"[1, 2]",
                                  json.dumps({"schema": "rsc_health.snapshot/1",
                                              "files": ["a"]}).encode(),
                                  json.dumps({"schema": "rsc_health.snapshot/1",
                                              "files": {"a": 5}, "config": []}).encode()],
                         ids=["not_json", "not_utf8", "not_an_object", "files_a_list",
                              "wrong_types"])
def test_a_garbled_snapshot_is_a_checker_error_naming_the_file(body, tmp_path):
    path = tmp_path / "snap.json"
    path.write_bytes(body)
    res = _replay(path)
    assert res.exit_code == 4, res.output
    assert str(path) in res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit)
