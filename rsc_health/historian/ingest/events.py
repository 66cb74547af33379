"""Node out-of-service periods from `sacctmgr -P show event` (run, or from a file).

sacctmgr prints a header line; its names differ between the field you ask for and the title it
prints (ask `Start`, get `TimeStart`), so both spellings are accepted. Cluster-wide events
(no NodeName) are not node periods and are skipped. An event still open has End `Unknown`;
reading it again once it closed fills in the end (the key is node, start, state).

Rows of one load with the same key (a DBE and an off-the-bus in the same second) are one
period: the reasons are joined ("; ") and the report counts the merge by its cause. A row whose
period an earlier load stored with another reason keeps both reasons, and a row for a node the
inventory does not list is kept: the report notes both (`noted`). sacctmgr
prints slurmdbd's wall-clock time: `tz` (an IANA zone) reads it as that zone's and stores UTC;
without it the times are taken as UTC and the report says so.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from rsc_health.historian import schema
from rsc_health.historian.db import writer
from rsc_health.historian.ingest import (
    BAD_NAME,
    BATCH_ROWS,
    FIELD_COUNT,
    NO_TIME,
    UNPARSABLE_TIME,
    IngestReport,
    RowError,
    bulk_write,
    database_failed,
    db_time,
    free_text,
    keep_stored_reasons,
    limit_statements,
    node_name,
    note_unknown_nodes,
    period_end,
    pipe_rows,
)
from rsc_health.slurm.accounting import Accounting
from rsc_health.slurm.api import SlurmError

# our name -> the header titles sacctmgr (or a hand-made file) may use for it
ALIASES = {
    "node": ("NodeName", "Node", "Nodes"),
    "start": ("TimeStart", "Start"),
    "end": ("TimeEnd", "End"),
    "state": ("State",),
    "reason": ("Reason",),
    "cluster": ("Cluster",),
}
NULL_TIMES = ("Unknown", "None", "")
COLUMNS = ("node", "start", "end", "state", "reason", "source", "cluster")


class EventsError(RuntimeError):
    pass


def run_sacctmgr(start: str, acct: Accounting) -> str:
    """`sacctmgr -P show event` since `start`, through rsc_health.slurm.accounting; bytes that
    are not UTF-8 (a reason is a person's text) become U+FFFD."""
    try:
        return acct.node_events(start).decode("utf-8", "replace")
    except SlurmError as exc:
        raise EventsError(str(exc)) from exc


MERGED_SAME_KEY = "same node, start and state in one load: one period, reasons joined"
CLUSTER_EVENT = "a cluster-wide event (no NodeName), not a node's"


def _time(text: str, tz: ZoneInfo | None = None, fold: int = 0) -> datetime | None:
    text = text.strip()
    if text in NULL_TIMES:
        return None
    value = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    if tz is not None:
        value = value.replace(tzinfo=tz, fold=fold).astimezone(UTC).replace(tzinfo=None)
    return value


def zone(tz: str | None) -> ZoneInfo | None:
    """The IANA zone `tz` names (None: times are UTC already), or EventsError."""
    if not tz:
        return None
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise EventsError(f"--tz {tz!r}: not a time zone (e.g. Europe/Berlin, UTC)") from exc


def _header_index(header: list[str]) -> dict[str, int]:
    index = {}
    for ours, titles in ALIASES.items():
        for title in titles:
            if title in header:
                index[ours] = header.index(title)
                break
    missing = [ALIASES[k][0] for k in ("node", "start", "end", "state") if k not in index]
    if missing:
        raise EventsError(f"sacctmgr event output lacks column(s) {', '.join(missing)}")
    return index


def ingest_lines(
    engine: Engine, lines: Iterable[str], *, source: str = "sacctmgr", cluster: str = "",
    tz: str | None = None,
) -> IngestReport:
    """Load `sacctmgr -P show event` lines. Each period's cluster is `cluster` when given
    ([historian] cluster), else the output's Cluster column, else ''. `tz`: the zone the
    times are wall-clock times of. A database that fails during the load raises EventsError
    with one line."""
    zinfo = zone(tz)
    try:
        return _ingest_lines(engine, lines, source, cluster, zinfo)
    except DBAPIError as exc:
        raise EventsError(database_failed("events", exc)) from exc


def _ingest_lines(engine: Engine, lines: Iterable[str], source: str, cluster: str,
                  tz: ZoneInfo | None):
    report = IngestReport("events", times=str(tz) if tz else "UTC")
    it = iter(lines)
    header_line = next(it, "")
    index = _header_index(header_line.rstrip("\n").split("|"))
    width = len(header_line.rstrip("\n").split("|"))
    batch: dict[tuple, tuple] = {}
    rows = pipe_rows(it, report)
    if "reason" in index:
        rows = _rejoined(rows, width, index["start"], report)
    with writer(engine).begin() as conn:
        limit_statements(conn)
        for lineno, fields in rows:
            if len(fields) > width and "reason" in index:
                # Reason is a person's free text, the only column that can hold a `|`.
                at, surplus = index["reason"], len(fields) - width
                fields = [*fields[:at], "|".join(fields[at : at + surplus + 1]),
                          *fields[at + surplus + 1 :]]
            if len(fields) != width:
                report.add_bad(lineno, f"expected {width} fields, saw {len(fields)}",
                               FIELD_COUNT)
                continue
            node = fields[index["node"]].strip()
            if not node:
                report.skip(CLUSTER_EVENT)
                continue
            too_long = next((name for name, value, limit in (
                ("NodeName", node, 128), ("State", fields[index["state"]], 32),
                ("Cluster", fields[index["cluster"]] if "cluster" in index else "", 64),
            ) if len(value) > limit), None)
            if too_long:  # PostgreSQL would refuse the whole load for one such value
                report.add_bad(lineno, f"{too_long} is longer than the historian keeps",
                               BAD_NAME)
                continue
            if any("\x00" in f for i, f in enumerate(fields) if i != index.get("reason")):
                report.add_bad(lineno, "a NUL byte outside the Reason",  # a name is not text
                               BAD_NAME)
                continue
            try:  # the node's name as Slurm spells it, never one mended from another
                node = node_name(node)
            except RowError as exc:
                report.add_bad(lineno, str(exc), exc.cause)
                continue
            try:
                start = _time(fields[index["start"]], tz)
                end_text = fields[index["end"]]
                end = period_end(start, _time(end_text, tz), partial(_time, end_text, tz, 1))
            except RowError as exc:
                report.add_bad(lineno, str(exc), exc.cause)
                continue
            except ValueError as exc:
                report.add_bad(lineno, str(exc), UNPARSABLE_TIME)
                continue
            if start is None:
                report.add_bad(lineno, "no start time", NO_TIME)
                continue
            reason = free_text(fields[index["reason"]], report) if "reason" in index else ""
            named = cluster or (fields[index["cluster"]].strip() if "cluster" in index else "")
            row = (node, db_time(start), db_time(end), fields[index["state"]], reason, source,
                   named)
            key = (node, row[1], row[3])
            if key in batch:
                report.merge(MERGED_SAME_KEY)
                row = _merge(batch[key], row)
            batch[key] = row
            if len(batch) >= BATCH_ROWS:
                report.written += _write(conn, list(batch.values()), report)
                batch = {}
        report.written += _write(conn, list(batch.values()), report)
    return report


# How sacctmgr prints TimeStart (the only shape _time reads): a line holding it in the start
# column begins an event; any other line goes on the Reason of a cut-short event before it.
_TIME_SHAPE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def _rejoined(rows: Iterator[tuple[int, list[str]]], width: int, start_at: int,
              report: IngestReport) -> Iterator[tuple[int, list[str]]]:
    """The rows with an event whose Reason holds a newline joined back: `sacctmgr -P` prints
    it as it is, so the event comes as a line short of fields and the rest of its Reason
    and columns on the next line(s). An event line short of fields takes every following
    line that does not begin an event of its own (a time in the start column, `start_at`);
    each is counted as one row read. Those lines may hold a `|` too: the joined row then has
    more fields than `width`, and the caller folds the surplus back into the Reason as for a
    one-line Reason (the sacct parser does the same for job names). An event line of the
    header's width or more is complete: a line after it that begins no event is a row of its
    own (reported for its field count), never folded into that event's Reason, where a stray
    `x|y` or a half-written last line would vanish. So a Reason whose `|` comes before its
    newline (its first line has the header's width) is not put back: its event lands with
    the Reason cut at the `|` and its next line is reported. A short line nothing completes
    is handed on as it is (and reported for its field count)."""
    pending: tuple[int, list[str]] | None = None
    for lineno, fields in rows:
        starts_event = len(fields) > start_at and _TIME_SHAPE.fullmatch(
            fields[start_at].strip()) is not None
        if pending is not None:
            if not starts_event:
                start, head = pending
                report.read -= 1  # one event's line, not a row of its own
                pending = (start, [*head[:-1], f"{head[-1]}\n{fields[0]}", *fields[1:]])
                continue
            yield pending
            pending = None
        if starts_event and len(fields) < width:
            # cut by a newline in its Reason: held for the lines that complete it
            pending = (lineno, fields)
            continue
        yield lineno, fields
    if pending is not None:
        yield pending


def _merge(first: tuple, later: tuple) -> tuple:
    """Two rows of one key: the later row, with both reasons (and the later end when it has
    one)."""
    reasons = [r for r in (first[4], later[4]) if r]
    reason = "; ".join(dict.fromkeys(reasons))
    end = later[2] if later[2] is not None else first[2]
    return (later[0], later[1], end, later[3], reason, *later[5:])


def _write(conn, rows: list[tuple], report: IngestReport) -> int:
    """Write one batch; a reason an earlier load stored for the same period is kept beside
    the new one, and rows for nodes the inventory does not list are counted (both in
    `report.noted`)."""
    note_unknown_nodes(conn, [r[0] for r in rows], report)
    rows = keep_stored_reasons(conn, schema.node_events, COLUMNS, ("node", "start", "state"),
                               rows, report)
    return bulk_write(
        conn,
        schema.node_events,
        COLUMNS,
        rows,
        conflict=("node", "start", "state"),
        update=("reason",),
        fill=("cluster",),
        once=("end",),
    )


def ingest_file(engine: Engine, path: Path | str, *, cluster: str = "",
                tz: str | None = None) -> IngestReport:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return ingest_lines(engine, fh, cluster=cluster, tz=tz)


def ingest_text(engine: Engine, text: str, *, cluster: str = "",
                tz: str | None = None) -> IngestReport:
    return ingest_lines(engine, io.StringIO(text), cluster=cluster, tz=tz)
