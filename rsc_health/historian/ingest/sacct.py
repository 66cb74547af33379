"""Job instances from Slurm accounting: `sacct --json` or `--parsable2` output, run or read.

`ingest_incremental` runs sacct through the Accounting it is given (typed errors, a timeout;
`rsc_health.slurm.from_config(cfg).accounting(...)` in `healthctl`, so [slurm] bin_dir holds)
with --json where the release has it (22.05's Debian build does), and --parsable2 with the unit
separator as delimiter where it does not. `sacct_parse` reads both and the `|` files of older
exports: a name with `|`, a newline or bytes that are not UTF-8 never costs a job.

`-X` gives one line per job allocation (no steps) and `-D` one line per instance of a requeued
job, so a job that was requeued twice is three rows with the same JobIDRaw; they are told
apart by `instance_key` = JobIDRaw:Submit:Start (each requeue stamps a new Submit). A Start
slurmctld resets once nodes booted for the job changes the key of the same instance: the open
row read before is dropped (`_OPEN_SUPERSEDED`). Columns are matched by header name, in any
order. Times are taken as UTC: we run sacct with TZ=UTC, and a file should be made the same
way (`TZ=UTC sacct ...`).

Speed matters (a large cluster's year is millions of rows). `sacct_parse` reads and checks
the file with Arrow, block by block. Each NodeList is expanded once, and the database itself
turns those into job_nodes rows (one JSON array per NodeList in a temporary table).

How the rows go in:
- A first backfill into a SQLite file that nobody else has open is written by
  `sqlite_bulk` (ADBC: Arrow columns bound in C).
- Any other SQLite load goes through the driver's executemany.
- PostgreSQL takes binary COPY straight into jobs and job_nodes while no key of the load is
  stored already, else into a temporary table plus one INSERT ... SELECT ... ON CONFLICT
  (`sacct_pg`).

A first backfill (empty jobs table) drops the secondary indexes (and on PostgreSQL job_nodes'
key and foreign key, and jobs' keys while it can: sacct_pg) and adds them back, sorted, in
the same transaction.
"""

from __future__ import annotations

import io
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import Engine, func, inspect, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateIndex

from rsc_health.historian import schema
from rsc_health.historian.db import refresh_statistics, sqlite_outside_transaction, writer
from rsc_health.historian.ingest import (
    BATCH_ROWS,
    STATEMENT_TIMEOUT_S,
    IngestReport,
    bulk_write,
    database_failed,
    limit_statements,
    parse_time,
    sacct_pg,
    sqlite_bulk,
    upsert_sql,
)
from rsc_health.historian.ingest.prefetch import prefetch
from rsc_health.historian.ingest.sacct_parse import (
    FIELDS,
    JOB_COLUMNS,
    OPTIONAL_FIELDS,
    BlockProblems,
    SacctError,
    blocks,
    exit_codes,
)
from rsc_health.slurm.accounting import Accounting, cluster_name, sacct_parsable_argv
from rsc_health.slurm.api import SlurmCommandError, SlurmError

NOT_STARTED = "PENDING: not an instance until it starts (read again then)"
SUPERSEDED = ("open, its Start reset later by slurmctld (nodes booted for it): the earlier row "
              "dropped")
JOB_STEP = "a job step (sacct without -X): part of its job's instance"
MERGED_SAME_INSTANCE = "same job instance twice in one load: the later row kept"

__all__ = ["FIELDS", "JOB_COLUMNS", "SacctError", "ingest_text", "ingest_incremental"]

CURSOR = "sacct"
SACCT_FORMS = ("auto", "json", "parsable")
# A load this big changes the tables' sizes enough that the planner needs new statistics.
ANALYZE_AFTER_ROWS = 50_000
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
# A running job's row is re-read later with its final state: these may change, nothing else;
# and an ended job's row is final (an older export's running row read later changes nothing).
UPDATABLE = ("state", "exit_code", "eligible", "end", "gpus", "nodelist", "nnodes")


