"""Job instances from Slurm accounting: `sacct -a -X -D --parsable2` output, run or from a file.

`-X` gives one line per job allocation (no steps) and `-D` one line per instance of a requeued
job, so a job that was requeued twice is three rows with the same JobIDRaw; they are told
apart by `instance_key` = JobIDRaw:Submit:Start. Columns are matched by header name, in any
order. Times are taken as UTC: we run sacct with TZ=UTC, and a file should be made the same
way (`TZ=UTC sacct ...`).

Speed matters (a large cluster's year is millions of rows), so the file is parsed by pandas'
C reader in chunks and every transform is vectorised; only the hostlist expansion is per row,
and it is cached per distinct NodeList string.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine, and_, or_, select
from sqlalchemy.exc import OperationalError

from rsc_health import hostlist
from rsc_health.historian import schema
from rsc_health.historian.ingest import IngestReport, bulk_write, run_accounting

FIELDS = (
    "JobIDRaw",
    "JobID",
    "JobName",
    "User",
    "Partition",
    "State",
    "ExitCode",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "NNodes",
    "NodeList",
    "AllocTRES",
)
CURSOR = "sacct"
CHUNK_ROWS = 250_000
SQLITE_INGEST_CACHE_KIB = 128 * 1024
NULL_TIMES = ("Unknown", "None", "")
NO_NODES = ("", "None assigned", "(null)", "None")  # what hostlist.expand reads as no host
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
_SKIPPED_LINE = re.compile(r"Skipping line (\d+): (.*)")

JOB_COLUMNS = (
    "job_id",
    "job_id_display",
    "name",
    "user",
    "partition",
    "state",
    "exit_code",
    "submit",
    "eligible",
    "start",
    "end",
    "nnodes",
    "gpus",
    "nodelist",
    "instance_key",
)
# A running job's row is re-read later with its final state: these may change, nothing else.
UPDATABLE = ("state", "exit_code", "eligible", "end", "gpus", "nodelist", "nnodes")


class SacctError(RuntimeError):
    pass


def sacct_argv(start: str, end: str) -> list[str]:
    return [
        "sacct",
        "-a",
        "-X",
        "-D",
        "--parsable2",
        f"--format={','.join(FIELDS)}",
        "-S",
        start,
        "-E",
        end,
    ]


def run_sacct(start: str, end: str, timeout_s: float) -> str:
    """sacct's output for [start, end], times in UTC."""
    return run_accounting(sacct_argv(start, end), timeout_s, SacctError)


def _times(raw: pd.Series, name: str, bad: pd.Series, why: pd.Series) -> pd.Series:
    """sacct times -> DB text (NULL for Unknown/None); marks unparsable values bad."""
    parsed = pd.to_datetime(raw, format=_SACCT_TIME, errors="coerce")
    is_null = raw.isin(NULL_TIMES)
    wrong = parsed.isna() & ~is_null
    if wrong.any():
        why.loc[wrong & ~bad] = name + " is not a time: " + raw[wrong & ~bad]
        bad |= wrong
    ok = (~parsed.isna()).to_numpy()
    # "2024-03-01T08:00:00" -> "2024-03-01 08:00:00.000000", SQLAlchemy's stored form
    text = [
        f"{t[:10]} {t[11:]}.000000" if good else None
        for t, good in zip(raw.to_numpy(dtype=object).tolist(), ok.tolist(), strict=True)
    ]
    return pd.Series(text, index=raw.index, dtype=object)


_GPU_UNTYPED = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_GPU_TYPED = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)")


def gpus_in_tres(tres: str) -> int | None:
    """GPUs in an AllocTRES string: `gres/gpu=N`, else the sum of `gres/gpu:<type>=N`."""
    m = _GPU_UNTYPED.search(tres)
    if m:
        return int(m.group(1))
    typed = _GPU_TYPED.findall(tres)
    return sum(int(n) for n in typed) if typed else None


def _per_distinct(column: pd.Series, fn) -> pd.Series:
    """fn over a column with few distinct values (State, AllocTRES), once per value."""
    codes, uniques = pd.factorize(column)
    mapped = np.array([fn(u) for u in uniques.tolist()] + [None], dtype=object)
    return pd.Series(mapped[codes], index=column.index, dtype=object)


