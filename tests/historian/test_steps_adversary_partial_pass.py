"""ingest steps: each batch its own transaction. When the database fails at the 2nd batch,
the 1st batch is committed, but the command says only the error: nothing tells the operator
that rows were written (before: one transaction, nothing written)."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from rsc_health.cli import cli
from rsc_health.historian import db, schema
from rsc_health.historian.ingest import steps


def test_a_pass_cut_by_the_database_says_what_it_wrote(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    db.connect(url, create_missing=True).dispose()
    t = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    f = tmp_path / "555.jsonl"
    f.write_text("".join(json.dumps({"job_id": "555", "rank": i, "node": "n1", "step": i,
                                     "seconds": 1.0, "time": t}) + "\n" for i in range(30)))
    monkeypatch.setattr(steps, "BATCH_ROWS", 10)
    real, calls = steps._write, []

    def write(conn, rows):
        calls.append(1)
        if len(calls) == 2:
            raise OperationalError("INSERT", {}, Exception("database is gone"))
        return real(conn, rows)

    monkeypatch.setattr(steps, "_write", write)
    out = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", str(f)])
    e = db.connect(url, create_missing=True)
    with e.connect() as c:
        n = c.execute(select(func.count()).select_from(schema.step_times)).scalar()
    e.dispose()
    print(repr(out.output), repr(out.exception), n)
    assert n == 10  # the first batch is in
    assert out.exit_code != 0
    assert "10" in out.output and "written" in out.output.lower(), out.output