def sacct_argv(start: str, end: str) -> list[str]:
    """The --parsable2 form (unit separator, JobName in the middle: see sacct_parse)."""
    return sacct_parsable_argv(start, end, (*FIELDS, *OPTIONAL_FIELDS))


def run_sacct(
    start: str, end: str, acct: Accounting, *, form: str = "auto", jobs: Sequence[str] = ()
) -> tuple[bytes, dict[str, str] | None]:
    """sacct's output for [start, end], times in UTC, and the exit codes that go with it.

    --json where the release has it (`form` "auto" or "json"): no user text can shift a field.
    22.05's JSON loses a job's exit code, so a second run reads JobIDRaw, Submit, Start and
    ExitCode (no free text in them) and its codes win. --parsable2 with the unit separator
    ("parsable", or "auto" on a release whose sacct refuses --json). Only the job ids `jobs`
    (sacct -j) when given. SacctError when sacct is missing, silent or refuses."""
    if form not in SACCT_FORMS:
        raise SacctError(f"[historian] sacct_format must be one of {', '.join(SACCT_FORMS)}, "
                         f"not {form!r}")
    try:
        if form in ("auto", "json"):
            try:
                data = acct.sacct_json(start, end, *_jobs(jobs))
            except SlurmCommandError as exc:
                if form == "json" or "json" not in exc.stderr.lower():
                    raise
            else:
                return data, exit_codes(acct.sacct_exit_codes(start, end, *_jobs(jobs)))
        return acct.sacct_parsable(start, end, (*FIELDS, *OPTIONAL_FIELDS), *_jobs(jobs)), None
    except SlurmError as exc:
        raise SacctError(str(exc)) from exc


def _jobs(jobs: Sequence[str]) -> tuple:
    """The `jobs` argument for an Accounting run: none at all for a window (an Accounting
    of before, or a test's, need not take it)."""
    return (list(jobs),) if jobs else ()


def ingest_text(
    engine: Engine,
    source: io.IOBase | Path | str | bytes,
    *,
    gpus_per_node: int = 8,
    statement_timeout_s: float = STATEMENT_TIMEOUT_S,
    exit_codes: dict[str, str] | None = None,
    cluster: str = "",
    default_cluster: str = "",
    seen: set[str] | None = None,
) -> IngestReport:
    """Load sacct output, --json or --parsable2 (a path, an open file, the text or its bytes).

    The load is one transaction: a database that fails or goes away mid-load raises
    SacctError with one line (nothing of this load kept); a second load into the same SQLite
    file waits for the first (busy timeout), and says so in one line if it waits too long.
    On PostgreSQL every statement has `statement_timeout_s`.

    Each job's cluster is `cluster` when given ([historian] cluster), else the input's Cluster
    field, else `default_cluster` (slurm.conf's ClusterName for a run of sacct), else ''.
    `seen`, when given, gets the JobIDRaw of every instance read."""
    try:
        return _ingest(engine, source, gpus_per_node, statement_timeout_s, exit_codes,
                       (cluster, default_cluster), seen)
    except DBAPIError as exc:
        raise SacctError(_database_failed(engine, exc)) from exc
    except Exception as exc:
        if type(exc).__module__.startswith("adbc_driver"):  # the SQLite bulk path's driver
            raise SacctError(_database_failed(engine, exc)) from exc
        raise


def _database_failed(engine: Engine, exc: Exception) -> str:
    return database_failed("sacct", exc)


