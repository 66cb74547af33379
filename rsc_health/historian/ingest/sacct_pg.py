"""The sacct ingest's PostgreSQL writes: every block goes in by binary COPY (`pg_copy`).

A load holds jobs in SHARE ROW EXCLUSIVE mode from its start (`lock`): a second load waits
for the first to commit (under the statement timeout) instead of interleaving with it, and
readers are not held up. So only this load takes ids from the jobs sequence meanwhile.

Appending (while no key of this load has repeated, `KeysSeen`): the block's ids are reserved
from the sequence in one statement, and the rows go straight into `jobs` and `job_nodes` by
COPY, inside a savepoint. COPY checks the unique instance key like any insert, so a block
with a key already stored (a re-read, an overlapping window) fails with a unique violation:
the savepoint is rolled back, nothing of the block stays, and this block and every later one
go through the upsert instead. On a first backfill jobs has no keys while it is appended to
(see `load`): the parsing thread's `KeysSeen` is then what keeps a repeat out.

Upserting: the block is COPYed into a typed temporary table and written with one
INSERT ... SELECT ... ON CONFLICT per round; job_nodes for the jobs it added come from each
NodeList's hosts, expanded by the database.

The blocks are encoded for COPY on the parsing thread (`prepared`), so the connection's
thread only sends them. Measured on 300k rows, PostgreSQL's side: COPY into jobs 1.4 s with
its two keys, 0.7 s without (their sorted builds after: 0.35 s), against 3.3 s for the
upsert from a text-typed staging table; job_nodes by COPY 0.3 s against 2.0 s by expansion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import Connection, select

from rsc_health.historian import schema
from rsc_health.historian.ingest import pg_copy
from rsc_health.historian.ingest.sacct_parse import JOB_COLUMNS, Block

_TIMES = ("submit", "eligible", "start", "end")
_INTEGERS = ("nnodes", "gpus")
# The staging table: the block's columns typed as in `jobs`, so that the upsert casts nothing
# (text timestamps cost the server about 1 us each to parse), and each row's place in the file.
_STAGED_DDL = ", ".join(
    ["seq bigint"]
    + [
        f'"{c}" ' + ("timestamp" if c in _TIMES else "integer" if c in _INTEGERS else "text")
        for c in JOB_COLUMNS
    ]
)
_HOSTS_DDL = "nodelist text PRIMARY KEY, hosts text NOT NULL"
# job_nodes rows for the jobs above the id bound to the one parameter, from each job's
# NodeList's hosts (a JSON array) staged in ingest_hosts, in job order. No conflict target: on
# a first backfill job_nodes' key is added after the load.
_JOB_NODES_SQL = (
    "INSERT INTO job_nodes (job_pk, node) "
    "SELECT j.id, e.value FROM jobs AS j JOIN ingest_hosts AS h ON h.nodelist = j.nodelist "
    "CROSS JOIN LATERAL jsonb_array_elements_text(h.hosts::jsonb) AS e(value) "
    "WHERE j.id > %s ORDER BY j.id ON CONFLICT DO NOTHING"
)


@dataclass
class Prepared:
    """A parsed block with its rows already in binary COPY form: `jobs`, the JOB_COLUMNS
    fields of each job; `nodes`, the node field of each job_nodes row. `fresh`: no instance
    key of the block came earlier in this load, nor twice in the block (see KeysSeen)."""

    block: Block
    jobs: pg_copy.Encoded
    nodes: pg_copy.Encoded
    fresh: bool


def prepared(blocks: Iterable[Block]) -> Iterator[Prepared]:
    seen = KeysSeen()
    for block in blocks:
        typed = _typed(block)
        fresh = seen.add(block.jobs.column("job_id"), typed[JOB_COLUMNS.index("submit")],
                         typed[JOB_COLUMNS.index("start")])
        yield Prepared(block, pg_copy.encoded(typed),
                       pg_copy.encoded([block.job_nodes.column("node")]), fresh)


class KeysSeen:
    """Whether a block's instance keys all differ from each other and from every earlier
    block's, without keeping the keys: a first backfill writes jobs with no unique index to
    catch a repeat, so this must never miss one.

    An instance key is JobIDRaw:Submit:Start as sacct wrote them, so equal keys have equal
    (JobIDRaw as a number, Submit, Start), and so equal 64-bit hashes of those: a repeat is
    never missed. Unequal keys with equal hashes (about 3 chances in 10^8 for 10^6 jobs) or
    a JobIDRaw that is not a number only cost speed: the block counts as a repeat. After
    the first repeat nothing more is kept (the load upserts from then on). 8 bytes a job."""

    def __init__(self) -> None:
        self._hashes: np.ndarray | None = np.empty(0, np.uint64)  # sorted

    def add(self, job_id: pa.ChunkedArray, submit: pa.Array, start: pa.Array) -> bool:
        """True when none of these keys was added before, nor twice now; then they are."""
        if self._hashes is None:
            return False
        try:
            number = pc.cast(job_id, pa.uint64()).to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            number = None
        if number is None or pc.any(pc.is_null(submit)).as_py():
            self._hashes = None
            return False
        times = [pc.fill_null(t.cast(pa.int64()), -1).to_numpy().view(np.uint64)
                 for t in (submit, start)]
        hashes = np.sort(_mix(_mix(_mix(number) ^ times[0]) ^ times[1]))
        before = np.searchsorted(self._hashes, hashes)
        again = before < len(self._hashes)
        again[again] = self._hashes[before[again]] == hashes[again]
        if again.any() or (hashes[1:] == hashes[:-1]).any():
            self._hashes = None
            return False
        # two sorted runs: the stable sort (timsort) merges them in one pass
        self._hashes = np.sort(np.concatenate([self._hashes, hashes]), kind="stable")
        return True


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every bit of the input moves about half the output's."""
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def lock(conn: Connection) -> None:
    """Take jobs for this load (until its transaction ends); see the module's docstring."""
    conn.exec_driver_sql("LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE")


