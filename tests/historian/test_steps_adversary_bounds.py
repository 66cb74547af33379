"""What one user's step files cost every other writer of the historian and every pass: a file
of zeros with no line end (sparse, terabytes long) was read to its end, hours a pass; and a
pass held SQLite's write lock from its first line to its last, so the suspects pass, sacct
and delivery failed with "database is locked" while a big file was read. The file is refused
past MAX_SKIP_BYTES without a line end; each batch is written in its own transaction and the
lines are parsed outside any."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import create_engine, insert

from rsc_health.cli import cli
from rsc_health.historian import db, schema
from rsc_health.historian.ingest import steps


def test_a_file_without_a_line_end_is_refused_not_read_to_its_end(tmp_path):
    drop = tmp_path / "drop"
    drop.mkdir()
    huge = drop / "huge.jsonl"
    with huge.open("wb") as fh:
        fh.truncate(16 << 30)  # 16 GiB of zeros, no blocks on disk, no line end
    line = {"job_id": "1", "rank": 0, "step": 1, "seconds": 1, "node": "n1",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    (drop / "ok.jsonl").write_text("x" * 70_000 + "\n" + json.dumps(line) + "\n")
    url = f"sqlite:///{tmp_path / 'h.db'}"
    out = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", "--json", str(drop)])
    assert out.exit_code == 0, out.output
    bad = [b["error"] for b in json.loads(out.output)["bad"]]
    assert any(b.startswith("huge.jsonl: no line end within") and
               b.endswith("the rest of the file was not read") for b in bad), bad
    # an over-long line with its end in reach is skipped alone, the next line read
    assert any(b.startswith("ok.jsonl: longer than") for b in bad), bad
    assert steps.MAX_SKIP_BYTES < (16 << 30)


def test_another_writer_gets_in_between_a_passs_batches(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    db.connect(url, create_missing=True).dispose()
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    t = (now - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    f = tmp_path / "555.jsonl"
    f.write_text("".join(json.dumps({"job_id": "555", "rank": i, "node": "n1", "step": i,
                                     "seconds": 1.0, "time": t}) + "\n" for i in range(30)))
    monkeypatch.setattr(steps, "BATCH_ROWS", 10)  # three batches
    # another process's writer with no patience: any write lock held across the parse fails it
    other = create_engine(url, connect_args={"timeout": 0.05})
    parse, wrote = steps.parse_line, []

    def parse_and_let_another_write(line, received):
        if len(wrote) < 3:
            with other.begin() as conn:
                conn.execute(insert(schema.ingest_cursors).values(
                    name=f"other-{len(wrote)}", value="x"))
            wrote.append(1)
        return parse(line, received)

    monkeypatch.setattr(steps, "parse_line", parse_and_let_another_write)
    engine = db.connect(url, create_missing=True)
    try:
        report = steps.ingest_path(engine, f, steps.Limits(
            max_line_bytes=65536, max_lines=1000, max_files=10, owner_must_match=False))
    finally:
        engine.dispose()
        other.dispose()
    assert report.written == 30 and len(wrote) == 3