def _chunks(source: io.TextIOBase | Path) -> Iterator[tuple[pd.DataFrame, list[tuple[int, str]]]]:
    """(chunk, [(line, message) for lines with the wrong number of fields]) pairs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = pd.read_csv(
            source,
            sep="|",
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            quoting=3,  # csv.QUOTE_NONE: sacct never quotes; a '"' in a job name is literal
            on_bad_lines="warn",
            skip_blank_lines=False,
            chunksize=CHUNK_ROWS,
            engine="c",
        )
        for chunk in reader:
            short = []
            for w in caught:
                for m in _SKIPPED_LINE.finditer(str(w.message)):
                    short.append((int(m.group(1)), m.group(2).strip()))
            caught.clear()
            yield chunk, short


def ingest_text(
    engine: Engine, source: io.TextIOBase | Path | str, *, gpus_per_node: int = 8
) -> IngestReport:
    """Load sacct --parsable2 output (a path, an open file, or the text itself)."""
    if isinstance(source, str):
        source = io.StringIO(source)
    report = IngestReport("sacct")
    nodes_cache: dict[str, list[str] | None] = {}
    with engine.connect() as conn:
        rollback_journal = _sqlite_bulk_journal(conn)
        try:
            with conn.begin():
                _load(conn, source, report, gpus_per_node, nodes_cache)
        finally:
            if rollback_journal:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
                conn.commit()
    return report


def _load(conn, source, report: IngestReport, gpus_per_node: int, nodes_cache: dict) -> None:
    next_line = 2  # line 1 is the header
    if conn.dialect.name == "sqlite":
        # A big file inserts into indexes far larger than SQLite's 2 MiB default page
        # cache; a bigger cache for this connection cuts ingest CPU by about a fifth.
        conn.exec_driver_sql(f"PRAGMA cache_size=-{SQLITE_INGEST_CACHE_KIB}")
        # Let CREATE INDEX sort on a second core.
        conn.exec_driver_sql("PRAGMA threads=2")
        # pysqlite opens its transaction only before DML: without this, the index drops
        # below would commit on their own and a failed load would leave no indexes.
        if not conn.connection.dbapi_connection.in_transaction:
            conn.exec_driver_sql("BEGIN")
    deferred = _defer_indexes(conn)
    for chunk, short in _chunks(source):
        missing = [f for f in FIELDS if f not in chunk.columns]
        if missing:
            raise SacctError(f"sacct output lacks column(s) {', '.join(missing)}")
        # The C reader drops malformed lines; rebuild each kept row's line number.
        skipped = {line for line, _ in short}
        for line, message in short:
            report.add_bad(line, message)
        # Lines next_line.. minus the skipped ones, as many as the chunk has rows.
        span = np.arange(next_line, next_line + len(chunk) + len(skipped) + 1)
        lines = span[~np.isin(span, list(skipped))][: len(chunk)]
        next_line = int(lines[-1]) + 1 if len(lines) else next_line
        while next_line in skipped:
            next_line += 1
        report.read += len(chunk) + len(short)
        _load_chunk(conn, chunk, lines, report, gpus_per_node, nodes_cache)
    for index in deferred:
        index.create(conn)


# Secondary indexes a first bulk load builds at the end, sorted, instead of row by row.
# The unique instance_key index stays: the upsert needs it.
DEFERRABLE_INDEXES = ("ix_jobs_end", "ix_jobs_job_id", "ix_job_nodes_node")


def _sqlite_bulk_journal(conn) -> bool:
    """A first backfill into an empty SQLite jobs table runs under the rollback journal.

    WAL writes every page twice (log, then checkpoint); a rollback journal records nothing
    for pages that were empty before the transaction, so a big first load writes its pages
    once (measured: about a third less CPU in SQLite). Leaving WAL needs sole use of the
    file: if another connection has it open, we stay in WAL (no wait). The caller switches
    back to WAL after the load, commit or rollback.
    """
    if conn.dialect.name != "sqlite":
        return False
    empty = conn.execute(select(schema.jobs.c.id).limit(1)).first() is None
    conn.commit()
    if not empty:
        return False
    busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
    conn.exec_driver_sql("PRAGMA busy_timeout=0")
    try:
        mode = conn.exec_driver_sql("PRAGMA journal_mode=DELETE").scalar()
    except OperationalError:  # locked by another connection
        mode = "wal"
    finally:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(busy)}")
        conn.commit()
    return mode == "delete"


def _defer_indexes(conn) -> list:
    """On SQLite, when the jobs table is empty (a first backfill), drop the secondary indexes
    for the load; the caller recreates them in the same transaction, so a failed load rolls
    back to the indexed, empty table."""
    if conn.dialect.name != "sqlite":
        return []
    if conn.execute(select(schema.jobs.c.id).limit(1)).first() is not None:
        return []
    indexes = [
        ix
        for table in (schema.jobs, schema.job_nodes)
        for ix in table.indexes
        if ix.name in DEFERRABLE_INDEXES
    ]
    for index in indexes:
        index.drop(conn, checkfirst=True)
    return indexes


def _load_chunk(conn, df, lines, report, gpus_per_node, nodes_cache) -> None:
    lines = pd.Series(lines, index=df.index)
    bad = pd.Series(False, index=df.index)
    why = pd.Series("", index=df.index, dtype=object)

    state = _per_distinct(df["State"], lambda text: text.split(" ", 1)[0])
    pending = state.eq("PENDING")  # not an instance yet; it is read again once it starts
    empty_id = df["JobIDRaw"].eq("")
    why.loc[empty_id] = "no JobIDRaw"
    bad |= empty_id

    submit = _times(df["Submit"], "Submit", bad, why)
    no_submit = submit.isna() & ~bad
    why.loc[no_submit] = "no Submit time"
    bad |= no_submit
    eligible = _times(df["Eligible"], "Eligible", bad, why)
    start = _times(df["Start"], "Start", bad, why)
    end = _times(df["End"], "End", bad, why)

    nnodes = pd.to_numeric(df["NNodes"], errors="coerce")
    wrong = nnodes.isna() & ~bad
    why.loc[wrong] = "NNodes is not a number: " + df["NNodes"][wrong]
    bad |= nnodes.isna()

    gpus = pd.to_numeric(_per_distinct(df["AllocTRES"], gpus_in_tres), errors="coerce")
    gpus = gpus.fillna(nnodes.fillna(0) * gpus_per_node)

    start_key = df["Start"].where(~df["Start"].isin(NULL_TIMES), "")
    key = df["JobIDRaw"] + ":" + df["Submit"] + ":" + start_key

    for idx in df.index[bad]:
        report.add_bad(int(lines[idx]), why[idx] or "unparsable row")
    keep = ~bad & ~pending
    report.skipped += int((~bad & pending).sum())

    # Expand each distinct NodeList once; an unparsable one makes its rows bad.
    for nodelist in pd.unique(df["NodeList"][keep]):
        if nodelist not in nodes_cache:
            try:
                nodes_cache[nodelist] = list(dict.fromkeys(_expand(nodelist)))
            except hostlist.HostlistError:
                nodes_cache[nodelist] = None
    broken = [n for n in pd.unique(df["NodeList"][keep]) if nodes_cache[n] is None]
    if broken:
        wrong = keep & df["NodeList"].isin(broken)
        for idx in df.index[wrong]:
            report.add_bad(int(lines[idx]), f"NodeList is not a hostlist: {df['NodeList'][idx]!r}")
        keep &= ~wrong
    report.bad.sort(key=lambda b: b.line)

    def col(series: pd.Series) -> list:
        return series[keep].to_numpy(dtype=object).tolist()

    nodelists = col(df["NodeList"])
    rows = list(
        zip(
            col(df["JobIDRaw"]),
            col(df["JobID"]),
            col(df["JobName"]),
            col(df["User"]),
            col(df["Partition"]),
            col(state),
            col(df["ExitCode"]),
            col(submit),
            col(eligible),
            col(start),
            col(end),
            nnodes[keep].astype(int).tolist(),
            gpus[keep].astype(int).tolist(),
            nodelists,
            col(key),
            strict=True,
        )
    )
    _write_jobs(conn, rows, [nodes_cache[n] for n in nodelists])
    report.written += len(rows)


_ONE_BRACKET = re.compile(r"([^\[\],\s]+)\[([\d,\-]+)\]")
_NUMBERS = re.compile(r"(\d+)(?:-(\d+))?")


def _expand(nodelist: str) -> list[str]:
    """hostlist.expand, with a fast path for the common `prefix[lo-hi,...]` form (a big
    file has tens of thousands of distinct ones); anything else goes to hostlist.expand."""
    whole = _ONE_BRACKET.fullmatch(nodelist)
    if whole:
        prefix, body = whole.groups()
        hosts: list[str] = []
        for piece in body.split(","):
            m = _NUMBERS.fullmatch(piece)
            if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
                return hostlist.expand(nodelist)  # its error message, or its answer
            lo, hi, width = int(m.group(1)), int(m.group(2) or m.group(1)), len(m.group(1))
            hosts.extend([f"{prefix}{n:0{width}d}" for n in range(lo, hi + 1)])
        return hosts
    return hostlist.expand(nodelist)


def _is_range(nodelist: str) -> bool:
    """A NodeList that names more than one host (or a bracketed one); the rest is one name."""
    return "[" in nodelist or "," in nodelist


def _write_jobs(conn, rows: list[tuple], node_lists: list[list[str]]) -> None:
    """Upsert job instances; write job_nodes only for instances that are new.

    Nine jobs in ten run on one node (the paper's Fig. 6), whose NodeList is the node's name:
    the database copies those itself (INSERT ... SELECT); only bracketed or comma lists come
    back through Python for their expansion.
    """
    if not rows:
        return
    J = schema.jobs
    max_before = conn.execute(select(J.c.id).order_by(J.c.id.desc()).limit(1)).scalar() or 0
    bulk_write(conn, J, JOB_COLUMNS, rows, conflict=("instance_key",), update=UPDATABLE)
    is_new = J.c.id > max_before
    single = and_(
        is_new,
        J.c.nodelist.not_in(NO_NODES),
        J.c.nodelist.not_like("%[%"),
        J.c.nodelist.not_like("%,%"),
    )
    conn.execute(
        schema.job_nodes.insert().from_select(
            ["job_pk", "node"], select(J.c.id, J.c.nodelist).where(single)
        )
    )
    multi = [
        (row[-1], hosts) for row, hosts in zip(rows, node_lists, strict=True) if _is_range(row[13])
    ]
    if not multi:
        return
    ranged = or_(J.c.nodelist.like("%[%"), J.c.nodelist.like("%,%"))
    new = dict(conn.execute(select(J.c.instance_key, J.c.id).where(is_new, ranged)).all())
    node_rows = []
    for key, hosts in multi:
        pk = new.get(key)
        if pk is not None:
            node_rows.extend([(pk, h) for h in hosts])
    bulk_write(conn, schema.job_nodes, ("job_pk", "node"), node_rows, conflict=("job_pk", "node"))


def get_cursor(engine: Engine) -> str | None:
    with engine.connect() as conn:
        t = schema.ingest_cursors
        return conn.execute(select(t.c.value).where(t.c.name == CURSOR)).scalar()


def set_cursor(conn, value: str) -> None:
    bulk_write(
        conn,
        schema.ingest_cursors,
        ("name", "value"),
        [(CURSOR, value)],
        conflict=("name",),
        update=("value",),
    )


def ingest_incremental(
    engine: Engine,
    *,
    since: str | None = None,
    gpus_per_node: int = 8,
    timeout_s: float = 600,
    default_start: str = "1970-01-01T00:00:00",
    overlap_s: int = 3600,
) -> IngestReport:
    """Run sacct from the stored cursor (or `since`) to now; advance the cursor on success.

    sacct -S/-E selects every job that was in any state during the window, so a job still
    running at the end of one window is read again, finished, by the next. slurmdbd learns of
    a job's end a little after it happens (seen: seconds on an idle test cluster; longer when
    slurmctld is queueing records for it), so the next window starts `overlap_s` before this
    one ended; re-reading those rows changes nothing.
    """
    start = since or get_cursor(engine) or default_start
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    text = run_sacct(start, now.strftime(_SACCT_TIME), timeout_s)
    report = ingest_text(engine, text, gpus_per_node=gpus_per_node)
    with engine.begin() as conn:
        set_cursor(conn, (now - timedelta(seconds=overlap_s)).strftime(_SACCT_TIME))
    return report