def _ingest(engine, source, gpus_per_node, statement_timeout_s, exit_codes,
            clusters: tuple[str, str], seen: set[str] | None = None) -> IngestReport:
    report = IngestReport("sacct")
    hosts_cache: dict[str, str | None] = {}  # NodeList -> JSON array of its hosts
    # Parsing (and for PostgreSQL, encoding for COPY) runs a block ahead of the writes, on
    # a second thread, which also keeps the report (read only once the load has ended).
    stream = _reported(
        blocks(source, gpus_per_node=gpus_per_node, hosts_cache=hosts_cache,
               exit_codes=exit_codes, text_times=engine.dialect.name != "postgresql"),
        report,
        *clusters,
        seen,
    )
    if engine.dialect.name == "postgresql":
        stream = sacct_pg.prepared(stream)
    parsed = prefetch(stream)
    with engine.connect() as conn:
        rollback_journal = _sqlite_bulk_journal(conn)
    try:
        bulk_file = sqlite_bulk.usable_file(engine) if rollback_journal else None
        if bulk_file is not None:
            superseded = sqlite_bulk.run(engine, bulk_file,
                                         lambda cursor: _bulk_load(cursor, engine, parsed))
        else:
            with engine.connect() as conn:
                foreign_keys = _sqlite_foreign_keys(conn, False)
                try:
                    with writer(conn).begin():
                        superseded = _load(conn, parsed, statement_timeout_s)
                finally:
                    if foreign_keys:
                        _sqlite_foreign_keys(conn, True)
    finally:
        parsed.close()  # a failed load stops the parsing thread now, not when collected
        if rollback_journal:
            with engine.connect() as conn:
                sqlite_outside_transaction(conn, "PRAGMA journal_mode=WAL")
    report.note(SUPERSEDED, superseded)
    if report.written >= ANALYZE_AFTER_ROWS:
        refresh_statistics(engine, ("jobs", "job_nodes"))
    return report


def _reported(parsed, report: IngestReport, cluster: str = "", default_cluster: str = "",
              seen: set[str] | None = None):
    """The parsed blocks, with what each could not take added to `report` as it goes and
    the rows each hands on counted as written; each job's cluster named (see ingest_text)."""
    problems: BlockProblems
    keys: list = []  # each block's distinct instance keys, hashed (a duplicate is merged)
    for block, problems in parsed:
        if cluster or default_cluster:
            named = block.jobs.column("cluster")
            if cluster:
                named = pa.array([cluster] * block.jobs.num_rows, pa.string())
            else:
                named = pc.if_else(pc.equal(named, ""), default_cluster, named)
            at = block.jobs.schema.get_field_index("cluster")
            block.jobs = block.jobs.set_column(at, "cluster", named)
        for line, message in problems.bad:
            report.add_bad(line, message)
        report.read += problems.read
        report.replaced += problems.replaced
        report.skip(NOT_STARTED, problems.pending - problems.steps)
        report.skip(JOB_STEP, problems.steps)
        report.written += block.jobs.num_rows
        # a job's cluster with its key: two clusters' jobs with one key are two (own_keys)
        keys.append(_hashed_keys(pc.binary_join_element_wise(
            block.jobs.column("instance_key"), block.jobs.column("cluster"), "@")))
        if seen is not None:
            seen.update(pc.unique(block.jobs.column("job_id")).to_pylist())
        newest = _newest_time(block)
        if newest is not None and (report.newest is None or newest > report.newest):
            report.newest = newest
        yield block
    report.bad.sort(key=lambda b: b.line)
    # A job instance read twice in one load (sacct -D prints a requeued job's records, two
    # exports overlap) is one row: the later one kept (the upsert's), counted as merged.
    distinct = len(np.unique(np.concatenate(keys))) if keys else 0
    twice = report.written - distinct
    report.written -= twice
    report.merge(MERGED_SAME_INSTANCE, twice)


def _hashed_keys(column) -> np.ndarray:
    """64-bit hashes of a block's instance keys (pandas' hash_array: two distinct keys
    among millions share one with probability ~1e-7, and a row is only counted, never
    written, by it)."""
    values = column.to_numpy(zero_copy_only=False)
    return pd.util.hash_array(np.asarray(values, dtype=object), categorize=False)


def _newest_time(block) -> datetime | None:
    """The newest Start or End of a block's jobs (timestamps as parsed, `Block.times`; else
    the text SQLite stores), naive UTC; None when no job has one."""
    newest = None
    for name in ("start", "end"):
        column = block.times.get(name)
        if column is None:
            column = block.jobs.column(name)
        value = pc.max(column).as_py()
        if isinstance(value, str):
            try:
                value = parse_time(value) if value else None
            except ValueError:
                value = None
        if isinstance(value, datetime):
            value = value.replace(tzinfo=None)
            newest = value if newest is None or value > newest else newest
    return newest


