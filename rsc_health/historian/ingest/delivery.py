"""Delivering a node's spool (rsc_health.spool) into the historian, exactly once.

A claimed batch file is streamed in chunks of `CHUNK_LINES` lines, a little more where that
would cut one run's records in two (memory stays bounded whatever the spool's size); each
chunk is written in one transaction with a statement timeout, and the file is removed only
after its last chunk committed. Every write is keyed: check records fold into intervals
(rsc_health.historian.intervals: a run the table has already seen changes nothing), actions by
their record id, exclusions by (job, node, time: the job start's, so a job id Slurm reused is
a new job), job starts and ends (each node's prolog and epilog) by (node, job, time),
heartbeats by (node, source, time) (rsc_health.historian.freshness), telemetry samples by
(time, node). So a batch delivered twice, or cut short by a kill or a lost database and
delivered again, lands each record once.
Lines that are not valid records go to `quarantine/` next to the spool with their line
number and the reason, never retried.

Each record's time is judged against the historian's clock, which is the database server's
(a node flushes its own spool, so this process's clock is the node's, the one in doubt): a
record stamped from the future, before CLOCK_FLOOR, or more than CLOCK_BEHIND_S before the
same node's newest heartbeat on record (a clock reset to a BIOS date after CLOCK_FLOOR) goes
to quarantine, counted in `skewed`
(rsc_health.historian.freshness says why, and how the node is flagged).
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Optional

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import InterfaceError as SAInterfaceError

from rsc_health import spool
from rsc_health.compat import UTC
from rsc_health.durable import (
    DIRECTORY_RULE,
    UnsafeDirectory,
    make_dirs,
    open_regular,
    unsafe_directory,
)
from rsc_health.gpuname import bus_id
from rsc_health.historian import schema, versions
from rsc_health.historian.db import (
    HistorianFrozen,
    HistorianUnavailable,
    connect,
    engine_for,
    first_line,
    no_such_table,
    refuse_other_versions,
    safe_url,
    writer,
)
from rsc_health.historian.freshness import (
    CLOCK_BEHIND_S,
    CLOCK_FLOOR,
    Heartbeat,
    believable,
    last_seen,
    record_runs,
)
from rsc_health.historian.ingest import (
    BadRow,
    RowError,
    bulk_write,
    db_time,
    job_id_text,
    key_text,
    limit_statements,
    node_name,
    parse_time,
    severity_word,
)
from rsc_health.historian.intervals import CheckRecord, fold
from rsc_health.hostlist import HostlistError, expand
from rsc_health.model import Metric, Severity, Status, in_range

QUARANTINE = "quarantine"
QUARANTINE_MODE = 0o700
# What quarantine/ may hold, all batches together. It sits beside the spool, outside its cap
# ([node] spool_max_mb): a node whose clock stays wrong has every record quarantined on every
# flush (about 1 MB a day), and /var must never fill for it. Past this, the lines are counted
# and said (quarantine_lost), not kept; the first ones, which show the fault, stay.
QUARANTINE_MAX_BYTES = 16 << 20
# Lines per transaction: about 2 MB of JSON, a few MB of Python objects at most.
CHUNK_LINES = 5_000
# Longest one statement of a flush may run: a frozen database ends the flush (the spool
# keeps the rest) instead of holding a node's timer for minutes.
FLUSH_STATEMENT_TIMEOUT_S = 60
# _text's length bound: none (a label is cut to its column, a reason kept whole, as before).
_UNBOUNDED = 1 << 62
KINDS = tuple(dict.fromkeys((*spool.KINDS, "heartbeat")))


class SpoolMissing(FileNotFoundError):
    """The spool directory named does not exist (a typo must not look like 'nothing to do')."""


@dataclass
class DeliveryReport:
    batches: int = 0
    lines: int = 0
    delivered: dict[str, int] = field(default_factory=dict)
    quarantined: list[tuple[str, BadRow]] = field(default_factory=list)
    quarantined_count: int = 0
    opened: int = 0
    extended: int = 0
    closed: int = 0
    # Records whose time the historian's clock cannot believe (quarantined, counted there too).
    skewed: int = 0
    # Quarantined lines whose copy could not be written (a full or read-only disk), and why.
    quarantine_lost: int = 0
    quarantine_error: str = ""

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.delivered.items())) or "nothing"
        text = f"spool: {self.batches} batch(es), {self.lines} line(s), delivered {kinds}"
        if self.opened or self.extended or self.closed:
            text += (f"; check intervals {self.opened} opened, {self.extended} extended, "
                     f"{self.closed} closed")
        if self.quarantined_count:
            text += f", {self.quarantined_count} line(s) quarantined"
        if self.skewed:
            text += (f" ({self.skewed} stamped by a wrong node clock: ahead of the historian's "
                     f"clock, before {CLOCK_FLOOR:%Y}, or far behind the node's own)")
        if self.quarantine_lost:
            text += (f"; {self.quarantine_lost} quarantined line(s) could not be kept in "
                     f"{QUARANTINE}/ ({self.quarantine_error})")
        return text


@dataclass
class _Rows:
    checks: list[CheckRecord] = field(default_factory=list)
    exclusions: list[tuple] = field(default_factory=list)
    job_ends: list[tuple] = field(default_factory=list)  # (node, job_id, time)
    # (node, job_id, time, nnodes, nodes_digest): a job of 2+ nodes whose prolog named them
    job_starts: list[tuple] = field(default_factory=list)
    actions: list[tuple] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    telemetry: list[tuple] = field(default_factory=list)  # rows in SAMPLE_COLUMNS order
    # (node, GPU index) -> (bus id, time): the latest heartbeat's word (rsc_health.gpuname).
    gpu_names: dict[tuple[str, int], tuple[str, datetime]] = field(default_factory=dict)
    # node -> [(time, driver and firmware fields)]: rsc_health.historian.versions.
    versions: dict[str, list] = field(default_factory=dict)
    # Per node, its latest heartbeat's word on its clock (freshness.record_runs' `clocks`).
    clocks: dict[str, Heartbeat | None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    bad: list[tuple[BadRow, str]] = field(default_factory=list)
    skewed: int = 0
    lines: int = 0


def _text(rec: dict, key: str, default: str = "") -> str:
    """A field the node wrote as text (a label cut to its column, a reason): a JSON integer
    reads as its decimal text; an object, a list, a boolean or a fraction refuses the record
    (it was not written by the node path), never stored under its Python spelling."""
    value = rec.get(key)
    return default if value is None else key_text(value, key, _UNBOUNDED)


def _record_id(rec: dict) -> str:
    return key_text(rec["id"], "id", schema.RECORD_ID_LEN)


def _parse_record(rows: _Rows, rec: dict | None, received: datetime,
                  seen: dict[str, datetime] | None = None) -> None:
    if rec is None:
        raise RowError("not a JSON object")
    kind = rec.get("kind")
    if kind not in KINDS:
        raise RowError(f"unknown record kind {kind!r}")
    if not rec.get("id") or not rec.get("node") or not rec.get("time"):
        raise RowError("record lacks id, node or time")
    try:
        when = parse_time(str(rec["time"]))
    except ValueError as exc:
        raise RowError(f"time {rec['time']!r} is not ISO 8601") from exc
    node = node_name(rec["node"])
    mine = (seen or {}).get(node)
    if not believable(when, received, seen=mine):
        _skewed(rows, rec, node, when, received, mine)
    if kind == "heartbeat":
        rows.clocks[node] = None
    reader = _READERS.get(kind)
    if reader is not None:
        reader(rows, rec, node, when)
    rows.counts[kind] = rows.counts.get(kind, 0) + 1


def _check_row(rows: _Rows, rec: dict, node: str, when: datetime) -> None:
    status = _text(rec, "status").lower()
    if status not in set(Status) or not rec.get("check"):
        raise RowError("check record needs `check` and a status ok|warn|fail|error")
    # The words the file import takes, and the attribution and the report read: any other
    # (cut to 16, once) would be stored, and its finding then counted by none of them.
    severity = severity_word(_text(rec, "severity") or Severity.NONE.severity_word)
    job_id = rec.get("job_id")
    rows.checks.append(CheckRecord(
        id=_record_id(rec), time=when, node=node,
        source=_text(rec, "source", "sweep")[:16] or "sweep",
        job_id=None if job_id in (None, "") else job_id_text(job_id),
        check=_text(rec, "check")[:32], component=(_text(rec, "component") or "*")[:64],
        status=status,
        severity=severity,
        code=_text(rec, "code")[:32], reason=_text(rec, "reason") or _text(rec, "detail"),
    ))


def _job_start_row(rows: _Rows, rec: dict, node: str, when: datetime) -> None:
    excluded = rec.get("excluded") or []
    if not isinstance(excluded, list) or rec.get("job_id") in (None, ""):
        raise RowError("job_start needs job_id and a list `excluded`")
    job_id = job_id_text(rec["job_id"])
    names = [node_name(n, "excluded node") for n in excluded]
    started = _job_nodes(rec, node)
    rows.exclusions.extend((job_id, n, db_time(when)) for n in names)
    if started is not None and started[0] >= 2:
        rows.job_starts.append((node, job_id, db_time(when), *started))


def _job_nodes(rec: dict, node: str) -> tuple[int, str] | None:
    """A job_start's `nodes` (the prolog's SLURM_JOB_NODELIST) as (count, digest of the sorted
    names): what job_starts keeps, so the fail-slow detector knows when every node of a job
    sacct has not told of yet has told, and that they agree (failslow/load.py). None: an older
    node's record, which names none. A list that is not a hostlist, or that does not name the
    record's own node, refuses the record (it was not written by a prolog)."""
    nodes = rec.get("nodes")
    if nodes is None or nodes == "":
        return None
    if not isinstance(nodes, str):
        raise RowError("job_start `nodes` is not a hostlist")
    try:
        hosts = sorted(set(expand(nodes)))
    except (HostlistError, ValueError) as exc:
        raise RowError(f"job_start `nodes` is not a hostlist: {exc}"[:200]) from exc
    if node not in hosts:
        raise RowError("job_start `nodes` does not name its own node")
    digest = hashlib.sha256("\n".join(hosts).encode("utf-8", "surrogatepass")).hexdigest()
    return len(hosts), digest[:16]