def load(conn: Connection, parsed: Iterable[Prepared], upsert_sql: Callable[[str], str],
         *, first_load: bool = False,
         own_keys: Callable[[Connection, pa.Table], pa.Table] | None = None) -> None:
    """Write every prepared block, in the caller's transaction (which has called `lock`).
    `upsert_sql(source)` is the jobs upsert with `source` (a SELECT of JOB_COLUMNS) as rows.

    `first_load` (jobs was empty when the lock was taken): jobs' primary key and unique
    instance key, and the foreign keys that need them, are dropped while blocks are
    appended (about 40% of the COPY's time goes to those two indexes otherwise) and added
    back, one sorted build each, before the first upsert or at the end, in this
    transaction. Only blocks known `fresh` are appended meanwhile, so nothing can repeat a
    key, and the build checks that anyway. The rows go in frozen (`_freeze`).

    `own_keys(conn, jobs)` (sacct.own_keys), on a table that was not empty: the block's
    jobs with a key another cluster's job holds made their own; such a block is encoded
    again."""
    # A bulk load's statements are simple and few: compiling them (JIT) costs more than it
    # saves. The upsert's sort of a staged block fits in memory instead of spilling, and so
    # do the sorts of a first backfill's index builds.
    conn.exec_driver_sql("SET LOCAL jit = off")
    conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
    conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")
    sequence = conn.exec_driver_sql("SELECT pg_get_serial_sequence('jobs', 'id')").scalar()
    appending = sequence is not None
    restore = _drop_jobs_keys(conn) if first_load and appending else []
    frozen = bool(restore) and _freeze(conn)
    def own(item: Prepared) -> None:
        if own_keys is not None:
            jobs = own_keys(conn, item.block.jobs)
            if jobs is not item.block.jobs:
                item.block.jobs = jobs
                item.jobs = pg_copy.encoded(_typed(item.block))

    for item in parsed:
        if not item.block.jobs.num_rows:
            continue
        # A fresh block of a first backfill repeats no key of the load (KeysSeen), so no
        # other cluster's; any other block is checked against the keys stored (indexed).
        asked = False
        if appending and item.fresh:
            if not first_load:
                own(item)
                asked = True
            if _append(conn, item, sequence, frozen=frozen):
                continue
        appending = frozen = False
        for statement in restore:
            conn.exec_driver_sql(statement)
        restore = []
        if not asked:
            own(item)
        _upsert(conn, item, upsert_sql)
    for statement in restore:
        conn.exec_driver_sql(statement)


def _freeze(conn: Connection) -> bool:
    """Ready an empty jobs and job_nodes, keys dropped, for `COPY ... FREEZE`; True when done.

    COPY FREEZE writes rows already frozen and their pages all-visible, which PostgreSQL
    allows only into a table created or emptied (TRUNCATE) in the same subtransaction. So
    the first readers after the load (the ANALYZE that follows, attribution's first scans)
    neither set a hint bit on every row, dirtying and writing back every page, nor visit the
    heap for index-only scans, and no anti-wraparound VACUUM rewrites the year of jobs
    later. TRUNCATE here empties nothing: it runs only when both tables are empty under
    this transaction's locks (DROP CONSTRAINT holds ACCESS EXCLUSIVE on both already), and
    a rolled-back load restores them as they were."""
    empty = conn.exec_driver_sql(
        "SELECT NOT EXISTS (SELECT FROM jobs) AND NOT EXISTS (SELECT FROM job_nodes)"
    ).scalar()
    if not empty:
        return False
    conn.exec_driver_sql("TRUNCATE jobs, job_nodes")
    return True


def _drop_jobs_keys(conn: Connection) -> list[str]:
    """Drop jobs' primary and unique keys and the foreign keys onto them; hand back the
    statements that add them again, as they were (pg_get_constraintdef), keys first."""
    foreign = conn.exec_driver_sql(
        "SELECT conrelid::regclass::text, quote_ident(conname), pg_get_constraintdef(oid) "
        "FROM pg_constraint WHERE confrelid = 'jobs'::regclass AND contype = 'f' ORDER BY 1, 2"
    ).all()
    keys = conn.exec_driver_sql(
        "SELECT 'jobs', quote_ident(conname), pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = 'jobs'::regclass AND contype IN ('p', 'u') ORDER BY contype, 2"
    ).all()
    for table, name, _ in [*foreign, *keys]:
        conn.exec_driver_sql(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    return [f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}"
            for table, name, definition in [*keys, *foreign]]