def _sqlite_foreign_keys(conn, on: bool) -> bool:
    """Switch SQLite's foreign-key enforcement (only possible outside a transaction); True
    when it was on. The load writes job_nodes only from `jobs.id` read in the same statement
    and deletes a job's rows only with what hangs off it (`_drop_jobs_sql`), so checking every
    job_nodes row against jobs (about a quarter of the job_nodes insert) proves nothing; the
    caller turns it back on after the load."""
    if conn.dialect.name != "sqlite":
        return False
    was = bool(sqlite_outside_transaction(conn, "PRAGMA foreign_keys"))
    sqlite_outside_transaction(conn, f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    return was


def _load(conn, parsed, statement_timeout_s: float = 0) -> int:
    """Write the parsed blocks in the caller's transaction; the superseded rows dropped
    (`_OPEN_SUPERSEDED`), their number returned."""
    limit_statements(conn, statement_timeout_s)
    if conn.dialect.name == "sqlite":
        # A big file inserts into indexes far larger than SQLite's 2 MiB default page
        # cache; a bigger cache for this connection cuts ingest CPU by about a fifth.
        conn.exec_driver_sql(f"PRAGMA cache_size=-{sqlite_bulk.CACHE_KIB}")
        # Let CREATE INDEX sort on a second core.
        conn.exec_driver_sql("PRAGMA threads=2")
        # The caller began with BEGIN IMMEDIATE (db.writer): the write lock is taken under
        # the busy timeout before anything is read, and the index drops below are part of
        # the load's transaction (a failed load keeps its indexes).
    elif conn.dialect.name == "postgresql":
        sacct_pg.lock(conn)  # before looking at the table: a concurrent load waits here
    deferred = _defer_indexes(conn)
    restore = _defer_pg_constraints(conn, bool(deferred))
    if conn.dialect.name == "postgresql":
        sacct_pg.load(conn, parsed, lambda source: _upsert_sql(conn, source),
                      first_load=bool(deferred), own_keys=own_keys)
    else:
        for block in parsed:
            # A first backfill's table held no key (and is left unasked, for speed): the
            # block's own rows only.
            block.jobs = own_keys(conn, block.jobs, look_up=not deferred)
            columns = [block.jobs.column(c).to_pylist() for c in JOB_COLUMNS]
            _write_jobs(conn, columns, block.hosts_json())
    for index in deferred:
        index.create(conn)
    for statement in restore:
        conn.exec_driver_sql(statement)
    ids = [int(pk) for pk in conn.exec_driver_sql(_OPEN_SUPERSEDED).scalars()]
    for statement in _drop_jobs_sql(ids):
        conn.exec_driver_sql(statement)
    return len(ids)


_PG_KEYS = 2000


def own_keys(conn, jobs: pa.Table, *, look_up: bool = True) -> pa.Table:
    """`jobs` with the instance key of each job whose JobIDRaw:Submit:Start another
    cluster's job holds made <key>@<cluster>: two clusters number their jobs apart, and two
    set up together can give the same id to jobs submitted and started in the same seconds.
    Without it the second updated the first's row (or was lost in it, its end being final).
    The holder is the stored row (`look_up`: one indexed look-up per key, BATCH_ROWS keys a
    statement), else the block's first row with the key. A job that names no cluster, or a
    stored row that names none (read before the cluster was known: the upsert names it
    now), keeps the plain key; so a re-read of either cluster's job finds its own row."""
    clusters = jobs.column("cluster")
    if not pc.any(pc.not_equal(clusters, "")).as_py():
        return jobs
    keys = jobs.column("instance_key").to_pylist()
    clusters = clusters.to_pylist()
    held: dict[str, str] = {}
    if look_up:
        asked = sorted({k for k, c in zip(keys, clusters, strict=True) if c})
        J = schema.jobs
        if conn.dialect.name == "postgresql":
            # One array parameter: PostgreSQL plans IN with thousands of parameters slowly
            # (measured, 20,000 keys of 2M jobs: 480 ms as IN, 100 ms as ANY in 2,000s;
            # larger arrays it answers with a sequential scan).
            lookup = text("SELECT instance_key, cluster FROM jobs "
                          "WHERE instance_key = ANY(:keys) AND cluster <> ''")
            for at in range(0, len(asked), _PG_KEYS):
                held.update(conn.execute(lookup, {"keys": asked[at:at + _PG_KEYS]}).all())
        else:
            for at in range(0, len(asked), BATCH_ROWS):
                held.update(conn.execute(select(J.c.instance_key, J.c.cluster).where(
                    J.c.instance_key.in_(asked[at:at + BATCH_ROWS]), J.c.cluster != "")).all())
    owned = []
    for k, c in zip(keys, clusters, strict=True):
        holder = held.setdefault(k, c) if c else c
        owned.append(f"{k}@{c}" if holder != c else k)
    if owned == keys:
        return jobs
    at = jobs.schema.get_field_index("instance_key")
    return jobs.set_column(at, "instance_key", pa.array(owned, jobs.schema.field(at).type))


def _bulk_load(cursor, engine: Engine, parsed) -> int:
    """A first backfill on an ADBC cursor (sqlite_bulk): the same statements as `_load`'s
    SQLite path, with each block's Arrow columns bound in C."""
    indexes = _deferrable_indexes()
    quote = engine.dialect.identifier_preparer.quote
    for index in indexes:
        cursor.execute(f"DROP INDEX IF EXISTS {quote(index.name)}")
    cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS ingest_hosts ({_HOSTS_DDL})")
    upsert = _upsert_sql(engine, f"VALUES ({', '.join('?' * len(JOB_COLUMNS))})")
    for block in parsed:
        if not block.jobs.num_rows:
            continue
        block.jobs = own_keys(None, block.jobs, look_up=False)  # the table held nothing
        max_before = _max_id(cursor)
        cursor.executemany(upsert, block.jobs.select(list(JOB_COLUMNS)))
        if _max_id(cursor) == max_before + block.jobs.num_rows:
            # Every row was new, so row i got id max_before + 1 + i: bind job_nodes as is.
            pk = pc.add(block.job_nodes.column("row"), max_before + 1)
            cursor.executemany(
                "INSERT INTO job_nodes (job_pk, node) VALUES (?, ?)",
                pa.table({"job_pk": pk, "node": block.job_nodes.column("node")}),
            )
            continue
        # An instance seen earlier in the file was updated, not added: let the database
        # match the new rows to their hosts.
        hosts = block.hosts_json()
        cursor.execute("DELETE FROM temp.ingest_hosts")
        cursor.executemany(
            "INSERT INTO temp.ingest_hosts VALUES (?, ?)",
            pa.table({"nodelist": list(hosts), "hosts": list(hosts.values())},
                     schema=_HOSTS_SCHEMA),
        )
        cursor.execute(_JOB_NODES_SQL, (max_before,))
    for index in indexes:
        cursor.execute(str(CreateIndex(index).compile(dialect=engine.dialect)))
    cursor.execute("DROP TABLE temp.ingest_hosts")
    cursor.execute(_OPEN_SUPERSEDED)
    ids = [int(pk) for pk, in cursor.fetchall()]
    for statement in _drop_jobs_sql(ids):
        cursor.execute(statement)
    return len(ids)


def _max_id(cursor) -> int:
    cursor.execute("SELECT coalesce(max(id), 0) FROM jobs")
    return int(cursor.fetchone()[0])


_HOSTS_DDL = "nodelist TEXT PRIMARY KEY, hosts TEXT NOT NULL"
_HOSTS_SCHEMA = pa.schema([("nodelist", pa.string()), ("hosts", pa.string())])


# job_nodes rows for the jobs above the id bound to the one parameter, from each job's
# NodeList's hosts staged in ingest_hosts, in job order, so job_nodes grows at its end.
# (sacct_pg has PostgreSQL's.)
_JOB_NODES_SQL = (
    "INSERT INTO job_nodes (job_pk, node) "
    "SELECT j.id, e.value FROM jobs AS j JOIN ingest_hosts AS h ON h.nodelist = j.nodelist, "
    "json_each(h.hosts) AS e WHERE j.id > ? ORDER BY j.id ON CONFLICT DO NOTHING"
)


# An instance's rows still open (no end) that a row of the same job, submission and cluster
# with a later Start supersedes: slurmctld sets a job's Start when it allocates nodes, and sets
# it again once nodes that boot for it (power saving, --reboot, a feature change) are up
# (job_config_fini), rewriting the same slurmdbd record. The instance key (JobIDRaw:Submit:
# Start) changes with it, so the row read while they booted would never get its end: its nodes
# in a job for ever (telemetry rollups, fail-slow placements), and the re-read of open jobs
# never asks (the job id was in the window). Only one instance of a job runs at a time, and a
# requeued one gets a new Submit (slurmctld stamps it once the requeued run's epilog is done),
# so the later Start is the same run, not another instance. Every open row is looked at (as
# many as jobs run: ix_jobs_end), so one a load from before this left is dropped too.
_OPEN_SUPERSEDED = (
    'SELECT old.id FROM jobs AS old WHERE old."end" IS NULL AND old.start IS NOT NULL '
    "AND EXISTS (SELECT 1 FROM jobs AS new WHERE new.job_id = old.job_id "
    "AND new.submit = old.submit AND new.start > old.start "
    "AND (new.cluster = old.cluster OR new.cluster = '' OR old.cluster = '')) ORDER BY old.id"
)


def _drop_jobs_sql(ids: list[int]) -> list[str]:
    """The statements that delete job rows `ids` (integers the database handed out, so
    written into the text: the same statements serve every driver) and the rows that hang
    off them, those first: SQLite loads with its foreign keys off, so nothing cascades."""
    statements = []
    for at in range(0, len(ids), BATCH_ROWS):
        listed = ", ".join(str(pk) for pk in ids[at:at + BATCH_ROWS])
        statements += [f"DELETE FROM {table} WHERE job_pk IN ({listed})"
                       for table in ("job_nodes", "attributions", "telemetry_job_rollups")]
        statements.append(f"DELETE FROM jobs WHERE id IN ({listed})")
    return statements


# Secondary indexes a first bulk load builds at the end, sorted, instead of row by row.
# The unique instance_key index stays (the upsert needs it), except on PostgreSQL while
# blocks known to repeat no key are COPYed (sacct_pg).
DEFERRABLE_INDEXES = ("ix_jobs_end", "ix_jobs_job_id", "ix_job_nodes_node")


def _deferrable_indexes() -> list:
    return [
        ix
        for table in (schema.jobs, schema.job_nodes)
        for ix in table.indexes
        if ix.name in DEFERRABLE_INDEXES
    ]


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
    busy = sqlite_outside_transaction(conn, "PRAGMA busy_timeout")
    sqlite_outside_transaction(conn, "PRAGMA busy_timeout=0")
    try:
        mode = sqlite_outside_transaction(conn, "PRAGMA journal_mode=DELETE")
    except sqlite3.OperationalError:  # locked by another connection
        mode = "wal"
    finally:
        sqlite_outside_transaction(conn, f"PRAGMA busy_timeout={int(busy)}")
    return mode == "delete"


def _defer_indexes(conn) -> list:
    """When the jobs table is empty (a first backfill), drop the secondary indexes for the
    load; the caller recreates them in the same transaction (DDL is transactional in SQLite
    and PostgreSQL), so a failed load rolls back to the indexed, empty table."""
    if conn.execute(select(schema.jobs.c.id).limit(1)).first() is not None:
        return []
    indexes = _deferrable_indexes()
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
        # Adding the foreign key checks every job_nodes row against jobs with one join. The
        # planner hashes all of jobs for it (1.0 s of 1M jobs, one core); both sides are in
        # job_pk order in the two primary keys just built, and a first load's pages are
        # all-visible (COPY FREEZE, sacct_pg), so a merge of the two index-only scans checks
        # the same rows in about 0.4 s. These statements end the load (after every upsert),
        # so the setting lasts only until the commit that follows.
        "SET LOCAL enable_hashjoin = off",
        f"ALTER TABLE job_nodes ADD CONSTRAINT {fk_name} FOREIGN KEY (job_pk) "
        "REFERENCES jobs (id) ON DELETE CASCADE",
    ]