def _job_end_row(rows: _Rows, rec: dict, node: str, when: datetime) -> None:
    """When the node's epilog ran for the job (job_ends): the job's end on this node until
    sacct says it (the check records' fold keeps no job id on an all-clear run)."""
    if rec.get("job_id") in (None, ""):
        raise RowError("job_end needs job_id")
    rows.job_ends.append((node, job_id_text(rec["job_id"]), db_time(when)))


def _action_row(rows: _Rows, rec: dict, node: str, when: datetime) -> None:
    if not rec.get("action"):
        raise RowError("action record lacks `action`")
    job_id = rec.get("job_id")
    rows.actions.append((_record_id(rec), db_time(when), node, _text(rec, "action")[:24],
                         _text(rec, "reason"),
                         None if job_id in (None, "") else job_id_text(job_id)))


def _heartbeat_row(rows: _Rows, rec: dict, node: str, when: datetime) -> None:
    try:
        errors = int(rec.get("checker_errors") or 0)
        duration = rec.get("duration_s")
        duration = None if duration is None else float(duration)
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: int(Infinity)
        raise RowError("heartbeat checker_errors/duration_s are not numbers") from exc
    rows.heartbeats.append(Heartbeat(
        node=node, time=when, source=(_text(rec, "source") or "sweep")[:16],
        level=_text(rec, "level")[:16], checker_errors=max(0, min(errors, 2**31 - 1)),
        duration_s=duration, version=_text(rec, "version")[:32],
    ))
    _gpu_names(rows, node, when, rec.get("gpus"))
    found = versions.fields_of(rec.get("versions"))
    if found:
        rows.versions.setdefault(node, []).append((when, found))


