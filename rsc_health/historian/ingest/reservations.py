"""Slurm reservations from `sacctmgr -P show reservation` (run through rsc_health.slurm, or a
file): name, start, end, flags and nodes. A reservation with the MAINT flag marks planned
maintenance: the lemon features do not count its nodes' outages inside it.

sacctmgr prints titles that differ from the field names asked for (`Start` -> `TimeStart`,
`NodeNames` -> `NodeName`); both are accepted. Re-reading a reservation (key: cluster, name,
start) updates its end, flags and nodes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from rsc_health.historian import schema
from rsc_health.historian.db import writer
from rsc_health.historian.ingest import (
    FIELD_COUNT,
    NO_TIME,
    UNPARSABLE_TIME,
    IngestReport,
    bulk_write,
    database_failed,
    db_time,
    limit_statements,
    pipe_rows,
)
from rsc_health.slurm.accounting import Accounting
from rsc_health.slurm.api import SlurmError

ALIASES = {
    "cluster": ("Cluster",),
    "name": ("Name", "RESV_NAME"),
    "start": ("TimeStart", "Start"),
    "end": ("TimeEnd", "End"),
    "flags": ("Flags",),
    "nodelist": ("NodeName", "NodeNames", "Nodes"),
}
REQUIRED = ("name", "start", "flags", "nodelist")
COLUMNS = ("cluster", "name", "start", "end", "flags", "nodelist")
NULL_TIMES = ("Unknown", "None", "")


MERGED_SAME_KEY = "same cluster, name and start in one load: the later row kept"


class ReservationsError(RuntimeError):
    pass


def run_sacctmgr(start: str, acct: Accounting) -> str:
    try:
        data = acct.reservations(start)
    except SlurmError as exc:
        raise ReservationsError(str(exc)) from exc
    return data.decode("utf-8", "replace")


def _time(text: str) -> datetime | None:
    text = text.strip()
    return None if text in NULL_TIMES else datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")


def ingest_lines(engine: Engine, lines: Iterable[str], *, cluster: str = "") -> IngestReport:
    """Load the output; each reservation's cluster is `cluster` when given, else its own. A
    database that fails during the load raises ReservationsError with one line."""
    try:
        return _ingest_lines(engine, lines, cluster)
    except DBAPIError as exc:
        raise ReservationsError(database_failed("reservations", exc)) from exc


def _ingest_lines(engine: Engine, lines: Iterable[str], cluster: str) -> IngestReport:
    report = IngestReport("reservations")
    it = iter(lines)
    header = next(it, "").rstrip("\n").split("|")
    index = {ours: header.index(t) for ours, titles in ALIASES.items()
             for t in titles if t in header}
    missing = [ALIASES[k][0] for k in REQUIRED if k not in index]
    if missing:
        raise ReservationsError(f"sacctmgr reservation output lacks {', '.join(missing)}")
    rows: dict[tuple, tuple] = {}  # a load holds few: one batch, repeats counted
    with writer(engine).begin() as conn:
        limit_statements(conn)
        for lineno, fields in pipe_rows(it, report):
            if len(fields) != len(header):
                report.add_bad(lineno, f"expected {len(header)} fields, saw {len(fields)}",
                               FIELD_COUNT)
                continue
            try:
                start = _time(fields[index["start"]])
                end = _time(fields[index["end"]]) if "end" in index else None
            except ValueError as exc:
                report.add_bad(lineno, str(exc)[:200], UNPARSABLE_TIME)
                continue
            if start is None:
                report.add_bad(lineno, "no start time", NO_TIME)
                continue
            named = cluster or (fields[index["cluster"]] if "cluster" in index else "")
            row = (named, fields[index["name"]][:128], db_time(start), db_time(end),
                   fields[index["flags"]], fields[index["nodelist"]])
            if row[:3] in rows:
                report.merge(MERGED_SAME_KEY)
            rows[row[:3]] = row
        report.written += _write(conn, list(rows.values()))
    return report


def _write(conn, rows: list[tuple]) -> int:
    return bulk_write(conn, schema.reservations, COLUMNS, rows,
                      conflict=("cluster", "name", "start"), update=("end", "flags", "nodelist"))


def ingest_file(engine: Engine, path: Path | str, *, cluster: str = "") -> IngestReport:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return ingest_lines(engine, fh, cluster=cluster)


def ingest_text(engine: Engine, text: str, *, cluster: str = "") -> IngestReport:
    return ingest_lines(engine, io.StringIO(text), cluster=cluster)