def _upsert_sql(conn, source: str) -> str:
    return upsert_sql(conn, "jobs", JOB_COLUMNS, source, conflict=("instance_key",),
                      update=UPDATABLE, fill=("cluster",), settled="end")


def _write_jobs(conn, columns: list[list], hosts: dict[str, str]) -> None:
    """SQLite: upsert job instances (columns in JOB_COLUMNS order); write job_nodes for the
    new ones.

    `hosts` maps each NodeList of the block to its hosts as a JSON array (made once per
    distinct NodeList in the whole load). They go to a temporary table, one row per distinct
    NodeList (tens of thousands, against millions of job_nodes rows), and the database
    expands them for the new instances in one INSERT ... SELECT (`_JOB_NODES_SQL`).
    """
    if not columns[0]:
        return
    J = schema.jobs
    max_before = conn.execute(select(J.c.id).order_by(J.c.id.desc()).limit(1)).scalar() or 0
    sql = _upsert_sql(conn, f"VALUES ({', '.join('?' * len(JOB_COLUMNS))})")
    # The driver's executemany straight from the columns: no list of row tuples.
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.executemany(sql, zip(*columns, strict=True))
    finally:
        cursor.close()
    conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS ingest_hosts ({_HOSTS_DDL})")
    conn.exec_driver_sql("DELETE FROM temp.ingest_hosts")
    rows = iter(hosts.items())
    while batch := list(islice(rows, BATCH_ROWS)):
        conn.exec_driver_sql("INSERT INTO temp.ingest_hosts VALUES (?, ?)", batch)
    conn.exec_driver_sql(_JOB_NODES_SQL, (max_before,))


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


