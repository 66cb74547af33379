"""Delivering a node's spool (rsc_health.spool) into the historian, exactly once.

Each claimed batch is written in one transaction, keyed by every record's unique id (check
results, actions) or natural key (exclusions), then removed. A batch whose delivery fails
stays where it is and is claimed again next time; since its rows that did land are keyed,
delivering it twice still lands each record once. Lines that are not valid records are copied
to `quarantine/` next to the spool with their line number and the reason, never retried.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError as SAInterfaceError
from sqlalchemy.exc import OperationalError

from rsc_health import spool
from rsc_health.historian import schema
from rsc_health.historian.db import HistorianUnavailable, connect, safe_url
from rsc_health.historian.ingest import BadRow, bulk_write, db_time, parse_time
from rsc_health.historian.ingest.checks import RowError
from rsc_health.historian.ingest.checks import to_row as check_row
from rsc_health.historian.ingest.checks import write as write_checks

QUARANTINE = "quarantine"


@dataclass
class DeliveryReport:
    batches: int = 0
    delivered: dict[str, int] = field(default_factory=dict)
    quarantined: list[tuple[str, BadRow]] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.delivered.items())) or "nothing"
        text = f"spool: {self.batches} batch(es), delivered {kinds}"
        if self.quarantined:
            text += f", {len(self.quarantined)} line(s) quarantined"
        return text


@dataclass
class _Rows:
    checks: list[tuple] = field(default_factory=list)
    exclusions: list[tuple] = field(default_factory=list)
    actions: list[tuple] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    bad: list[tuple[BadRow, str]] = field(default_factory=list)


def _parse_batch(path: Path) -> _Rows:
    rows = _Rows()
    for lineno, rec, raw in spool.read_batch(path):
        try:
            if rec is None:
                raise RowError("not a JSON object")
            kind = rec.get("kind")
            if kind not in spool.KINDS:
                raise RowError(f"unknown record kind {kind!r}")
            if not rec.get("id") or not rec.get("node") or not rec.get("time"):
                raise RowError("record lacks id, node or time")
            try:
                time = db_time(parse_time(str(rec["time"])))
            except ValueError as exc:
                raise RowError(f"time {rec['time']!r} is not ISO 8601") from exc
            if kind == "check":
                rows.checks.append(check_row(rec, source=str(rec.get("source") or "sweep")))
            elif kind == "job_start":
                excluded = rec.get("excluded") or []
                if not isinstance(excluded, list) or not rec.get("job_id"):
                    raise RowError("job_start needs job_id and a list `excluded`")
                job_id = str(rec["job_id"])
                rows.exclusions.extend((job_id, str(n), time) for n in excluded)
            elif kind == "action":
                if not rec.get("action"):
                    raise RowError("action record lacks `action`")
                job_id = rec.get("job_id")
                rows.actions.append(
                    (
                        str(rec["id"])[:32],
                        time,
                        str(rec["node"]),
                        str(rec["action"]),
                        str(rec.get("reason") or ""),
                        None if job_id in (None, "") else str(job_id),
                    )
                )
            # job_end carries nothing the tables keep beyond the epilog's own check records.
            rows.counts[kind] = rows.counts.get(kind, 0) + 1
        except RowError as exc:
            rows.bad.append((BadRow(lineno, str(exc)), raw))
    return rows


def _write(conn, rows: _Rows) -> None:
    write_checks(conn, rows.checks)
    bulk_write(
        conn,
        schema.job_exclusions,
        ("job_id", "node", "time"),
        rows.exclusions,
        conflict=("job_id", "node"),
    )
    bulk_write(
        conn,
        schema.node_actions,
        ("id", "time", "node", "action", "reason", "job_id"),
        rows.actions,
        conflict=("id",),
    )


def _quarantine(spool_dir: Path, batch: Path, bad: list[tuple[BadRow, str]]) -> None:
    qdir = spool_dir / QUARANTINE
    qdir.mkdir(parents=True, exist_ok=True)
    with (qdir / batch.name).open("a", encoding="utf-8") as fh:
        for row, raw in bad:
            fh.write(json.dumps({"line": row.line, "error": row.message, "raw": raw}) + "\n")


def deliver(engine: Engine, spool_dir: Path) -> DeliveryReport:
    """Deliver every claimed batch under spool_dir; HistorianUnavailable leaves the rest."""
    report = DeliveryReport()
    for batch in spool.claim(spool_dir):
        rows = _parse_batch(batch)
        try:
            with engine.begin() as conn:
                _write(conn, rows)
        except (OperationalError, SAInterfaceError) as exc:
            raise HistorianUnavailable(
                f"historian database {safe_url(str(engine.url))} is unavailable; "
                f"{batch.name} and later batches stay in {spool_dir}: {exc.orig or exc}"
            ) from exc
        if rows.bad:
            _quarantine(spool_dir, batch, rows.bad)
            report.quarantined.extend((batch.name, b) for b, _ in rows.bad)
        spool.done(batch)
        report.batches += 1
        for kind, n in rows.counts.items():
            report.delivered[kind] = report.delivered.get(kind, 0) + n
    return report


def flush(url: str, spool_dir: Path) -> DeliveryReport:
    """Connect and deliver. If the database is down the pending lines are still claimed into a
    batch file (so the node's next append starts a fresh file) and wait there."""
    spool.claim(spool_dir)
    engine = connect(url)
    try:
        return deliver(engine, spool_dir)
    finally:
        engine.dispose()
