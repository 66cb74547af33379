"""Nodes that jobs excluded, from JSON Lines (`job_id`, `node`, `time`): the simulator's
`exclusions.jsonl`. Live clusters deliver the same rows through the prolog's spool records."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import Engine

from rsc_health.historian import schema
from rsc_health.historian.db import writer
from rsc_health.historian.ingest import (
    BATCH_ROWS,
    NOT_JSON,
    UNPARSABLE_TIME,
    IngestReport,
    RowError,
    bulk_write,
    db_time,
    job_id_text,
    node_name,
    parse_time,
)
from rsc_health.spool import without_lone_surrogates

COLUMNS = ("job_id", "node", "time")
# The key is the whole row, the job instance's (job_id, node, time): Slurm reuses job ids, so
# the same id and node at another time is another job's exclusion (schema.job_exclusions).
# The insert names no conflict target: the nodes' role inserts them and may read no `time`.
MERGED_SAME_KEY = "same job, node and time in one load: the first kept"


def _write(conn, rows: list[tuple]) -> int:
    return bulk_write(conn, schema.job_exclusions, COLUMNS, rows, conflict=())


def _row(obj: object) -> tuple:
    if not isinstance(obj, dict):
        raise RowError("not a JSON object")
    missing = [k for k in COLUMNS if obj.get(k) in (None, "")]
    if missing:
        raise RowError(f"missing {', '.join(missing)}")
    try:
        time = db_time(parse_time(str(obj["time"])))
    except ValueError as exc:
        raise RowError(f"time {str(obj['time'])[:64]!r} is not ISO 8601",
                       UNPARSABLE_TIME) from exc
    return (job_id_text(obj["job_id"]), node_name(obj["node"]), time)


def ingest_file(engine: Engine, path: Path | str) -> IngestReport:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return ingest_lines(engine, fh)


def ingest_lines(engine: Engine, lines: Iterable[str]) -> IngestReport:
    """The JSON Lines from an open text stream (`--file -`: stdin)."""
    report = IngestReport("exclusions")
    batch: list[tuple] = []
    seen: set[tuple] = set()
    with writer(engine).begin() as conn:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            report.read += 1
            try:
                row = _row(without_lone_surrogates(json.loads(line)))
            except RowError as exc:
                report.add_bad(lineno, str(exc), exc.cause)
                continue
            except (ValueError, RecursionError) as exc:  # [[[[... too deep; 5,000 digits
                report.add_bad(lineno, f"not JSON: {str(exc)[:200]}", NOT_JSON)
                continue
            if row in seen:
                report.merge(MERGED_SAME_KEY)
                continue
            seen.add(row)
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                report.written += _write(conn, batch)
                batch = []
        report.written += _write(conn, batch)
    return report