def _utcnow() -> datetime:
    """The local clock (naive UTC); a test injects its own."""
    return datetime.now(UTC).replace(tzinfo=None)


def next_start(start: str, now: datetime, newest: datetime | None, overlap_s: int) -> datetime:
    """Where the next window starts: `overlap_s` before the newest Start or End the accounting
    returned, not before the local clock's `now` (a clock that had jumped forward by more than
    the overlap put the cursor in the future, and once it was stepped back the jobs that
    ended in between were never read again with their final state). Never later than `now`
    less the overlap (the old rule: a clock that is behind is the safe side), and not before
    this window's `start` (a window of long-running jobs with nothing new must not widen back
    to when they started); with nothing returned, this window's start again."""
    latest = now - timedelta(seconds=overlap_s)
    try:
        begun = parse_time(start)
    except ValueError:  # a --since sacct takes but ISO 8601 does not (e.g. "now-1days")
        return latest
    if newest is None:
        return min(begun, latest)
    return min(max(begun, newest - timedelta(seconds=overlap_s)), latest)


def ingest_incremental(
    engine: Engine,
    *,
    since: str | None = None,
    acct: Accounting,
    gpus_per_node: int = 8,
    default_start: str = "1970-01-01T00:00:00",
    overlap_s: int = 3600,
    form: str = "auto",
    cluster: str = "",
) -> IngestReport:
    """Run sacct from the stored cursor (or `since`) to now; advance the cursor on success.

    sacct -S/-E selects every job that was in any state during the window, so a job still
    running at the end of one window is read again, finished, by the next. slurmdbd learns of
    a job's end a little after it happens (seen: seconds on an idle test cluster; longer when
    slurmctld is queueing records for it), so the next window starts `overlap_s` before this
    one ended; re-reading those rows changes nothing. That end is the newest time the
    accounting itself returned, not the local clock (`next_start`).
    """
    start = since or get_cursor(engine) or default_start
    now = _utcnow().replace(tzinfo=None, microsecond=0)
    data, codes = run_sacct(start, now.strftime(_SACCT_TIME), acct, form=form)
    seen: set[str] = set()
    default_cluster = cluster_name()
    report = ingest_text(engine, data, gpus_per_node=gpus_per_node, exit_codes=codes,
                         cluster=cluster, default_cluster=default_cluster, seen=seen)
    cursor = next_start(start, now, report.newest, overlap_s)
    try:
        with writer(engine).begin() as conn:
            set_cursor(conn, cursor.strftime(_SACCT_TIME))
    except DBAPIError as exc:  # the jobs landed; the next run re-reads them, changing nothing
        raise SacctError(
            f"jobs loaded, but the cursor was not saved: {database_failed('sacct', exc)}"
        ) from exc
    _reread_open(engine, start, now, seen, report, acct=acct, form=form,
                 gpus_per_node=gpus_per_node, cluster=cluster or default_cluster)
    return report