def _telemetry_row(rows: _Rows, rec: dict, node: str, when: datetime) -> None:
    rows.telemetry.append(_sample(rec, node, when))


# What each record kind adds to the rows.
_READERS = {"check": _check_row, "job_start": _job_start_row, "job_end": _job_end_row,
            "action": _action_row,
            "heartbeat": _heartbeat_row, "telemetry": _telemetry_row}


_METRICS = frozenset(m.value for m in Metric)
# telemetry_samples' columns, in the order _sample writes them.
SAMPLE_COLUMNS = ("time", "node", *(c for m in Metric for c in (m.value, f"{m.value}_c")))


def _sample(rec: dict, node: str, when: datetime) -> tuple:
    """A telemetry record's row of telemetry_samples (SAMPLE_COLUMNS). A metric this
    historian does not know (a newer node) is left out; a value that is not a finite number
    of at most 1e30, or is outside its metric's range (model.RANGES: a negative link ratio),
    refuses the whole record (it was not written by the node path); one under 1e-30 is 0."""
    metrics = rec.get("metrics")
    if not isinstance(metrics, dict):
        raise RowError("telemetry record needs an object `metrics`")
    got: dict[str, tuple[float, str]] = {}
    for name, sample in metrics.items():
        if name not in _METRICS:
            continue
        value = sample.get("value") if isinstance(sample, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or abs(value) > 1e30:
            raise RowError(f"telemetry {name}: value {str(value)[:40]!r} is not a number")
        # PostgreSQL's 4-byte column refuses a value under its smallest (about 1.2e-38:
        # "underflow", and the whole flush with it); none of the vocabulary's is that small
        # but zero.
        value = float(value) if abs(value) >= 1e-30 else 0.0
        if not in_range(name, value):  # a reading no node writes (model.RANGES)
            raise RowError(f"telemetry {name}: value {value!r} is outside its range")
        got[name] = (value, _text(sample, "component")[:32])
    row: list = [db_time(when), node]
    for m in Metric:
        value, comp = got.get(m.value, (None, None))
        row += [value, comp]
    return tuple(row)


def _gpu_names(rows: _Rows, node: str, when: datetime, gpus) -> None:
    """A heartbeat's {"1": "00000000:1A:00.0"}; what is not an index and a bus id is left out
    (an older node sends none; a garbled one costs its names, never the heartbeat)."""
    if not isinstance(gpus, dict):
        return
    for index, bus in list(gpus.items())[:64]:
        canon = bus_id(bus)
        # isdigit() alone takes "²", which int() refuses (ValueError: a stuck flush)
        if canon is None or not (index.isascii() and index.isdigit()) or int(index) > 9999:
            continue
        key = (node, int(index))
        if key not in rows.gpu_names or rows.gpu_names[key][1] <= when:
            rows.gpu_names[key] = (canon, when)


def _skewed(rows: _Rows, rec: dict, node: str, when: datetime, received: datetime,
            seen: datetime | None = None) -> None:
    """Refuse a record the node's clock stamped wrongly; a heartbeat still says it is alive."""
    rows.skewed += 1
    if rec.get("kind") == "heartbeat":
        rows.clocks[node] = Heartbeat(
            node=node, time=received, source="", level="", checker_errors=0, duration_s=None,
            version=_text(rec, "version")[:32])
    if when < CLOCK_FLOOR:
        raise RowError(f"time {rec['time']} is before {CLOCK_FLOOR:%Y}: the node's clock is "
                       "wrong (reset?)")
    behind = (seen - when).total_seconds() if seen is not None else 0.0
    if behind > CLOCK_BEHIND_S:
        raise RowError(f"time {rec['time']} is {_span(behind)} before the node's own newest "
                       f"heartbeat on record ({seen:%Y-%m-%dT%H:%M:%S}Z): the node's clock "
                       "went back (reset?)")
    ahead = (when - received).total_seconds()
    raise RowError(f"time {rec['time']} is {_span(ahead)} ahead of the historian's clock "
                   f"({received:%Y-%m-%dT%H:%M:%S}Z): the node's clock is wrong")


def _span(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.0f} days"
    if seconds >= 7200:
        return f"{seconds / 3600:.0f} hours"
    return f"{seconds:.0f} s"


Line = tuple[int, Optional[dict], str]  # evaluated at run time: no X | None before 3.10


def _chunks(path: Path, size: int) -> Iterator[list[Line]]:
    """The batch's lines, `size` at a time, never cutting a run: past `size` a chunk takes
    the lines that follow while they are of the same run as its last (_run_of), since
    intervals.fold takes the records of one (node, time) it is given as the whole run. A run
    cut in two was folded as two runs at one time: the first half closed the intervals of the
    components only the second half reported, and the second half, no newer than what the
    first had extended, was dropped as stale (GPUs still failing read as recovered, after any
    backlog longer than a chunk; found by helper-116). A chunk holds at most 2 x `size` lines
    (no node writes a run that long: memory stays bounded whatever the batch holds)."""
    lines: list[Line] = []
    for line in spool.read_batch(path):
        if len(lines) >= size and (len(lines) >= 2 * size
                                   or _run_of(line) != _run_of(lines[-1])):
            yield lines
            lines = []
        lines.append(line)
    if lines:
        yield lines


def _run_of(line: Line) -> tuple | None:
    """The run a line's record belongs to: its (node, time) as written (the node path stamps
    every record of a run alike, and appends them in one write); None for a line that is no
    record."""
    rec = line[1]
    if rec is None:
        return None
    return (str(rec.get("node")), str(rec.get("time")))


def _parse(lines: list[Line], received: datetime,
           seen: dict[str, datetime] | None = None) -> _Rows:
    """`seen`: freshness.last_seen of the chunk's nodes."""
    rows = _Rows(lines=len(lines))
    for lineno, rec, raw in lines:
        try:
            if rec is not None and "\\u0000" in raw:
                rec = _without_nul(rec)
            _parse_record(rows, rec, received, seen)
        except RowError as exc:
            rows.bad.append((BadRow(lineno, str(exc)), raw[:4096]))
        except RecursionError:  # valid JSON, but deeper than _nul_free's walk goes
            rows.bad.append((BadRow(lineno, "a JSON object nested too deep"), raw[:4096]))
    return rows


def _nodes(lines: list[Line]) -> set[str]:
    """The node names the chunk's records give (as written: a name _parse_record refuses
    matches no row)."""
    return {rec["node"] for _, rec, _ in lines
            if isinstance(rec, dict) and isinstance(rec.get("node"), str)}


def _without_nul(rec: dict) -> dict:
    """A record with NULs (a site check's output, escaped as \\u0000 in the spool): PostgreSQL
    text cannot hold them, and one such record failed every later flush of its node. In text
    they become U+FFFD; a node name with one is refused (key_text), never mended."""
    if "\x00" in str(rec.get("node", "")):
        raise RowError("node holds a NUL byte")
    return _nul_free(rec)


def _nul_free(value):
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_nul_free(k): _nul_free(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nul_free(v) for v in value]
    return value


@dataclass
class _Clock:
    """The historian's clock for one delivery: the database server's on PostgreSQL, read once
    (in the first transaction's first statement, with the schema's version) and carried on by
    this process's monotonic clock, which a wrong wall clock does not move; on SQLite the
    database is this host's file, and its clock this host's."""

    base: datetime | None = None
    at: float = 0.0

    def read(self, conn: Connection, *, version: bool) -> int | None:
        """Start the clock (and return the schema's version, when asked)."""
        server = conn.dialect.name == "postgresql"
        cols = [schema.schema_version.c.version] if version else []
        cols += [func.now()] if server else []
        row = conn.execute(select(*cols)).first() if cols else None
        if server and row is not None:
            self._start(row[-1].astimezone(UTC).replace(tzinfo=None))
        else:
            self._start(datetime.now(UTC).replace(tzinfo=None))
        return int(row[0] or 0) if version and row is not None else None

    def _start(self, now: datetime) -> None:
        self.base, self.at = now, time.monotonic()

    def now(self) -> datetime:
        assert self.base is not None
        return self.base + timedelta(seconds=time.monotonic() - self.at)


def flush_engine(engine: Engine) -> Engine:
    """`engine` with the flush's statement timeout, set as each transaction begins (db.py):
    one statement fewer per transaction than `limit_statements` after the default. Its
    transactions write (`writer`): a chunk reads the node's open intervals, then changes them."""
    return writer(engine).execution_options(statement_timeout_s=FLUSH_STATEMENT_TIMEOUT_S)


def _write(conn, rows: _Rows, report: DeliveryReport) -> None:
    limit_statements(conn, FLUSH_STATEMENT_TIMEOUT_S)  # no statement when flush_engine's
    folded = fold(conn, rows.checks)
    report.opened += folded.opened
    report.extended += folded.extended
    report.closed += folded.closed
    # keyed by (job_id, node, time), named by no conflict target: the nodes' role may
    # insert them but not read their time (deploy/postgresql/grants.sql)
    bulk_write(conn, schema.job_exclusions, ("job_id", "node", "time"), rows.exclusions,
               conflict=())
    bulk_write(conn, schema.job_ends, ("node", "job_id", "time"), rows.job_ends, conflict=())
    bulk_write(conn, schema.job_starts, ("node", "job_id", "time", "nnodes", "nodes_digest"),
               rows.job_starts, conflict=())
    bulk_write(conn, schema.node_actions, ("id", "time", "node", "action", "reason", "job_id"),
               rows.actions, conflict=("id",))
    record_runs(conn, rows.heartbeats, rows.clocks)
    bulk_write(conn, schema.gpu_names, ("node", "idx", "bus_id", "last_seen"),
               [(node, idx, bus, db_time(when))
                for (node, idx), (bus, when) in sorted(rows.gpu_names.items())],
               conflict=("node", "idx"), update=("bus_id", "last_seen"))
    versions.record(conn, rows.versions)
    bulk_write(conn, schema.telemetry_samples, SAMPLE_COLUMNS, rows.telemetry,
               conflict=("time", "node"))


def _quarantine(spool_dir: Path, batch: Path, bad: list[tuple[BadRow, str]]) -> None:
    """Appended to quarantine/BATCH, a directory and files only root reads (0700, 0600: the
    lines are whatever the batch held); nothing planted there (a symlink, a FIFO) is followed,
    and a quarantine/ another user made (in a sticky spool) is refused (DIRECTORY_RULE)."""
    qdir = spool_dir / QUARANTINE
    make_dirs(qdir, QUARANTINE_MODE)
    lines = [json.dumps({"line": row.line, "error": row.message, "raw": raw}) + "\n"
             for row, raw in bad]
    dfd = os.open(qdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        why = unsafe_directory(os.fstat(dfd))  # another user's quarantine/ (a sticky spool)
        if why:
            raise UnsafeDirectory(f"{qdir} is {why}: refused ({DIRECTORY_RULE})")
        held = sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(dfd)
                   if e.is_file(follow_symlinks=False))
        if held + sum(len(x.encode()) for x in lines) > QUARANTINE_MAX_BYTES:
            raise OSError(errno.EDQUOT, f"{QUARANTINE}/ holds {held} bytes, its most is "
                                        f"{QUARANTINE_MAX_BYTES}: the lines are not kept")
        fd = os.open(batch.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    finally:
        os.close(dfd)
    with open(fd, "a", encoding="utf-8") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file: refused", str(qdir / batch.name))
        os.fchmod(fd, 0o600)
        fh.writelines(lines)


class _NoSchema(Exception):
    """The historian has no tables yet (deliver's version check)."""


def deliver(
    engine: Engine,
    spool_dir: Path,
    *,
    chunk_lines: int = CHUNK_LINES,
    progress: Callable[[int], None] | None = None,
    check_version_of: str | None = None,
) -> DeliveryReport:
    """Deliver every claimed batch under spool_dir; HistorianUnavailable leaves the rest.

    `progress(lines)` is called after each committed chunk. `check_version_of` (the URL, for
    messages): the schema's version is read in the first transaction (SchemaTooOld,
    SchemaTooNew) instead of in one of its own before it."""
    report = DeliveryReport()
    timed = flush_engine(engine)
    clock = _Clock()
    for batch in map(Path, spool.claim(spool_dir)):  # the spool names them as str
        for lines in _chunks(batch, chunk_lines):
            try:
                with timed.begin() as conn:
                    if check_version_of is not None:
                        version = clock.read(conn, version=True)
                        refuse_other_versions(int(version or 0), check_version_of)
                        check_version_of = None
                    elif clock.base is None:
                        clock.read(conn, version=False)
                    received = clock.now()
                    rows = _parse(lines, received, last_seen(conn, _nodes(lines), received))
                    _write(conn, rows, report)
            except (OperationalError, SAInterfaceError, DBAPIError, HistorianFrozen) as exc:
                if check_version_of is not None and no_such_table(exc):
                    raise _NoSchema from exc
                # Frozen at COMMIT: the chunk may have landed; delivered again, it lands once.
                raise HistorianUnavailable(
                    f"historian database {safe_url(str(engine.url))} failed during the spool "
                    f"flush; {batch.name} and later batches stay in {spool_dir} and are "
                    f"delivered again next time: {first_line(exc)}{_grant_hint(exc)}"
                ) from exc
            report.skewed += rows.skewed
            if rows.bad:
                try:
                    _quarantine(spool_dir, batch, rows.bad)
                except OSError as exc:
                    # A full or read-only disk: the copy of lines that are no record is lost,
                    # never the node's records after them (an XID 79 in the next chunk would
                    # wait, flush after flush, for as long as the disk stayed full).
                    report.quarantine_lost += len(rows.bad)
                    report.quarantine_error = exc.strerror or str(exc)
                report.quarantined_count += len(rows.bad)
                # Keep a sample for the summary, not every bad line of a garbage file.
                room = max(0, 100 - len(report.quarantined))
                report.quarantined.extend((batch.name, b) for b, _ in rows.bad[:room])
            report.lines += rows.lines
            for kind, n in rows.counts.items():
                report.delivered[kind] = report.delivered.get(kind, 0) + n
            if progress is not None:
                progress(rows.lines)
        spool.done(batch)
        report.batches += 1
    return report


def _grant_hint(exc: Exception) -> str:
    """What to do when the database refused the node's role (insufficient_privilege): the
    grants a flush needs are one file, to be run again after every schema upgrade."""
    if getattr(getattr(exc, "orig", None), "sqlstate", None) != "42501":
        return ""
    return (" (the database role in the URL lacks a grant the flush needs: run "
            "deploy/postgresql/grants.sql as a superuser, again after every `db upgrade`; "
            "docs/deployment.md)")




def pending_lines(spool_dir: Path) -> int:
    """Lines waiting (for a progress bar's total); cheap: counts newlines, holds nothing."""
    total = 0
    for path in [spool_dir / spool.PENDING, *sorted(spool_dir.glob("batch-*.jsonl"))]:
        try:
            with open(open_regular(path), "rb") as fh:
                for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    total += block.count(b"\n")
        except OSError:
            continue
    return total


def flush(
    url: str, spool_dir: Path, *, progress: Callable[[int], None] | None = None
) -> DeliveryReport:
    """Connect and deliver. If the database is down the pending lines are still claimed into a
    batch file (so the node's next append starts a fresh file) and wait there. A spool
    directory breaking DIRECTORY_RULE is refused (UnsafeDirectory) before anything is read
    or written there; files in it another user owns are set aside (spool.claim)."""
    if not spool_dir.is_dir():
        raise SpoolMissing(f"no spool directory {spool_dir}")
    # As every append judges it (UnsafeDirectory): root (the node's timer) must not deliver
    # from, nor write its lock, batches and quarantine into, a spool another user controls.
    spool.judge(spool_dir)
    with spool.flush_lock(spool_dir):  # SpoolBusy when another flush holds it
        spool.claim(spool_dir)
        # Not connect(): its version check would be a transaction of its own, on every node
        # every few minutes; the first delivery transaction reads the version instead.
        engine = engine_for(url)
        try:
            try:
                return deliver(engine, spool_dir, progress=progress, check_version_of=url)
            except _NoSchema:
                engine.dispose()
                engine = connect(url, create_missing=True)  # an empty historian: an ingest
                # creates its schema
                return deliver(engine, spool_dir, progress=progress)
        finally:
            engine.dispose()
