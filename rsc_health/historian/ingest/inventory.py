"""The node inventory: each node's in-service intervals, from a CSV (columns node, cluster,
partition, from, to, and optionally gpu_model; cluster, partition, to and gpu_model may be
empty: to empty is still in service, gpu_model empty is not known).

It is the fleet the historian judges rates against: node-days per cluster and partition, the
exposure of every node, failed or not (event history alone names only the nodes that failed).
Rows are keyed by (node, from); importing again updates the rest. An import never closes a
row it does not list: a node's rows may overlap (a node in two partitions at once is common in
Slurm; a CSV re-exported with a newer `from` for a node leaves its older open row as it was),
and exposure() counts the time a node is in service once, the union of its rows."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from datetime import datetime, tzinfo
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine, or_, select

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
    key_text,
    node_name,
    parse_time,
)

INV = schema.node_inventory
REQUIRED = ("node", "from")
MERGED_SAME_KEY = "same node (gpus: serial) and from in one load: the later row kept"
TO_BEFORE_FROM = "to before from"
NO_SERIAL = "no serial"


class InventoryError(ValueError):
    pass


def import_csv(engine: Engine, path: Path | str, *, tz: tzinfo | None = None) -> IngestReport:
    with open(path, newline="", encoding=CSV_ENCODING, errors="replace") as fh:
        return import_lines(engine, fh, name=str(path), tz=tz)


def import_lines(engine: Engine, fh: Iterable[str], *, name: str = "-",
                 tz: tzinfo | None = None) -> IngestReport:
    """`tz`: the zone from/to without an offset are wall-clock times of (None: UTC)."""
    report = IngestReport("inventory", times=str(tz) if tz else "UTC")

    def keyed(record: dict) -> tuple[tuple, tuple]:
        row = _row(record, tz)
        model = key_text((record.get("gpu_model") or "").strip(), "gpu_model", 64)
        return (row[0], row[3]), (*row, model)

    rows = _keyed_rows(fh, name, report, set(REQUIRED), keyed)
    with writer(engine).begin() as conn:
        report.written = bulk_write(
            conn, INV, ("node", "cluster", "partition", "start", "end", "source", "gpu_model"),
            rows, conflict=("node", "start"), update=("cluster", "partition", "end"),
            fill=("gpu_model",),
        )
    return report


def _keyed_rows(fh: Iterable[str], name: str, report: IngestReport, required: set[str],
                keyed: Callable[[dict], tuple[tuple, tuple]]) -> list[tuple]:
    """The CSV's rows through `keyed` (record -> (key, row)); a row that does not parse is
    reported with its line and left out (by cause), and a key seen twice keeps the later row
    (counted as merged: an interval has no reason to keep)."""
    reader = csv.DictReader(fh)
    try:
        fields = reader.fieldnames
    except csv.Error as exc:
        raise InventoryError(f"{name}: line 1 is not a CSV header: {exc}") from exc
    missing = required - set(fields or ())
    if missing:
        raise InventoryError(f"{name}: CSV lacks column(s) {', '.join(sorted(missing))}")
    rows: dict[tuple, tuple] = {}
    while True:
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            report.read += 1
            report.add_bad(reader.line_num, str(exc)[:300], MALFORMED_CSV)
            continue
        report.read += 1
        try:
            key, row = keyed(record)
        except RowError as exc:
            report.add_bad(reader.line_num, str(exc)[:300], exc.cause)
            continue
        except (ValueError, TypeError) as exc:
            report.add_bad(reader.line_num, str(exc)[:300], UNPARSABLE_TIME)
            continue
        if key in rows:
            report.merge(MERGED_SAME_KEY)
        rows[key] = row
    return list(rows.values())


def _row(record: dict, tz: tzinfo | None = None) -> tuple:
    node = (record.get("node") or "").strip()
    if not node:
        raise RowError("no node", NO_NODE)
    from_text = (record.get("from") or "").strip()
    if not from_text:
        raise RowError("no from time", NO_TIME)
    start = parse_time(from_text, tz)
    to_text = (record.get("to") or "").strip()
    end = parse_time(to_text, tz) if to_text else None
    if end is not None and end < start:
        raise RowError(f"to ({to_text}) is before from", TO_BEFORE_FROM)
    return (
        node_name(node),
        key_text((record.get("cluster") or "").strip(), "cluster", 64),
        key_text((record.get("partition") or "").strip(), "partition", 64),
        db_time(start), db_time(end), "csv",
    )


def exposure(engine: Engine, lo: datetime, hi: datetime) -> pd.DataFrame:
    """Per inventory node in service during [lo, hi): node, cluster, partition, gpu_model
    ('' unknown), days (its in-service time inside the window: the union of its intervals,
    however many of them overlap). Empty without inventory."""
    stmt = select(INV.c.node, INV.c.cluster, INV.c.partition, INV.c.start, INV.c.end,
                  INV.c.gpu_model).where(
        INV.c.start < hi, or_(INV.c.end.is_(None), INV.c.end > lo)
    )
    with engine.connect() as conn:
        frame = pd.DataFrame(conn.execute(stmt).all(),
                             columns=["node", "cluster", "partition", "start", "end",
                                      "gpu_model"])
    if frame.empty:
        return pd.DataFrame(columns=["node", "cluster", "partition", "gpu_model", "days"])
    frame["start"] = pd.to_datetime(frame["start"]).clip(lower=pd.Timestamp(lo))
    frame["end"] = pd.to_datetime(frame["end"]).fillna(pd.Timestamp(hi)).clip(
        upper=pd.Timestamp(hi))
    # A node's days are the union of its intervals: rows of one node may overlap (a node in
    # two partitions at once; a row re-imported with a new `from`, the older one left open),
    # and a node is in service once whatever rows say so. Each interval, in order of start,
    # adds only what reaches beyond every earlier interval's end.
    frame = frame.sort_values(["node", "start"], kind="stable")
    secs = (frame["end"] - pd.Timestamp(lo)).dt.total_seconds()
    reached = secs.groupby(frame["node"]).cummax().groupby(frame["node"]).shift()
    begin = (frame["start"] - pd.Timestamp(lo)).dt.total_seconds()
    frame["days"] = (secs - np.fmax(begin, reached)).clip(lower=0) / 86400.0
    # a node's cluster, partition and GPU model: those of its latest interval in the window
    return frame.groupby("node", as_index=False).agg(
        cluster=("cluster", "last"), partition=("partition", "last"),
        gpu_model=("gpu_model", "last"), days=("days", "sum")
    )


def has_inventory(engine: Engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(select(INV.c.id).limit(1)).first() is not None


__all__ = ["InventoryError", "exposure", "has_inventory", "import_csv", "import_lines"]


# -- GPUs -------------------------------------------------------------------------------------

GPU = schema.gpu_inventory


def import_gpus_csv(engine: Engine, path: Path | str, *,
                    tz: tzinfo | None = None) -> IngestReport:
    with open(path, newline="", encoding=CSV_ENCODING, errors="replace") as fh:
        return import_gpu_lines(engine, fh, name=str(path), tz=tz)


def import_gpu_lines(engine: Engine, fh: Iterable[str], *, name: str = "-",
                     tz: tzinfo | None = None) -> IngestReport:
    """Each GPU's intervals in a node: CSV serial, node, slot, from, to (slot and to may be
    empty). Keyed by (serial, from); a repeated key keeps the later row and is counted."""
    report = IngestReport("gpus", times=str(tz) if tz else "UTC")

    def keyed(record: dict) -> tuple[tuple, tuple]:
        serial = key_text((record.get("serial") or "").strip(), "serial", 64)
        if not serial:
            raise RowError("no serial", NO_SERIAL)
        node, _, _, start, end, source = _row(record, tz)
        slot = key_text((record.get("slot") or "").strip(), "slot", 32)
        return (serial, start), (serial, node, slot, start, end, source)

    rows = _keyed_rows(fh, name, report, {"serial", "node", "from"}, keyed)
    with writer(engine).begin() as conn:
        report.written = bulk_write(
            conn, GPU, ("serial", "node", "slot", "start", "end", "source"),
            rows, conflict=("serial", "start"), update=("node", "slot", "end"),
        )
    return report