def _typed(block: Block) -> list[pa.Array]:
    """The block's JOB_COLUMNS as the binary COPY sends them into jobs' column types (the
    times as the parser read them, else from their text)."""
    out = []
    jobs = block.jobs
    for name in JOB_COLUMNS:
        column = jobs.column(name)
        if name in _TIMES:
            column = block.times.get(name, column).cast(pg_copy.ARROW_FOR["timestamp"])
        elif name in _INTEGERS:
            column = column.cast(pg_copy.ARROW_FOR["integer"])
        out.append(column)
    return out


def _copy(conn: Connection, table: str, names: Sequence[str], columns: Sequence,
          *, frozen: bool = False) -> None:
    quote = conn.dialect.identifier_preparer.quote
    options = "FORMAT BINARY, FREEZE" if frozen else "FORMAT BINARY"
    statement = f"COPY {table} ({', '.join(quote(n) for n in names)}) FROM STDIN ({options})"
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        with cursor.copy(statement) as copy:
            copy.write(pg_copy.encode(columns))
    finally:
        cursor.close()


def _append(conn: Connection, item: Prepared, sequence: str, *, frozen: bool = False) -> bool:
    """COPY the block into jobs and job_nodes under ids reserved from the sequence; False
    (nothing of the block kept) when one of its keys is stored already. `frozen` (`_freeze`):
    the tables have no keys to repeat, and a savepoint would forbid FREEZE, so none is taken."""
    from psycopg.errors import UniqueViolation  # here: a SQLite-only host needs no psycopg

    n = item.block.jobs.num_rows
    # The lock keeps every other load off the sequence, so nextval .. nextval + n - 1 are
    # ours. (Anyone else taking an id in between would make the COPY fail on the primary
    # key: a unique violation too, so the block would go through the upsert.)
    last = conn.exec_driver_sql(
        "SELECT setval(%s::regclass, nextval(%s::regclass) + %s - 1)", (sequence, sequence, n)
    ).scalar()
    ids = pa.array(np.arange(last - n + 1, last + 1, dtype=np.int32))
    node_ids = pc.take(ids, item.block.job_nodes.column("row"))
    if frozen:
        _copy(conn, "jobs", ("id", *JOB_COLUMNS), [ids, item.jobs], frozen=True)
        _copy(conn, "job_nodes", ("job_pk", "node"), [node_ids, item.nodes], frozen=True)
        return True
    savepoint = conn.begin_nested()
    try:
        _copy(conn, "jobs", ("id", *JOB_COLUMNS), [ids, item.jobs])
        _copy(conn, "job_nodes", ("job_pk", "node"), [node_ids, item.nodes])
    except UniqueViolation:
        savepoint.rollback()
        return False
    savepoint.commit()
    return True


def _stage(conn: Connection, name: str, ddl: str, names: Sequence[str], columns) -> None:
    """Fill the temporary table `name` (created on first use in this transaction, emptied
    otherwise) by binary COPY."""
    conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {name} ({ddl}) ON COMMIT DROP")
    conn.exec_driver_sql(f"TRUNCATE {name}")
    _copy(conn, name, names, columns)


def _upsert(conn: Connection, item: Prepared, upsert_sql: Callable[[str], str]) -> None:
    """One statement may not update a row twice, so a key seen more than once in the block
    (an sacct file read twice, concatenated) goes in rounds, in file order: the n-th
    occurrence of each key in round n, which is what row-by-row upserts would do."""
    J = schema.jobs
    max_before = conn.execute(select(J.c.id).order_by(J.c.id.desc()).limit(1)).scalar() or 0
    block = item.block
    n = block.jobs.num_rows
    keys = block.jobs.column("instance_key")
    if pc.count_distinct(keys).as_py() == n:
        occurrence = np.zeros(n, dtype=np.int64)
    else:
        occurrence = pd.Series(keys.to_numpy()).groupby(keys.to_numpy(), sort=False).cumcount()
        occurrence = occurrence.to_numpy()
    quote = conn.dialect.identifier_preparer.quote
    seq = pa.array(np.arange(n, dtype=np.int64))
    sql = upsert_sql(
        f"SELECT {', '.join(quote(c) for c in JOB_COLUMNS)} FROM ingest_jobs ORDER BY seq"
    )
    for round_ in range(int(occurrence.max()) + 1):
        picked = pa.array(occurrence == round_)
        _stage(conn, "ingest_jobs", _STAGED_DDL, ("seq", *JOB_COLUMNS),
               [seq.filter(picked), item.jobs.filter(picked)])
        conn.exec_driver_sql(sql)
    hosts = block.hosts_json()
    _stage(conn, "ingest_hosts", _HOSTS_DDL, ("nodelist", "hosts"),
           [pa.array(list(hosts), pa.string()), pa.array(list(hosts.values()), pa.string())])
    conn.exec_driver_sql(_JOB_NODES_SQL, (max_before,))
