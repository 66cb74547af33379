"""Each node's driver and GPU firmware (VBIOS, InfoROM) as its heartbeats say them
(node_versions, version 13), and when they last changed: qualification's driver/firmware
trigger (`healthctl qualify auto` with [qualify] on_driver_change).

A heartbeat's `versions` ({"driver": "580.95.05", "vbios": ["96.00.AF.00.01"], "inforom":
[...]}: the distinct values of the node's GPUs; a map of GPU index to value reads too) becomes
fields: the driver, and the sorted distinct VBIOS and InfoROM values (a GPU NVML did not answer
for this run changes nothing; an update that reaches one board does). A field a heartbeat
does not carry keeps its last value, so a run where NVML would not say the firmware is no
change. The first sight of a node is no change.
Delivered with the heartbeats, on the node's flush too: Python 3.9, SQLAlchemy only."""

from __future__ import annotations

import hashlib
from datetime import datetime

from sqlalchemy import Connection, select

from rsc_health.historian import schema

FIELDS = ("driver", "vbios", "inforom")
MAX_VALUE = 64  # per version string, as the node cuts them
MAX_TEXT = 512  # the column
CHUNK = 900  # nodes asked in one IN (...)

Fields = dict[str, str]


def _clean(value) -> str | None:
    """A version string as stored: printable, no spaces or separators, at most MAX_VALUE."""
    if not isinstance(value, str):
        return None
    text = "".join(c for c in value.strip() if c.isprintable() and c not in " =+;")
    return text[:MAX_VALUE] or None


def fields_of(versions) -> Fields:
    """A heartbeat's `versions` as fields; what is garbled is left out, never an error."""
    if not isinstance(versions, dict):
        return {}
    out: Fields = {}
    driver = _clean(versions.get("driver"))
    if driver:
        out["driver"] = driver
    for key in ("vbios", "inforom"):
        given = versions.get(key)  # the distinct values; a map of GPU index to value also reads
        if isinstance(given, dict):
            given = list(given.values())
        if not isinstance(given, list):
            continue
        values = sorted({v for v in (_clean(x) for x in given[:64]) if v})
        if values:
            out[key] = "+".join(values)
    return out


def text_of(fields: Fields) -> str:
    """`driver=580.95.05 vbios=96.00.AF.00.01 inforom=G520.0200.00.05`, at most MAX_TEXT: a
    longer one ends in a digest of the whole, so a change past the cut is still a change."""
    text = " ".join(f"{k}={fields[k]}" for k in FIELDS if k in fields)
    if len(text) > MAX_TEXT:
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        text = text[:MAX_TEXT - 18] + " #" + digest
    return text


def parse_text(text: str | None) -> Fields:
    out: Fields = {}
    for part in (text or "").split(" "):
        key, sep, value = part.partition("=")
        if sep and key in FIELDS and value:
            out[key] = value
    return out


def record(conn: Connection, seen: dict[str, list[tuple[datetime, Fields]]]) -> int:
    """Fold each node's heartbeats (time, fields) into its node_versions row, in time order:
    a field that differs from the stored one is a change (previous keeps the old text, since
    the heartbeat's time). A heartbeat older than the row's last_seen is history already
    folded: skipped. Returns how many nodes changed."""
    from rsc_health.compat import UTC
    from rsc_health.historian.ingest import bulk_write, db_time

    def naive(when: datetime) -> datetime:
        return when.astimezone(UTC).replace(tzinfo=None) if when.tzinfo else when

    t = schema.node_versions
    nodes = sorted(n for n, beats in seen.items() if beats)
    stored: dict[str, tuple] = {}
    for start in range(0, len(nodes), CHUNK):
        for r in conn.execute(select(t.c.node, t.c.versions, t.c.since, t.c.last_seen,
                                     t.c.previous)
                              .where(t.c.node.in_(nodes[start:start + CHUNK]))):
            stored[r.node] = (r.versions, r.since, r.last_seen, r.previous)
    out = []
    changed = 0
    for node in nodes:
        row: tuple | None = stored.get(node)
        moved = False
        for when, fields in sorted(((naive(w), f) for w, f in seen[node]), key=lambda b: b[0]):
            if not fields:
                continue
            if row is None:
                row = (text_of(fields), when, when, None)
                continue
            text, since, last, previous = row
            if when < last:
                continue
            merged = {**parse_text(text), **fields}
            new = text_of(merged)
            if new != text:
                row, moved = (new, when, when, text), True
            else:
                row = (text, since, when, previous)
        if row is not None and row != stored.get(node):
            text, since, last, previous = row
            out.append((node, text, db_time(since), db_time(last), previous))
            changed += moved
    bulk_write(conn, t, ("node", "versions", "since", "last_seen", "previous"), out,
               conflict=("node",), update=("versions", "since", "last_seen", "previous"))
    return changed


def changes(conn: Connection) -> dict[str, tuple[datetime, str, str]]:
    """{node: (since, previous, versions)} for every node whose driver or firmware changed
    (a node seen with one set of versions only is not here)."""
    t = schema.node_versions
    rows = conn.execute(select(t.c.node, t.c.since, t.c.previous, t.c.versions)
                        .where(t.c.previous.is_not(None))).all()
    return {r.node: (r.since, r.previous, r.versions) for r in rows}
