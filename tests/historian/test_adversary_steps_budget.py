"""A pass over the step drop directory is bounded as a whole, not only per file and per
directory: max_files files of max_lines lines each (10,000 x 5,000,000 by default) was 5e10
lines a pass, one user's to make. [failslow] steps_max_lines_per_pass caps the lines one pass
reads; what it leaves is said, and each owner's files still come in turn, so a flood ahead of
another user's file cannot keep that file out."""

from __future__ import annotations

import json
import os

import pytest

from rsc_health.historian.ingest import steps
from tests.historian.test_step_times import _rows

LINE = {"job_id": "1", "rank": 0, "step": 1, "seconds": 1, "time": "2026-01-01T00:00:00Z"}


def _file(path, node: str, lines: int, uid: int) -> None:
    path.write_text("".join(json.dumps({**LINE, "node": node, "step": s}) + "\n"
                            for s in range(1, lines + 1)))
    os.chown(path, uid, uid)


def test_a_flood_of_files_and_lines_stops_at_the_pass_budget_and_the_victim_is_read(
        tmp_path, historian):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the files two owners")
    for i in range(6):
        _file(tmp_path / f"a{i}.jsonl", f"flood{i}", 50, 4242)
    _file(tmp_path / "z.jsonl", "victim", 1, 5353)  # its owner sorts after the flood's
    limits = steps.Limits(max_line_bytes=1024, max_lines=50, max_files=100,
                          owner_must_match=False, max_lines_per_pass=120)
    report = steps.ingest_path(historian, tmp_path, limits)
    assert report.read == 120  # 6 x 50 + 1 = 301 before
    nodes = {r[4] for r in _rows(historian)}
    assert "victim" in nodes and "flood3" not in nodes
    said = [b.message for b in report.bad if "per pass" in b.message]
    assert len(said) == 1 and "120 lines" in said[0] and "3 more files" in said[0]


def test_the_budget_also_bounds_stdin(historian):
    import io

    data = "".join(json.dumps({**LINE, "node": "n1", "step": s}) + "\n" for s in range(1, 40))
    limits = steps.Limits(max_line_bytes=1024, max_lines=1000, max_files=10,
                          max_lines_per_pass=25)
    report = steps.ingest_stream(historian, io.BytesIO(data.encode()), limits)
    assert report.read == 25 and report.written == 25
    assert any("per pass" in b.message for b in report.bad)


def test_the_default_budget_is_configured_and_bounded():
    from rsc_health.config import load_config

    limits = steps.Limits.from_config(load_config(None))
    assert limits.max_lines <= limits.max_lines_per_pass < limits.max_lines * limits.max_files


def test_a_step_file_others_may_write_is_nobodys_word(tmp_path, historian):
    """root's drop file made world-writable (how a prolog might hand it to the job), or a
    user's file anyone may write: every user can append a line naming any running job. It was
    taken at root's word (no owner check at all); now its lines are refused and counted. A
    root file only root's group may write, and the historian's own files, stay root's word."""
    from datetime import datetime

    from sqlalchemy import insert

    from rsc_health.historian import schema

    if os.geteuid() != 0:
        pytest.skip("needs root to give the files other owners")
    with historian.begin() as conn:
        conn.execute(insert(schema.jobs).values(
            job_id="502", job_id_display="502", user="alice", state="RUNNING",
            submit=datetime(2026, 1, 1), instance_key="502:x:", nnodes=4))

    def drop(name, uid, gid, mode, node):
        path = tmp_path / name
        path.write_text(json.dumps({**LINE, "job_id": "502", "node": node}) + "\n")
        os.chown(path, uid, gid)
        os.chmod(path, mode)

    drop("open.jsonl", 0, 0, 0o666, "world")
    drop("group.jsonl", 0, 4343, 0o664, "users-group")
    drop("nobodys.jsonl", 65534, 65534, 0o666, "nobody-open")
    drop("roots.jsonl", 0, 0, 0o664, "roots-group")
    drop("plain.jsonl", 0, 0, 0o644, "plain")
    limits = steps.Limits(max_line_bytes=1024, max_lines=50, max_files=100)
    report = steps.ingest_path(historian, tmp_path, limits)
    assert {r[4] for r in _rows(historian)} == {"roots-group", "plain"}
    assert report.dropped.get(steps.WRITABLE_BY_OTHERS) == 3
