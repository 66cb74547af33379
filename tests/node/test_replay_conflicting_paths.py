"""A snapshot whose paths conflict (a link or file named below one of its files, a link whose
target runs through a file, a mount point that is a file, a name longer than the kernel takes)
is a document the replay cannot rebuild: a checker error naming the file (exit 4), never the
uncaught OSError whose exit 1 `check` means as a WARN verdict (helper-136)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-fc-2026-11-29"


def _hostile(edit):
    doc = copy.deepcopy(json.loads((REAL / "snapshot.json").read_text()))
    edit(doc)
    return doc


CASES = {
    # a link named below one of the snapshot's files (the file proc/mounts's link leads to)
    "link_below_a_file": lambda d: d["links"].update({"proc/723/mounts/x": "dev/kmsg"}),
    # a link whose target runs through one of its files
    "link_target_through_a_file": lambda d: d["links"].update({"zz": "dev/kmsg/q"}),
    # a directory link named where the replay writes its own files, to a file (new in 9f402d1:
    # before, the target was made a directory)
    "replay_dir_a_link_to_a_file": lambda d: d["links"].update({"rsc_health": "dev/kmsg"}),
    # a file below a file
    "file_below_a_file": lambda d: d["files"].update({"proc/723/mounts/x": "y"}),
    # a mount point that is one of its files
    "mountpoint_a_file": lambda d: d.update(mountpoints=["/dev/kmsg"]),
    # a name longer than NAME_MAX
    "name_too_long": lambda d: d["files"].update({"x" * 300: "y"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_snapshot_whose_paths_conflict_is_a_checker_error_not_a_warn_verdict(case, tmp_path,
                                                                            monkeypatch):
    import tempfile

    replays = tmp_path / "t"
    replays.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(replays))
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(_hostile(CASES[case])))
    res = CliRunner().invoke(cli, ["check", "--from", str(path)])
    assert res.exit_code == 4, (res.exit_code, repr(res.exception), res.output[-300:])
    assert str(path) in res.output
