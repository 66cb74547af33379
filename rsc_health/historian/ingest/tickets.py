"""Repair tickets: opened and closed by hand (`healthctl ticket`) or imported from a CSV export
of the site's ticket system (columns node,opened,closed,reason; closed may be empty).

An import never reopens a ticket: an empty `closed` is what the export knew when it was made,
and a ticket closed since (by hand, or by a later export) stays closed when an older export is
read again (counted in the report's `noted`). A later `closed` does replace the stored one.
Reopening is said in so many words: `healthctl ticket reopen ID` (reopen_ticket)."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from sqlalchemy import Engine, insert, select, update

from rsc_health.historian import schema
from rsc_health.historian.db import writer
from rsc_health.historian.ingest import (
    CSV_ENCODING,
    MALFORMED_CSV,
    NO_NODE,
    NO_TIME,
    UNPARSABLE_TIME,
    IngestReport,
    RowError,
    bulk_write,
    db_time,
    free_text,
    keep_stored_reasons,
    node_name,
    note_unknown_nodes,
    parse_time,
    period_end,
)

T = schema.tickets
TICKET_COLUMNS = ("node", "opened", "closed", "reason", "source")
MERGED_SAME_KEY = "same node and opened in one load: one ticket, reasons joined"
KEPT_CLOSED = "closed since, kept closed: an empty closed never reopens (ticket reopen does)"


class TicketError(ValueError):
    pass


@dataclass
class Ticket:
    id: int
    node: str
    opened: datetime
    closed: datetime | None
    reason: str
    source: str


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None, microsecond=0)


def open_ticket(
    engine: Engine, node: str, reason: str, *, when: datetime | None = None, source="manual"
) -> int:
    try:
        node, reason = node_name(node), free_text(reason)
    except RowError as exc:
        raise TicketError(str(exc)) from exc
    with writer(engine).begin() as conn:
        result = conn.execute(
            insert(T).values(node=node, opened=when or _now(), reason=reason, source=source)
        )
        return int(result.inserted_primary_key[0])


def close_ticket(engine: Engine, ticket_id: int, *, when: datetime | None = None) -> Ticket:
    with writer(engine).begin() as conn:
        row = conn.execute(select(T).where(T.c.id == ticket_id)).first()
        if row is None:
            raise TicketError(f"no ticket {ticket_id}")
        if row.closed is not None:
            raise TicketError(f"ticket {ticket_id} was closed at {row.closed:%Y-%m-%d %H:%M}")
        conn.execute(update(T).where(T.c.id == ticket_id).values(closed=when or _now()))
        return Ticket(**conn.execute(select(T).where(T.c.id == ticket_id)).one()._mapping)


def reopen_ticket(engine: Engine, ticket_id: int) -> Ticket:
    """Open again a ticket closed by mistake (or reopened in the site's ticket system, whose
    export cannot say so: an empty `closed` there never reopens one here)."""
    with writer(engine).begin() as conn:
        row = conn.execute(select(T).where(T.c.id == ticket_id)).first()
        if row is None:
            raise TicketError(f"no ticket {ticket_id}")
        if row.closed is None:
            raise TicketError(f"ticket {ticket_id} is open")
        conn.execute(update(T).where(T.c.id == ticket_id).values(closed=None))
        return Ticket(**conn.execute(select(T).where(T.c.id == ticket_id)).one()._mapping)


def list_tickets(engine: Engine, *, open_only: bool = False, node: str | None = None):
    query = select(T).order_by(T.c.opened, T.c.id)
    if open_only:
        query = query.where(T.c.closed.is_(None))
    if node:
        query = query.where(T.c.node == node)
    with engine.connect() as conn:
        return [Ticket(**row._mapping) for row in conn.execute(query)]


def import_csv(engine: Engine, path: Path | str, *, tz: tzinfo | None = None) -> IngestReport:
    """Rows keyed by (node, opened): importing again only fills in `closed` (never clears it)
    and the reason."""
    with open(path, newline="", encoding=CSV_ENCODING, errors="replace") as fh:
        return import_lines(engine, fh, name=str(path), tz=tz)


def import_lines(engine: Engine, fh: Iterable[str], *, name: str = "-",
                 tz: tzinfo | None = None) -> IngestReport:
    """The CSV from an open text stream (`--file -`: stdin, opened with newline=""); `name`
    for messages. A row the historian cannot keep (a field past the csv module's limit, a
    node that is not a name: too long, a NUL, a control character, a space, bytes that were
    not UTF-8; ingest.node_name) is reported with its line; the others land. `tz`: the
    zone times without an offset are wall-clock times of (None: UTC), said in the report."""
    report = IngestReport("tickets", times=str(tz) if tz else "UTC")
    rows: dict[tuple, tuple] = {}
    lines = _Counted(fh)
    # strict: a quote never closed is an error at the end of the file, not a reason that
    # silently took in every line after it (a quoted reason may span lines); a stray quote
    # inside a field is the row's error, not text run together
    reader = csv.DictReader(lines, strict=True)
    try:
        fields = reader.fieldnames
    except csv.Error as exc:
        raise TicketError(f"{name}: line 1 is not a CSV header: {exc}") from exc
    missing = {"node", "opened"} - set(fields or ())
    if missing:
        raise TicketError(f"{name}: CSV lacks column(s) {', '.join(sorted(missing))}")
    while True:
        first = lines.count + 1  # the line the next row begins on
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:  # the reader goes on at the next line
            report.read += 1
            if str(exc) == "unexpected end of data" and lines.count > first:
                report.add_bad(first, f"a quote opened on line {first} is never closed: "
                               f"lines {first}-{lines.count} not read", MALFORMED_CSV)
            else:
                report.add_bad(lines.count, str(exc), MALFORMED_CSV)
            continue
        report.read += 1
        try:
            row = _row(record, report, tz)
        except RowError as exc:
            report.add_bad(reader.line_num, str(exc)[:300], exc.cause)
            continue
        except (ValueError, TypeError, AttributeError) as exc:
            report.add_bad(reader.line_num, str(exc)[:300], UNPARSABLE_TIME)
            continue
        key = row[:2]
        if key in rows:  # a second ticket opened in the same second: keep both reasons
            report.merge(MERGED_SAME_KEY)
            row = _merge(rows[key], row)
        rows[key] = row
    with writer(engine).begin() as conn:
        kept = list(rows.values())
        note_unknown_nodes(conn, [r[0] for r in kept], report)
        # a ticket an earlier load stored with another reason keeps both (report.noted)
        kept = keep_stored_reasons(conn, T, TICKET_COLUMNS, ("node", "opened"), kept, report)
        _count_kept_closed(conn, kept, report)
        report.written = bulk_write(
            conn,
            T,
            TICKET_COLUMNS,
            kept,
            conflict=("node", "opened"),
            update=("reason",),
            once=("closed",),  # an empty closed keeps the stored one: no reopening
        )
    return report


def _count_kept_closed(conn, rows: list[tuple], report: IngestReport) -> None:
    """Rows with an empty `closed` whose ticket is stored closed: said in report.noted."""
    open_rows = {(r[0], r[1]) for r in rows if r[2] is None}
    if not open_rows:
        return
    nodes = sorted({n for n, _ in open_rows})
    closed = 0
    for i in range(0, len(nodes), 500):
        for node, opened in conn.execute(select(T.c.node, T.c.opened).where(
                T.c.node.in_(nodes[i:i + 500]), T.c.closed.is_not(None))):
            closed += (node, db_time(opened) if isinstance(opened, datetime)
                       else opened) in open_rows
    if closed:
        report.noted[KEPT_CLOSED] = report.noted.get(KEPT_CLOSED, 0) + closed


def _row(record: dict, report: IngestReport, tz: tzinfo | None = None) -> tuple:
    node = (record.get("node") or "").strip()
    if not node:
        raise RowError("no node", NO_NODE)
    node = node_name(node)
    opened_text = (record.get("opened") or "").strip()
    if not opened_text:
        raise RowError("no opened time", NO_TIME)
    opened = parse_time(opened_text, tz)
    closed_text = (record.get("closed") or "").strip()
    closed = period_end(opened, parse_time(closed_text, tz) if closed_text else None,
                        lambda: parse_time(closed_text, tz, fold=1))
    reason = free_text((record.get("reason") or "").strip(), report)
    return (node, db_time(opened), db_time(closed), reason, "csv")


def _merge(first: tuple, later: tuple) -> tuple:
    """Two tickets of one node opened in the same second: one ticket with both reasons, closed
    at the later close (open while either is)."""
    reason = "; ".join(dict.fromkeys(r for r in (first[3], later[3]) if r))
    closed = None if None in (first[2], later[2]) else max(first[2], later[2])
    return (later[0], later[1], closed, reason, later[4])


class _Counted:
    """Lines of a file, counted: the line a csv.Error was raised on (the reader's own
    line_num is not advanced past it)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._it = iter(lines)
        self.count = 0

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> str:
        line = next(self._it)
        self.count += 1
        return line
