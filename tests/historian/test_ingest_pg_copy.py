"""The PostgreSQL sacct load by binary COPY (sacct_pg, pg_copy).

Blocks go straight into jobs by COPY until one holds a key already stored; from then on they
are upserted. Either way every instance lands once, PostgreSQL stores what SQLite stores, and
a job name keeps its exact bytes, whatever COPY's text format would have made of them.
"""

from __future__ import annotations

import threading
from datetime import datetime

import psycopg
import pyarrow as pa
import pytest
from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.db import connect, table_counts
from rsc_health.historian.ingest import pg_copy, sacct, sacct_parse, sacct_pg, sqlite_bulk
from tests.historian.test_ingest_adversarial import _parsable, _row
from tests.historian.test_ingest_bulk_paths import _many_jobs

# What the text format of COPY reads specially: a tab ends a field, a newline a row, a
# backslash starts an escape, \N is NULL, and \. alone on a line ends the data.
COPY_TEXT_PITFALLS = {
    "1": "tab\there",
    "2": "back\\slash",
    "3": "\\N",
    "4": "two\nlines",
    "5": "\\.",
    "6": "line\n\\.\nafter the end marker",
    "7": "ends in a backslash\\",
    "8": "\\t is not a tab",
    "9": "",
}


def _content(engine) -> tuple[list[tuple], list[tuple]]:
    """Every job's columns in id order, and every job_nodes row as (instance key, node):
    what two databases must agree on (ids may differ)."""
    J, N = schema.jobs, schema.job_nodes
    with engine.connect() as conn:
        jobs = conn.execute(
            select(*(J.c[c] for c in sacct_parse.JOB_COLUMNS)).order_by(J.c.id)
        ).all()
        nodes = conn.execute(
            select(J.c.instance_key, N.c.node)
            .join(J, J.c.id == N.c.job_pk)
            .order_by(J.c.instance_key, N.c.node)
        ).all()
    return [tuple(r) for r in jobs], [tuple(r) for r in nodes]


