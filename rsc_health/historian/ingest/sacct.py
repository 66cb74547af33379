"""Job instances from Slurm accounting: `sacct -a -X -D --parsable2` output, run or from a file.

`-X` gives one line per job allocation (no steps) and `-D` one line per instance of a requeued
job, so a job that was requeued twice is three rows with the same JobIDRaw; they are told
apart by `instance_key` = JobIDRaw:Submit:Start. Columns are matched by header name, in any
order. Times are taken as UTC: we run sacct with TZ=UTC, and a file should be made the same
way (`TZ=UTC sacct ...`).

Speed matters (a large cluster's year is millions of rows), so the file is parsed by pandas'
C reader in chunks and every transform is vectorised or one list comprehension per column; the
hostlist expansion is done once per distinct NodeList string, and the database itself turns
those into job_nodes rows (one JSON array per NodeList in a temporary table). Jobs go in with
the driver's executemany on SQLite and with COPY into a temporary table plus one
INSERT ... SELECT ... ON CONFLICT on PostgreSQL. A first backfill (empty jobs table) drops
the secondary indexes (and on PostgreSQL job_nodes' key and foreign key) and adds them back,
sorted, at the end of the same transaction.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine, inspect, select
from sqlalchemy.exc import OperationalError

from rsc_health import hostlist
from rsc_health.historian import schema
from rsc_health.historian.db import refresh_statistics
from rsc_health.historian.ingest import (
    BATCH_ROWS,
    IngestReport,
    bulk_write,
    run_accounting,
    upsert_sql,
)

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
# A load this big changes the tables' sizes enough that the planner needs new statistics.
ANALYZE_AFTER_ROWS = 50_000
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


def _times(raw: pd.Series, name: str, bad: pd.Series, why: pd.Series) -> np.ndarray:
    """sacct times -> DB text (None for Unknown/None); marks unparsable values bad."""
    parsed = pd.to_datetime(raw, format=_SACCT_TIME, errors="coerce")
    is_null = raw.isin(NULL_TIMES)
    wrong = parsed.isna() & ~is_null
    if wrong.any():
        why.loc[wrong & ~bad] = name + " is not a time: " + raw[wrong & ~bad]
        bad |= wrong
    ok = (~parsed.isna()).to_numpy()
    # "2024-03-01T08:00:00" -> "2024-03-01 08:00:00.000000", SQLAlchemy's stored form; a
    # parsed value has exactly one "T" (replace + concatenation measured a third faster than
    # slicing into an f-string, and faster than building the characters in numpy)
    text = np.array(
        [
            t.replace("T", " ") + ".000000" if good else None
            for t, good in zip(raw.to_numpy(dtype=object).tolist(), ok.tolist(), strict=True)
        ],
        dtype=object,
    )
    return text


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
    nodes_cache: dict[str, str | None] = {}  # NodeList -> JSON array of its hosts
    with engine.connect() as conn:
        rollback_journal = _sqlite_bulk_journal(conn)
        foreign_keys = _sqlite_foreign_keys(conn, False)
        try:
            with conn.begin():
                _load(conn, source, report, gpus_per_node, nodes_cache)
        finally:
            if rollback_journal:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
                conn.commit()
            if foreign_keys:
                _sqlite_foreign_keys(conn, True)
    if report.written >= ANALYZE_AFTER_ROWS:
        refresh_statistics(engine)
    return report


def _sqlite_foreign_keys(conn, on: bool) -> bool:
    """Switch SQLite's foreign-key enforcement (only possible outside a transaction); True
    when it was on. The load writes job_nodes only from `jobs.id` read in the same statement
    and deletes nothing, so checking every job_nodes row against jobs (about a quarter of
    the job_nodes insert) proves nothing; the caller turns it back on after the load."""
    if conn.dialect.name != "sqlite":
        return False
    was = bool(conn.exec_driver_sql("PRAGMA foreign_keys").scalar())
    conn.exec_driver_sql(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    conn.commit()
    return was


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
    restore = _defer_pg_constraints(conn, bool(deferred))
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
    for statement in restore:
        conn.exec_driver_sql(statement)


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
    """When the jobs table is empty (a first backfill), drop the secondary indexes for the
    load; the caller recreates them in the same transaction (DDL is transactional in SQLite
    and PostgreSQL), so a failed load rolls back to the indexed, empty table."""
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


def _defer_pg_constraints(conn, first_load: bool) -> list[str]:
    """PostgreSQL checks job_nodes' foreign key with a trigger per row and inserts into its
    primary-key index row by row (measured on 300k jobs: 2.4 s of a 2.4 s job_nodes insert
    went to these two and the node index). On a first backfill drop both for the load and hand
    back the ALTER TABLEs that add them again: one sort for the key, one join for the
    foreign key, both still checking every row. Same transaction, so a failed load keeps
    them. (SQLite: job_nodes is its key, and its foreign-key check is off for any load.)"""
    if conn.dialect.name != "postgresql" or not first_load:
        return []
    insp = inspect(conn)
    quote = conn.dialect.identifier_preparer.quote
    pk = insp.get_pk_constraint("job_nodes")
    fks = [fk for fk in insp.get_foreign_keys("job_nodes") if fk["referred_table"] == "jobs"]
    if pk.get("constrained_columns") != ["job_pk", "node"] or len(fks) != 1:
        return []  # not the schema this code knows: leave it alone
    fk_name, pk_name = quote(fks[0]["name"]), quote(pk["name"])
    conn.exec_driver_sql(f"ALTER TABLE job_nodes DROP CONSTRAINT {fk_name}")
    conn.exec_driver_sql(f"ALTER TABLE job_nodes DROP CONSTRAINT {pk_name}")
    return [
        f"ALTER TABLE job_nodes ADD CONSTRAINT {pk_name} PRIMARY KEY (job_pk, node)",
        f"ALTER TABLE job_nodes ADD CONSTRAINT {fk_name} FOREIGN KEY (job_pk) "
        "REFERENCES jobs (id) ON DELETE CASCADE",
    ]


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
    no_submit = pd.Series(pd.isna(submit), index=df.index) & ~bad
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

    for idx in df.index[bad]:
        report.add_bad(int(lines[idx]), why[idx] or "unparsable row")
    keep = ~bad & ~pending
    report.skipped += int((~bad & pending).sum())

    # Expand each distinct NodeList once; an unparsable one makes its rows bad.
    distinct = pd.unique(df["NodeList"][keep])
    for nodelist in distinct:
        if nodelist not in nodes_cache:
            nodes_cache[nodelist] = _hosts(nodelist)
    broken = [n for n in distinct if nodes_cache[n] is None]
    if broken:
        wrong = keep & df["NodeList"].isin(broken)
        for idx in df.index[wrong]:
            report.add_bad(int(lines[idx]), f"NodeList is not a hostlist: {df['NodeList'][idx]!r}")
        keep &= ~wrong
    report.bad.sort(key=lambda b: b.line)

    mask = keep.to_numpy()

    def col(values) -> list:
        if isinstance(values, pd.Series):
            values = values.to_numpy(dtype=object)
        return values[mask].tolist()

    columns = [
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
        col(df["NodeList"]),
    ]
    # "<JobIDRaw>:<Submit>:<Start or ''>" as sacct wrote them; a kept row's Start is a time
    # exactly when its converted start is not None
    columns.append(
        [
            f"{j}:{sub}:{sta}" if converted is not None else f"{j}:{sub}:"
            for j, sub, sta, converted in zip(
                columns[0], col(df["Submit"]), col(df["Start"]), columns[9], strict=True
            )
        ]
    )
    hosts = {n: nodes_cache[n] for n in distinct if nodes_cache[n] not in (None, "[]")}
    _write_jobs(conn, columns, hosts)
    report.written += len(columns[0])


def _hosts(nodelist: str) -> str | None:
    """The hosts a NodeList names, each once, as a JSON array; None when it is not a hostlist.
    A plain name is itself (as stored before), a no-node marker none."""
    if nodelist in NO_NODES:
        return "[]"
    if not _is_range(nodelist):
        return json.dumps([nodelist])
    try:
        return json.dumps(list(dict.fromkeys(_expand(nodelist))))
    except hostlist.HostlistError:
        return None


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


def _upsert_sql(conn, source: str) -> str:
    return upsert_sql(conn, "jobs", JOB_COLUMNS, source, conflict=("instance_key",),
                      update=UPDATABLE)


def _write_jobs(conn, columns: list[list], hosts: dict[str, str]) -> None:
    """Upsert job instances (columns in JOB_COLUMNS order); write job_nodes for the new ones.

    `hosts` maps each NodeList of the chunk to its hosts as a JSON array (made once per
    distinct NodeList in the whole load). They go to a temporary table, one row per distinct
    NodeList (tens of thousands, against millions of job_nodes rows),
    and the database expands them for the new instances in one INSERT ... SELECT, in job
    order, so job_nodes grows at its end.
    """
    if not columns[0]:
        return
    J = schema.jobs
    max_before = conn.execute(select(J.c.id).order_by(J.c.id.desc()).limit(1)).scalar() or 0
    if conn.dialect.name == "postgresql":
        _copy_jobs(conn, columns)
        hosts_sql = "CROSS JOIN LATERAL jsonb_array_elements_text(h.hosts::jsonb) AS e(value)"
        mark = "%s"
    else:
        sql = _upsert_sql(conn, f"VALUES ({', '.join('?' * len(JOB_COLUMNS))})")
        # The driver's executemany straight from the columns: no list of row tuples.
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            cursor.executemany(sql, zip(*columns, strict=True))
        finally:
            cursor.close()
        hosts_sql = ", json_each(h.hosts) AS e"
        mark = "?"
    _stage(
        conn,
        "ingest_hosts",
        "nodelist TEXT PRIMARY KEY, hosts TEXT NOT NULL",
        ("nodelist", "hosts"),
        hosts.items(),
    )
    conn.exec_driver_sql(
        "INSERT INTO job_nodes (job_pk, node) "
        f"SELECT j.id, e.value FROM jobs AS j JOIN ingest_hosts AS h ON h.nodelist = j.nodelist "
        f"{hosts_sql} WHERE j.id > {mark} ORDER BY j.id "
        # no conflict target: on a first PostgreSQL backfill the key is added after the load
        "ON CONFLICT DO NOTHING",
        (max_before,),
    )


def _stage(conn, name: str, ddl: str, names: tuple[str, ...], rows) -> None:
    """Fill the temporary table `name` (created on first use in this transaction, emptied
    otherwise) with rows: COPY on PostgreSQL, executemany on SQLite."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {name} ({ddl}) ON COMMIT DROP")
        conn.exec_driver_sql(f"TRUNCATE {name}")
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            quoted = ", ".join(conn.dialect.identifier_preparer.quote(n) for n in names)
            with cursor.copy(f"COPY {name} ({quoted}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        finally:
            cursor.close()
        return
    conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {name} ({ddl})")
    conn.exec_driver_sql(f"DELETE FROM temp.{name}")
    marks = ", ".join("?" * len(names))
    rows = iter(rows)
    while batch := list(islice(rows, BATCH_ROWS)):
        conn.exec_driver_sql(f"INSERT INTO temp.{name} VALUES ({marks})", batch)


_PG_STAGED_DDL = (
    'seq bigint, job_id text, job_id_display text, name text, "user" text, partition text, '
    'state text, exit_code text, submit text, eligible text, start text, "end" text, '
    "nnodes integer, gpus integer, nodelist text, instance_key text"
)


def _copy_jobs(conn, columns: list[list]) -> None:
    """PostgreSQL: COPY the chunk into a temporary table, then one INSERT ... SELECT ...
    ON CONFLICT. One statement may not update a row twice, so a key seen more than once in
    the chunk (an sacct file read twice, concatenated) goes in rounds, in file order: the
    n-th occurrence of each key in round n, which is what row-by-row upserts would do."""
    n = len(columns[0])
    occurrence = pd.Series(columns[-1]).groupby(columns[-1], sort=False).cumcount().to_numpy()
    quote = conn.dialect.identifier_preparer.quote
    staged = ["seq", *JOB_COLUMNS]
    cast = {c: f"{quote(c)}::timestamp" for c in ("submit", "eligible", "start", "end")}
    select_list = ", ".join(cast.get(c, quote(c)) for c in JOB_COLUMNS)
    sql = _upsert_sql(conn, f"SELECT {select_list} FROM ingest_jobs ORDER BY seq")
    rounds = int(occurrence.max()) + 1
    for round_ in range(rounds):
        picked = range(n) if rounds == 1 else np.flatnonzero(occurrence == round_).tolist()
        rows = ((i, *(c[i] for c in columns)) for i in picked)
        _stage(conn, "ingest_jobs", _PG_STAGED_DDL, tuple(staged), rows)
        conn.exec_driver_sql(sql)


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