# At most this many job ids per `sacct -j` (its command line), and per run.
REREAD_IDS = 500
REREAD_MAX = 5000
REREAD = "open in the historian, not in the window: re-read by job id (a runaway job fixed)"
NOT_IN_SLURMDBD = "open in the historian, not in slurmdbd at all: left open"
REREAD_FAILED = "open in the historian, re-read by job id failed (next run again)"


def _reread_open(engine: Engine, start: str, now: datetime, seen: set[str],
                 report: IngestReport, *, acct: Accounting, form: str, gpus_per_node: int,
                 cluster: str) -> None:
    """Re-read by id the jobs the historian holds open (no end) from before the window that
    the window did not return, and load them as any sacct output.

    A window returns every job that was in any state during it, so a job still running is
    in it. One it left out ended before the window as far as slurmdbd knows: most often a
    runaway job an operator fixed (`sacctmgr show runawayjobs`: its end set to its start,
    days back), which no later window would ever return. Only this cluster's rows (or
    those that name none); the oldest first, at most REREAD_MAX per run."""
    try:
        begun = parse_time(start)
    except ValueError:  # a --since that is not a time: no window start to compare with
        return
    J = schema.jobs
    query = (select(J.c.job_id, func.min(J.c.submit))
             .where(J.c.end.is_(None), J.c.start.is_not(None), J.c.start < begun)
             .group_by(J.c.job_id).order_by(func.min(J.c.submit), J.c.job_id))
    if cluster:
        query = query.where(J.c.cluster.in_((cluster, "")))
    with engine.connect() as conn:
        open_ids = [(str(j), submit) for j, submit in conn.execute(query)
                    if str(j) not in seen and str(j).isdigit()][:REREAD_MAX]
    for at in range(0, len(open_ids), REREAD_IDS):
        chunk = open_ids[at:at + REREAD_IDS]
        ids = [j for j, _ in chunk]
        first = min(_as_time(submit) for _, submit in chunk)
        found: set[str] = set()
        try:
            data, codes = run_sacct(first.strftime(_SACCT_TIME), now.strftime(_SACCT_TIME),
                                    acct, form=form, jobs=ids)
            again = ingest_text(engine, data, gpus_per_node=gpus_per_node, exit_codes=codes,
                                cluster=cluster, seen=found)
        except SacctError as exc:
            # The window landed, its cursor too: the next run asks again. Said, not raised.
            report.note(f"{REREAD_FAILED}: {str(exc).splitlines()[0][:200]}", len(ids))
            continue
        report.read += again.read
        report.written += again.written
        report.note(REREAD, again.written)
        for cause, n in again.dropped.items():
            report.skip(cause, n)
        report.note(NOT_IN_SLURMDBD, len(set(ids) - found))


def _as_time(value) -> datetime:
    """A time column's value (SQLite hands back text in an aggregate) as a datetime."""
    return value if isinstance(value, datetime) else parse_time(str(value))