@pytest.mark.postgres
def test_the_binary_encoding_round_trips_every_kind_of_value(pg_url):
    values = {
        "text": ["tab\t", None, "\\N", "a\n\\.\nb", "é \\\r\"", ""],
        "integer": [1, None, -5, 2**31 - 1, -(2**31), 0],
        "bigint": [None, 2**40, -1, 0, 2**63 - 1, 7],
        "timestamp": [
            datetime(2024, 3, 1, 8, 0, 5, 123456), None, datetime(1970, 1, 1),
            datetime(1999, 12, 31, 23, 59, 59), datetime(2000, 1, 1), datetime(2038, 1, 19, 3),
        ],
    }
    columns = [pa.array(v, pg_copy.ARROW_FOR[kind]) for kind, v in values.items()]
    with psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql")) as conn:
        conn.execute("CREATE TEMP TABLE t (n serial, a text, b integer, c bigint, d timestamp)")
        with conn.cursor().copy("COPY t (a, b, c, d) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(pg_copy.encode(columns))
        with conn.cursor().copy("COPY t (a, b, c, d) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(pg_copy.encode([c[:0] for c in columns]))  # no rows: still valid
        rows = conn.execute("SELECT a, b, c, d FROM t ORDER BY n").fetchall()
    assert rows == list(zip(*values.values(), strict=True))


def test_names_copy_text_would_mangle_land_exactly_and_once(historian):
    body = _parsable([_row(job_id, name) for job_id, name in COPY_TEXT_PITFALLS.items()])
    first = sacct.ingest_text(historian, body)
    stored = _content(historian)
    again = sacct.ingest_text(historian, body)
    assert first.bad == again.bad == []
    assert _content(historian) == stored  # the same sacct twice: the same rows, none doubled
    with historian.connect() as conn:
        names = dict(conn.execute(select(schema.jobs.c.job_id, schema.jobs.c.name)).all())
    assert names == COPY_TEXT_PITFALLS
    assert table_counts(historian)["job_nodes"] == 2 * len(COPY_TEXT_PITFALLS)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(sacct_parse, "BLOCK_BYTES", 4096)  # about 15 rows a block


@pytest.fixture
def pg_paths(monkeypatch):
    """Which way each PostgreSQL block went: 'copy' (appended) or 'upsert'."""
    taken: list[str] = []
    append, upsert = sacct_pg._append, sacct_pg._upsert

    def spy_append(conn, item, sequence, **options):
        ok = append(conn, item, sequence, **options)
        taken.append("copy" if ok else "copy failed")
        return ok

    def spy_upsert(conn, item, upsert_sql):
        taken.append("upsert")
        return upsert(conn, item, upsert_sql)

    monkeypatch.setattr(sacct_pg, "_append", spy_append)
    monkeypatch.setattr(sacct_pg, "_upsert", spy_upsert)
    return taken


def _then_only_upserts(paths: list[str]) -> bool:
    """Blocks went in by COPY until the first upsert, and by upsert from then on."""
    first = paths.index("upsert")
    return set(paths[:first]) <= {"copy", "copy failed"} and set(paths[first:]) == {"upsert"}


@pytest.mark.postgres
def test_a_file_read_twice_is_copied_then_upserted_and_postgresql_matches_sqlite(
    pg_url, tmp_path, monkeypatch, small_blocks, pg_paths
):
    """An sacct file read twice and concatenated, the second time with the running job
    finished, into an empty historian: jobs has no unique index while the first half is
    COPYed, so the repeat must be seen before it is written; from the first block holding
    one, the rest is upserted. The result is SQLite's, row for row."""
    lines = _many_jobs(10)
    again = [
        ln.replace("|RUNNING|0:0|", "|FAILED|1:0|").replace(
            "|Unknown|1|gpu", "|2024-03-01T15:00:00|1|gpu"
        )
        for ln in lines[1:]
    ]
    text = "\n".join([*lines, *again]) + "\n"
    pg = connect(pg_url, create_missing=True)
    report = sacct.ingest_text(pg, text)
    monkeypatch.setattr(sqlite_bulk, "usable_file", lambda engine: None)
    lite = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    assert sacct.ingest_text(lite, text).summary() == report.summary()
    assert report.bad == []
    assert pg_paths.count("copy") >= 3 and _then_only_upserts(pg_paths)
    jobs, nodes = _content(pg)
    assert (jobs, nodes) == _content(lite)
    assert len(jobs) == 80 and len({j[-2] for j in jobs}) == 80
    assert {j[5] for j in jobs if j[0].endswith("013")} == {"FAILED"}
    with pg.connect() as conn:  # the keys dropped for the COPY are back
        kinds = conn.exec_driver_sql(
            "SELECT contype, count(*) FROM pg_constraint WHERE conrelid = 'jobs'::regclass "
            "OR confrelid = 'jobs'::regclass GROUP BY 1 ORDER BY 1").all()
    assert [tuple(k) for k in kinds] == [("f", len(_referencing_jobs())), ("p", 1), ("u", 1)]


@pytest.mark.postgres
@pytest.mark.parametrize("job_id", ["1001", "x1001"], ids=["numeric", "not a number"])
def test_a_repeat_inside_one_block_of_a_first_load_lands_once(pg_url, tmp_path, monkeypatch,
                                                              pg_paths, job_id):
    """The same instance twice in one block (no other block to tell), its second time
    FAILED: upserted in rounds, like SQLite. A JobIDRaw that is not a number cannot be
    tracked, so its block is upserted too."""
    first = _row(job_id, State="RUNNING", End="Unknown")
    rows = [first, _row("7"), dict(first, State="FAILED", ExitCode="1:0")]
    text = _parsable(rows)
    pg = connect(pg_url, create_missing=True)
    report = sacct.ingest_text(pg, text)
    monkeypatch.setattr(sqlite_bulk, "usable_file", lambda engine: None)
    lite = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    assert sacct.ingest_text(lite, text).summary() == report.summary()
    assert pg_paths == ["upsert"]
    assert _content(pg) == _content(lite)
    assert [(j[0], j[5]) for j in _content(pg)[0]] == [(job_id, "FAILED"), ("7", "COMPLETED")]


def test_a_load_overlapping_the_last_adds_only_the_new_instances(historian, small_blocks):
    """An incremental window re-reads the end of the previous one (one job finished since):
    the old instances are updated in place, the new ones added, none doubled."""
    first = [_row(str(i), NodeList=f"gpu{i % 40:03d}", NNodes="1") for i in range(1, 61)]
    first[-1] |= {"State": "RUNNING", "End": "Unknown"}
    second = [_row(str(i), NodeList=f"gpu{i % 40:03d}", NNodes="1") for i in range(41, 101)]
    sacct.ingest_text(historian, _parsable(first))
    with historian.connect() as conn:
        ids_before = dict(conn.execute(select(schema.jobs.c.job_id, schema.jobs.c.id)).all())
    sacct.ingest_text(historian, _parsable(second))
    with historian.connect() as conn:
        rows = conn.execute(select(schema.jobs.c.job_id, schema.jobs.c.id,
                                   schema.jobs.c.state)).all()
    assert sorted(int(r.job_id) for r in rows) == list(range(1, 101))
    assert all(ids_before[r.job_id] == r.id for r in rows if r.job_id in ids_before)
    assert {r.state for r in rows if r.job_id == "60"} == {"COMPLETED"}
    assert table_counts(historian)["job_nodes"] == 100


@pytest.mark.postgres
def test_two_postgresql_loads_at_once_both_land_each_instance_once(pg_url):
    """The second load waits for the first's lock on jobs, then finds its keys stored."""
    connect(pg_url, create_missing=True).dispose()
    bodies = [
        _parsable([_row(str(i), NodeList=f"gpu{i % 50:03d}", NNodes="1")
                   for i in range(1, 3001)]),
        _parsable([_row(str(i), NodeList=f"gpu{i % 50:03d}", NNodes="1")
                   for i in range(2001, 4001)]),
    ]
    errors: list[BaseException] = []

    def load(body: str) -> None:
        engine = connect(pg_url, create_missing=True)
        try:
            sacct.ingest_text(engine, body)
        except BaseException as exc:  # noqa: BLE001 -- handed to the test thread
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=load, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    engine = connect(pg_url, create_missing=True)
    counts = table_counts(engine)
    assert counts["jobs"] == 4000 and counts["job_nodes"] == 4000
    with engine.connect() as conn:
        keys = conn.exec_driver_sql("SELECT count(DISTINCT instance_key) FROM jobs").scalar()
    assert keys == 4000


@pytest.mark.postgres
def test_a_load_waiting_past_its_timeout_for_another_load_says_so_in_one_line(pg_url):
    engine = connect(pg_url, create_missing=True)
    body = _parsable([_row(str(i)) for i in range(1, 50)])
    holder = connect(pg_url, create_missing=True)
    with holder.connect() as other:  # another load's transaction, still open
        other.exec_driver_sql("LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE")
        with pytest.raises(sacct.SacctError) as caught:
            sacct.ingest_text(engine, body, statement_timeout_s=0.5)
        other.rollback()
    message = str(caught.value)
    assert "\n" not in message and "nothing of it was kept" in message
    assert "timeout" in message or "canceling statement" in message
    assert sacct.ingest_text(engine, body).written == 49  # once the other has ended
    assert table_counts(engine)["jobs"] == 49


@pytest.mark.postgres
def test_a_first_load_writes_its_rows_frozen_and_a_later_load_keeps_every_row(pg_url,
                                                                             small_blocks):
    """A first backfill COPYs with FREEZE: after it every page of jobs and job_nodes is
    all-visible (no hint-bit pass rewrites them, index-only scans need no heap). The TRUNCATE
    that allows FREEZE runs only on empty tables: a second load into them keeps every row."""
    first = [_row(str(i), NodeList=f"gpu{i % 40:03d}", NNodes="1") for i in range(1, 301)]
    second = [_row(str(i), NodeList=f"gpu{i % 40:03d}", NNodes="1") for i in range(301, 361)]
    pg = connect(pg_url, create_missing=True)
    sacct.ingest_text(pg, _parsable(first))
    with pg.connect() as conn:
        conn.exec_driver_sql("ANALYZE jobs, job_nodes")  # brings relallvisible up to date
        pages = conn.exec_driver_sql(
            "SELECT relname, relpages, relallvisible FROM pg_class "
            "WHERE relname IN ('jobs', 'job_nodes') ORDER BY 1").all()
    assert [r.relname for r in pages] == ["job_nodes", "jobs"]
    assert all(r.relpages > 0 and r.relallvisible == r.relpages for r in pages)
    sacct.ingest_text(pg, _parsable(second))
    assert table_counts(pg)["jobs"] == 360 and table_counts(pg)["job_nodes"] == 360


def _referencing_jobs() -> list[str]:
    """The tables whose foreign key names jobs (schema.py): each is dropped for a first load's
    COPY and must come back (attributions and job_nodes, and every later table that joins a
    job, such as the telemetry rollups)."""
    from rsc_health.historian import schema

    return sorted({t.name for t in schema.metadata.sorted_tables
                   for fk in t.foreign_keys if fk.column.table.name == "jobs"})


@pytest.mark.postgres
def test_the_first_loads_foreign_keys_come_back_validated(pg_url, small_blocks):
    """The foreign keys dropped for a first load's COPY are added back checked (not NOT
    VALID), and still refuse a job_nodes row whose job is not stored."""
    pg = connect(pg_url, create_missing=True)
    assert sacct.ingest_text(pg, "\n".join(_many_jobs(10)) + "\n").bad == []
    with pg.connect() as conn:
        fks = conn.exec_driver_sql(
            "SELECT conrelid::regclass::text, convalidated FROM pg_constraint "
            "WHERE confrelid = 'jobs'::regclass AND contype = 'f' ORDER BY 1").all()
        assert [tuple(f) for f in fks] == [(t, True) for t in _referencing_jobs()]
        with pytest.raises(Exception, match="job_nodes_job_pk_fkey"):
            conn.exec_driver_sql("INSERT INTO job_nodes (job_pk, node) VALUES (-1, 'gpu001')")
