"""Loading outside data into the historian: one module per source (sacct, events, checks,
tickets, the node spools), all built on the batched, idempotent writes below.

Every loader streams its input, writes in batches of `BATCH_ROWS` with one executemany each,
and skips (but reports, with the line number) rows it cannot parse, so one bad line never
holds back the rest of a file. Re-loading the same rows changes nothing: every table has a
natural unique key and the writes are `INSERT ... ON CONFLICT` (the same syntax on SQLite
>= 3.24 and PostgreSQL).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo

from sqlalchemy import Connection, Engine, Table

from rsc_health.historian.db import first_line
from rsc_health.model import SEVERITY_WORDS

BATCH_ROWS = 10_000
# The CSV imports' (tickets, inventory, GPUs) encoding: UTF-8, a leading byte-order mark
# dropped (Excel's "CSV UTF-8" writes one, and the header's first name read "\ufeffnode").
CSV_ENCODING = "utf-8-sig"


# How SQLAlchemy's SQLite DateTime stores a value; PostgreSQL parses the same text, so the
# fast paths can hand either database pre-formatted strings.
DB_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"


# The causes a row of a load is left out for, each said once (the report and --json group the
# dropped rows by them). A row that does not parse is "unparsable"; a loader names finer ones.
UNPARSABLE = "unparsable"
UNPARSABLE_TIME = "unparsable time"
NO_NODE = "no node"
NO_TIME = "no time"
MALFORMED_CSV = "not a CSV row (the csv module refused it)"
NOT_JSON = "not a JSON object"
FIELD_COUNT = "wrong number of fields"
BAD_NAME = "a name the historian cannot keep (too long, or a NUL byte)"
NOT_A_NAME = ("not a name (a JSON object, list, boolean or number; a control character, a "
              "space or bytes that were not UTF-8 in a node name or job id)")
# Rows kept, with a word (IngestReport.noted).
END_BEFORE_START = "ends before it starts"
UNKNOWN_NODE = "written for a node the inventory does not list (unknown node)"
REASON_JOINED = ("already in the historian from an earlier load with another reason: "
                 "both reasons kept")
# Nodes asked in one IN (...): well under every driver's bound parameter limit.
IN_CHUNK = 900


class RowError(ValueError):
    """One input row the historian cannot keep; the load reports it with its line and goes on,
    counted under `cause`."""

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause or UNPARSABLE


def key_text(value: object, name: str, limit: int, *, integer: bool = True,
             exact: bool = False) -> str:
    """An identifier (a node name, a job id, a check family) as the historian keeps it, or
    RowError. Never cut (two long names sharing a prefix are two nodes) and never with a NUL
    (a name is not free text to mend). Checked here on both databases alike: PostgreSQL would
    refuse the whole transaction for the one row, SQLite would keep it.

    Only JSON text is a name, and a JSON integer where `integer` (a job id, an XID code: its
    decimal text); an object, a list, a boolean, a number with a fraction or null is refused,
    never kept under its Python spelling (str(["n1", "n2"]) is no node). `exact` (node names,
    job ids): the name must be the one its source wrote, so an empty one, one with a control
    or invisible character (a newline, a terminal escape, a bidi override), a space, or bytes
    that were not UTF-8 (a lone surrogate, or U+FFFD standing for them) is refused rather than
    mended into another name. The length is counted in the decoded text's characters, as
    PostgreSQL counts them."""
    if isinstance(value, str):
        text = value
    elif integer and isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 4 * limit:  # more digits than the limit: no str() of it
            raise RowError(f"{name} is longer than {limit} characters", BAD_NAME)
        text = str(value)
    else:
        raise RowError(f"{name} is {_json_kind(value)}, not "
                       f"{'text or an integer' if integer else 'text'}", NOT_A_NAME)
    if "\x00" in text:
        raise RowError(f"{name} holds a NUL byte", BAD_NAME)
    if len(text) > limit:
        raise RowError(f"{name} is longer than {limit} characters", BAD_NAME)
    if not text.isascii() and _SURROGATE.search(text):  # isascii: the common case, quick
        if exact:
            raise RowError(f"{name} holds bytes that were not UTF-8", NOT_A_NAME)
        text = _SURROGATE.sub("\ufffd", text)  # as spool.without_lone_surrogates does
    if exact and not (text and text.isprintable() and " " not in text and "\ufffd" not in text):
        raise RowError(f"{name} {_not_exact(text)}", NOT_A_NAME)
    return text


def severity_word(value: object) -> str:
    """A check record's severity as one of model.SEVERITY_WORDS (any case, "-" for "_"): the
    words the attribution and the report count, for an imported record and a spooled one
    alike; RowError for any other (stored, its finding would be counted by none of them)."""
    word = str(value).lower().replace("-", "_")
    if word not in SEVERITY_WORDS:
        raise RowError(f"severity {str(value)[:32]!r} is not one of {'|'.join(SEVERITY_WORDS)}")
    return word


def node_name(value: object, name: str = "node") -> str:
    """A node name (schema: 128 characters): text, exactly as the node is called (key_text)."""
    return key_text(value, name, 128, integer=False, exact=True)


def job_id_text(value: object) -> str:
    """A Slurm job id (schema: 32 characters): text or a JSON integer, exact (key_text)."""
    return key_text(value, "job_id", 32, exact=True)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_kind(value: object) -> str:
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "null" if value is None else f"a {type(value).__name__}"


def _not_exact(text: str) -> str:
    """What makes `text` no exact name (key_text), said without echoing it."""
    if not text:
        return "is empty"
    if "\ufffd" in text:
        return "holds bytes that were not UTF-8 (U+FFFD)"
    bad = next(c for c in text if c == " " or not c.isprintable())
    if bad == " ":
        return "holds a space"
    return f"holds a control or invisible character (U+{ord(bad):04X})"


def free_text(value: object, report: IngestReport | None = None) -> str:
    """A person's or a tool's text (a reason, a detail): PostgreSQL text cannot hold NUL, so it
    becomes U+FFFD on both databases alike, counted in `report.replaced`."""
    text = "" if value is None else str(value)
    if "\x00" in text:
        if report is not None:
            report.replaced += text.count("\x00")
        text = text.replace("\x00", "\ufffd")
    if not text.isascii() and _SURROGATE.search(text):
        # bytes that were not UTF-8 (a Latin-1 terminal's argv, a file's text): no database
        # driver encodes a lone surrogate
        if report is not None:
            report.replaced += len(_SURROGATE.findall(text))
        text = _SURROGATE.sub("\ufffd", text)
    return text


@dataclass
class BadRow:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class IngestReport:
    """What one load did: rows read, rows written (inserted or updated), rows merged into
    another row of the same key (by cause), rows dropped (by cause), and bytes that were not
    UTF-8, replaced by U+FFFD (the rows holding them still land). Every row read is written,
    merged or dropped: read == written + sum(merged) + sum(dropped) for the loaders that
    account (`accounts`)."""

    source: str
    read: int = 0
    written: int = 0
    # Rows left out on purpose (not errors), e.g. a cluster event, a PENDING job; also in
    # `dropped` under their cause.
    skipped: int = 0
    bad: list[BadRow] = field(default_factory=list)
    replaced: int = 0
    # sacct: the newest Start or End among the jobs read (naive UTC), None when none had one.
    newest: datetime | None = None
    # Rows folded into another row of the same key, by cause (none of them is lost silently).
    merged: dict[str, int] = field(default_factory=dict)
    # Rows not kept, by cause: the unparsable ones (also in `bad`, with their lines) and the
    # skipped ones.
    dropped: dict[str, int] = field(default_factory=dict)
    # How wall-clock times were read (events: "UTC", or the --tz zone).
    times: str = ""
    # Bad rows listed at most (0: all); the rest only counted in `bad_not_listed` and
    # `dropped`. Untrusted input (step files) sets it: millions of garbage lines must not
    # become millions of BadRow objects in the historian's memory.
    max_bad: int = 0
    bad_not_listed: int = 0
    # Rows written (they are in `written`) that deserve a word, by cause: a node the
    # inventory does not list, a reason joined to the one a row of an earlier load holds.
    noted: dict[str, int] = field(default_factory=dict)

    def add_bad(self, line: int, message: str, cause: str = UNPARSABLE) -> None:
        if self.max_bad and len(self.bad) >= self.max_bad:
            self.bad_not_listed += 1
        else:
            self.bad.append(BadRow(line, message))
        self.dropped[cause] = self.dropped.get(cause, 0) + 1

    def skip(self, cause: str, n: int = 1) -> None:
        """`n` rows left out on purpose, for `cause`."""
        if n:
            self.skipped += n
            self.dropped[cause] = self.dropped.get(cause, 0) + n

    def merge(self, cause: str, n: int = 1) -> None:
        """`n` rows folded into another row of the load with the same key, for `cause`."""
        if n:
            self.merged[cause] = self.merged.get(cause, 0) + n

    def note(self, cause: str, n: int = 1) -> None:
        """`n` rows written, with a word for `cause`."""
        if n:
            self.noted[cause] = self.noted.get(cause, 0) + n

    def as_dict(self) -> dict:
        """The report as `--json` prints it."""
        return {
            "source": self.source,
            "read": self.read,
            "written": self.written,
            "merged": self.merged,
            "dropped": self.dropped,
            "noted": self.noted,
            "skipped": self.skipped,
            "replaced": self.replaced,
            "times": self.times or None,
            "bad": [{"line": b.line, "error": b.message} for b in self.bad],
            "bad_not_listed": self.bad_not_listed,
        }

    def summary(self) -> str:
        text = f"{self.source}: read {self.read}, written {self.written}"
        for cause, n in self.merged.items():
            text += f", {n} merged ({cause})"
        for cause, n in self.dropped.items():
            text += f", {n} dropped ({cause})"
        for cause, n in self.noted.items():
            text += f", {n} {cause}"
        if self.replaced:
            text += f", {self.replaced} undecodable bytes replaced"
        if self.times:
            text += f"; times read as {self.times}"
        return text


# Longest one statement of a load may run on PostgreSQL (a first sacct backfill's index
# build at the paper's 4M jobs takes well under a minute): a frozen lock or a runaway
# statement ends the load instead of holding it forever.
STATEMENT_TIMEOUT_S = 900


def limit_statements(conn: Connection, seconds: float = STATEMENT_TIMEOUT_S) -> None:
    """PostgreSQL: every statement of this transaction ends after `seconds` (SET LOCAL, so
    the pooled connection is back to its default afterwards). SQLite has no server to hang:
    its waits are the busy timeout."""
    if (conn.dialect.name == "postgresql" and seconds > 0
            and conn.info.get("statement_timeout_s") != seconds):
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(seconds * 1000))}")
        conn.info["statement_timeout_s"] = seconds  # the client-side bound follows (db.py)


def pipe_rows(lines: Iterator[str], report: IngestReport) -> Iterator[tuple[int, list[str]]]:
    """The rows of `sacctmgr -P` output after its header line: (line number, fields split on
    `|`), blank lines skipped, each row counted in `report.read`."""
    for lineno, line in enumerate(lines, 2):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        report.read += 1
        yield lineno, line.split("|")


def database_failed(what: str, exc: Exception) -> str:
    """One line for a database that failed or went away during a load (the load's
    transaction rolls back, so nothing of it is kept)."""
    text = first_line(exc)
    if "locked" in text or "busy" in text:
        text += " (another load holds the historian; try again when it has finished)"
    return f"historian database failed during the {what} load, nothing of it was kept: {text}"


def db_time(value: datetime | None) -> str | None:
    """A naive UTC datetime as the text both dialects store and compare correctly."""
    if value is None:
        return None
    if value.tzinfo is not None:
        from rsc_health.compat import UTC

        value = value.astimezone(UTC).replace(tzinfo=None)
    # isoformat pads the year to 4 digits as DB_TIME_FORMAT's %Y does not on glibc (year 999
    # would be '999-...', after '2026-...' as text): the same text otherwise
    return value.isoformat(sep=" ", timespec="microseconds")


def parse_time(text: str, tz: tzinfo | None = None, *, fold: int = 0) -> datetime:
    """ISO 8601 (with or without offset, `Z` allowed) -> naive UTC. A time without an offset is
    a wall-clock time of `tz` (an import's --tz) when given, else UTC already; one with an
    offset says its own zone. `fold` 1: a wall time a DST change repeats is its second."""
    from rsc_health.compat import UTC

    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if value.tzinfo is None and tz is not None:
        value = value.replace(tzinfo=tz, fold=fold)
    if value.tzinfo is not None:
        try:
            value = value.astimezone(UTC).replace(tzinfo=None)
        except OverflowError as exc:  # year 1 at +01:00 is year 0 in UTC: every caller's error
            raise ValueError(f"{text.strip()[:64]!r} is out of range in UTC") from exc
    return value


def period_end(start: datetime | None, end: datetime | None,
               again: Callable[[], datetime | None]) -> datetime | None:
    """The end of a period read from wall-clock times (naive UTC, as `start`), or RowError
    (END_BEFORE_START) for one that ends before it starts. `again` reads the end's text as
    the second of a wall time a DST change repeats (fold 1): a period from the first 01:50 to
    the second 01:10 of a fall-back night is 20 minutes, not -40."""
    if start is None or end is None or end >= start:
        return end
    later = again()
    if later is not None and later >= start:
        return later
    raise RowError(f"ends ({end:%Y-%m-%d %H:%M:%S} UTC) before it starts "
                   f"({start:%Y-%m-%d %H:%M:%S} UTC)", END_BEFORE_START)


def join_reasons(stored: str, new: str) -> str:
    """A stored reason and a new one for the same row: both, "; "-joined, each part once (a
    part the stored reason already holds is not added again, so loading the same file twice
    changes nothing)."""
    parts = [r for r in stored.split("; ") if r]
    parts += [r for r in new.split("; ") if r and r not in parts]
    return "; ".join(parts)


def keep_stored_reasons(conn: Connection, table: Table, columns: Sequence[str],
                        key: Sequence[str], rows: list[tuple],
                        report: IngestReport) -> list[tuple]:
    """`rows` (tuples in `columns` order; `key` is `table`'s unique key, its first column the
    node, its second a time) with each reason joined to the one a row of an earlier load with
    the same key holds (join_reasons), each such row counted in `report.noted`
    (REASON_JOINED): a re-import, or a second export that says more, never replaces a reason
    without a word."""
    if not rows:
        return rows
    from sqlalchemy import and_, select

    at = [columns.index(k) for k in key]
    reason_at = columns.index("reason")
    cols = [table.c[k] for k in key]
    # DB_TIME_FORMAT text sorts as the times do: parse only the two ends
    times = [datetime.strptime(t, DB_TIME_FORMAT) for t in (
        min(r[at[1]] for r in rows), max(r[at[1]] for r in rows))]
    stored: dict[tuple, str] = {}
    nodes = sorted({r[at[0]] for r in rows})
    for i in range(0, len(nodes), IN_CHUNK):
        found = conn.execute(select(*cols, table.c.reason).where(and_(
            cols[0].in_(nodes[i:i + IN_CHUNK]), cols[1] >= min(times),
            cols[1] <= max(times)))).all()
        for *k, reason in found:
            k[1] = db_time(k[1]) if isinstance(k[1], datetime) else k[1]
            stored[tuple(k)] = reason or ""
    if not stored:
        return rows
    out = []
    for row in rows:
        old = stored.get(tuple(row[i] for i in at))
        if old is not None and row[reason_at] != old:
            joined = join_reasons(old, row[reason_at])
            if joined != old:
                report.note(REASON_JOINED)
            row = (*row[:reason_at], joined, *row[reason_at + 1:])
        out.append(row)
    return out


def note_unknown_nodes(conn: Connection, nodes: Sequence[str], report: IngestReport) -> None:
    """Count in `report.noted` (UNKNOWN_NODE) the rows whose node (one entry per row) the
    node inventory does not list, when there is an inventory: the row is kept (an inventory
    often lags the fleet), but its node has no exposure, no peer group and no cluster until
    the inventory names it."""
    from sqlalchemy import select

    from rsc_health.historian import schema

    inv = schema.node_inventory
    if not nodes or conn.execute(select(inv.c.id).limit(1)).first() is None:
        return
    wanted = sorted(set(nodes))
    known: set[str] = set()
    for at in range(0, len(wanted), IN_CHUNK):
        known.update(conn.execute(select(inv.c.node).distinct().where(
            inv.c.node.in_(wanted[at:at + IN_CHUNK]))).scalars())
    report.note(UNKNOWN_NODE, sum(1 for n in nodes if n not in known))


def upsert_sql(
    conn: Connection | Engine,
    table: str,
    columns: Sequence[str],
    source: str,
    *,
    conflict: Sequence[str],
    update: Sequence[str] = (),
    fill: Sequence[str] = (),
    once: Sequence[str] = (),
    settled: str | None = None,
) -> str:
    """INSERT INTO table (columns) <source> ON CONFLICT: update `update`, or do nothing.

    `source` is `VALUES (...)` with the driver's placeholders or a SELECT. Only rows whose
    values changed are rewritten, so re-reading an unchanged file writes no pages. A `fill`
    column is only ever set, never cleared: a new '' keeps the stored value (a file without
    a Cluster column does not unname the rows an incremental run named). A `once` column
    likewise, for NULL: an event's end, once known, is not unknown again when an export made
    before it closed is read later. `settled`: a column whose value makes a stored row final
    (a job's end): a row without it (read from an export made while the job ran) changes
    nothing of a row with it. `conflict` empty (DO NOTHING only): any key the row repeats,
    with no target named, so PostgreSQL asks no SELECT on the key's columns (a role that may
    only insert, the nodes')."""
    quote = conn.dialect.identifier_preparer.quote
    name = quote(table)
    target = f"({', '.join(quote(c) for c in conflict)}) " if conflict else ""
    sql = (f"INSERT INTO {name} ({', '.join(quote(c) for c in columns)}) {source} "
           f"ON CONFLICT {target}")
    if not update and not fill and not once:
        return sql + "DO NOTHING"
    if not conflict:
        raise ValueError("an upsert that updates needs its conflict target")
    distinct = "IS DISTINCT FROM" if conn.dialect.name == "postgresql" else "IS NOT"
    new = {c: f"excluded.{quote(c)}" for c in update}
    new.update({c: f"COALESCE(excluded.{quote(c)}, {name}.{quote(c)})" for c in once})
    new.update({c: f"COALESCE(NULLIF(excluded.{quote(c)}, ''), {name}.{quote(c)})" for c in fill})
    where = " OR ".join(f"{name}.{quote(c)} {distinct} {value}" for c, value in new.items())
    if settled is not None:
        where = (f"({where}) AND NOT (excluded.{quote(settled)} IS NULL "
                 f"AND {name}.{quote(settled)} IS NOT NULL)")
    return (
        sql
        + "DO UPDATE SET "
        + ", ".join(f"{quote(c)} = {value}" for c, value in new.items())
        + " WHERE "
        + where
    )


def bulk_write(
    conn: Connection,
    table: Table,
    columns: Sequence[str],
    rows: list[tuple],
    *,
    conflict: Sequence[str],
    update: Sequence[str] = (),
    fill: Sequence[str] = (),
    once: Sequence[str] = (),
) -> int:
    """INSERT rows (tuples in `columns` order); on a key conflict update `update` or ignore
    (`fill`, `once`: upsert_sql's).

    Goes straight to the driver's executemany: SQLAlchemy's per-value bind processing would
    cost more than the database itself on a million-row sacct file.
    """
    if not rows:
        return 0
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    values = f"VALUES ({', '.join([mark] * len(columns))})"
    sql = upsert_sql(conn, table.name, columns, values, conflict=conflict, update=update,
                     fill=fill, once=once)
    for start in range(0, len(rows), BATCH_ROWS):
        conn.exec_driver_sql(sql, rows[start : start + BATCH_ROWS])
    return len(rows)
