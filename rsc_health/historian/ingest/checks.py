"""Health results from JSON Lines, for importing history from other tools (and the simulator).

One object per line: `time` (ISO 8601), `node`, `check`, `status` (ok|warn|fail) required;
`severity`, `component`, `detail` (or `reason`), `code`, `job_id`, `source` optional, and
`last_seen` (ISO 8601) for a state that lasted (the interval form; without it a row is a point
in time). Imported rows are closed intervals: the node path's spool goes through
`rsc_health.historian.intervals`, which extends and closes them as sweeps arrive. A row
without an `id` gets a stable one (a hash of its content), so importing a file twice lands
every row once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import Engine

from rsc_health.historian import schema
from rsc_health.historian.db import writer
from rsc_health.historian.ingest import (
    BATCH_ROWS,
    NO_NODE,
    NO_TIME,
    NOT_JSON,
    UNPARSABLE_TIME,
    IngestReport,
    RowError,
    bulk_write,
    db_time,
    free_text,
    job_id_text,
    key_text,
    node_name,
    parse_time,
    severity_word,
)
from rsc_health.model import Severity, Status
from rsc_health.spool import without_lone_surrogates

STATUSES = tuple(s.value for s in Status)
# A tool that does not grade its results: a failing check is taken to ask for a drain after
# the job (the attribution counts it), a warning stays a warning.
DEFAULT_SEVERITY = {Status.OK: Severity.NONE.severity_word,
                    Status.WARN: Severity.WARN.severity_word,
                    Status.FAIL: Severity.DRAIN_AFTER_JOB.severity_word,
                    Status.ERROR: Severity.NONE.severity_word}
COLUMNS = (
    "id",
    "time",
    "node",
    "source",
    "job_id",
    "check",
    "component",
    "status",
    "severity",
    "code",
    "reason",
    "last_seen",
    "is_open",
)


MERGED_SAME_ID = ("same id in one load: the first row kept (without an id, the id is the "
                  "row's content: an identical row)")
MISSING = {"time": NO_TIME, "node": NO_NODE}

__all__ = ["RowError", "ingest_file", "ingest_lines", "stable_id", "to_row", "write"]


def stable_id(obj: dict) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _text(obj: dict, key: str, default: str = "") -> str:
    value = obj.get(key)
    return default if value is None else str(value)


def _name(obj: dict, key: str, default: str = "") -> str:
    """A short label cut to its column (`source`): text, or a JSON integer's decimal text."""
    value = obj.get(key)
    return default if value is None else key_text(value, key, 1 << 20)


# An XID's code as another tool may write it: 79, "79", "XID79", "Xid 79".
_XID_CODE = re.compile(r"(?:xid)?\s*0*(\d{1,9})", re.IGNORECASE)


def _xid_code(code: str) -> str:
    """An XID row's code as rsc-health writes it ("xid79"): the lemon features leave out the
    application-class codes and group the rest by that spelling, so another tool's 13 or
    "XID13" counted a user's program against the node, and "79" and "xid79" were two codes."""
    found = _XID_CODE.fullmatch(code.strip())
    return f"xid{int(found.group(1))}" if found else code


def to_row(obj: dict, *, source: str = "import", report: IngestReport | None = None) -> tuple:
    """A JSON object -> a check_results row in COLUMNS order; RowError says what is wrong.
    NULs in the detail are replaced (counted in `report`)."""
    for key in ("time", "node", "check", "status"):
        if not obj.get(key):
            raise RowError(f"missing {key!r}", MISSING.get(key))
    status = str(obj["status"]).lower()
    if status not in STATUSES:
        raise RowError(f"status {obj['status']!r} is not one of {'|'.join(STATUSES)}")
    severity = severity_word(obj.get("severity") or DEFAULT_SEVERITY[status])
    try:
        time = parse_time(str(obj["time"]))
    except ValueError as exc:
        raise RowError(f"time {obj['time']!r} is not ISO 8601", UNPARSABLE_TIME) from exc
    job_id = obj.get("job_id")
    given_id = obj.get("id")
    # Never cut: two long ids sharing a prefix are two records (cutting collapsed them).
    record_id = (stable_id(obj) if given_id in (None, "")
                 else key_text(given_id, "id", schema.RECORD_ID_LEN))
    last_seen = time
    if obj.get("last_seen"):
        try:
            last_seen = parse_time(str(obj["last_seen"]))
        except ValueError as exc:
            raise RowError(f"last_seen {obj['last_seen']!r} is not ISO 8601",
                           UNPARSABLE_TIME) from exc
        if last_seen < time:
            raise RowError("last_seen is before time")
    component = obj.get("component")
    check = key_text(obj["check"], "check", 32, integer=False)
    code = key_text(_name(obj, "code"), "code", 32)
    return (
        record_id,
        db_time(time),
        node_name(obj["node"]),
        free_text(_name(obj, "source", source)[:16]),
        None if job_id in (None, "") else job_id_text(job_id),
        check,
        "*" if component in (None, "") else key_text(component, "component", 64),
        status,
        severity,
        _xid_code(code) if check == "xid" else code,
        free_text(_text(obj, "detail") or _text(obj, "reason"), report),
        db_time(last_seen),
        False,
    )


def write(conn, rows: list[tuple]) -> int:
    return bulk_write(conn, schema.check_results, COLUMNS, rows, conflict=("id",))


def ingest_lines(engine: Engine, lines: Iterable[str]) -> IngestReport:
    report = IngestReport("checks")
    batch: list[tuple] = []
    seen: set[str] = set()  # the ids of this load: a repeated one is counted, not rewritten
    with writer(engine).begin() as conn:
        for lineno, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            report.read += 1
            try:
                obj = without_lone_surrogates(json.loads(line))
                if not isinstance(obj, dict):
                    raise RowError("not a JSON object", NOT_JSON)
                row = to_row(obj, report=report)
            except RowError as exc:
                report.add_bad(lineno, str(exc)[:300], exc.cause)
                continue
            except (ValueError, RecursionError) as exc:  # [[[[... too deep; 5,000 digits
                report.add_bad(lineno, str(exc)[:300], NOT_JSON)
                continue
            if row[0] in seen:
                report.merge(MERGED_SAME_ID)
                continue
            seen.add(row[0])
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                report.written += write(conn, batch)
                batch = []
        report.written += write(conn, batch)
    return report


def ingest_file(engine: Engine, path: Path | str) -> IngestReport:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return ingest_lines(engine, fh)
