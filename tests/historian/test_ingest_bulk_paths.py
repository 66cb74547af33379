"""The sacct ingest's two SQLite write paths store the same rows.

A first backfill into a SQLite file goes through ADBC (sqlite_bulk); every other load through
Python's sqlite3. Blocks are made tiny here so one small file spans many of them: line
numbers, duplicates and failures are checked across block boundaries.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.db import connect, table_counts
from rsc_health.historian.ingest import sacct, sacct_parse, sqlite_bulk

SACCT = Path(__file__).parent / "fixtures" / "sacct_small.txt"


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(sacct_parse, "BLOCK_BYTES", 4096)  # about 15 rows a block


@pytest.fixture
def bulk_runs(monkeypatch):
    """How many loads went through the ADBC path."""
    runs: list[Path] = []
    real = sqlite_bulk.run

    def spy(engine, path, work):
        runs.append(path)
        return real(engine, path, work)

    monkeypatch.setattr(sqlite_bulk, "run", spy)
    return runs


def _many_jobs(copies: int) -> list[str]:
    """The fixture's rows `copies` times, each copy under other JobIDRaws and nodes."""
    header, *rows = SACCT.read_text().splitlines()
    out = [header]
    for k in range(copies):
        for row in rows:
            fields = row.split("|")
            fields[0] = str(int(fields[0]) + 10_000 * k)
            fields[12] = fields[12].replace("gpu0", f"gpu{k % 9 + 1}")
            out.append("|".join(fields))
    return out


def _dump(engine) -> tuple[list, list]:
    with engine.connect() as conn:
        jobs = conn.exec_driver_sql("SELECT * FROM jobs ORDER BY id").all()
        nodes = conn.exec_driver_sql("SELECT * FROM job_nodes ORDER BY job_pk, node").all()
    return jobs, nodes


def _load_both_ways(tmp_path, monkeypatch, text: str):
    bulk = connect(f"sqlite:///{tmp_path / 'bulk.db'}", create_missing=True)
    bulk_report = sacct.ingest_text(bulk, text)
    with monkeypatch.context() as m:
        m.setattr(sqlite_bulk, "usable_file", lambda engine: None)
        driver = connect(f"sqlite:///{tmp_path / 'driver.db'}", create_missing=True)
        driver_report = sacct.ingest_text(driver, text)
    return (bulk, bulk_report), (driver, driver_report)


def test_adbc_backfill_stores_exactly_what_the_sqlite3_path_stores(
    tmp_path, monkeypatch, small_blocks, bulk_runs
):
    text = "\n".join(_many_jobs(40)) + "\n"
    (bulk, bulk_report), (driver, driver_report) = _load_both_ways(tmp_path, monkeypatch, text)
    assert len(bulk_runs) == 1  # the first load took the ADBC path, the other did not
    assert bulk_report.summary() == driver_report.summary() == (
        "sacct: read 360, written 320, 40 dropped (PENDING: not an instance until it starts "
        "(read again then))"
    )
    jobs, nodes = _dump(bulk)
    assert (jobs, nodes) == _dump(driver)
    assert len(jobs) == 320 and len(nodes) == 40 * (2 + 1 + 4 + 4 + 1 + 1 + 1)
    with bulk.connect() as conn:  # handed back in WAL, foreign keys on, nothing orphaned
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA foreign_key_check(job_nodes)").all() == []
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"


def test_an_instance_repeated_blocks_later_lands_once_on_both_paths(
    tmp_path, monkeypatch, small_blocks, bulk_runs
):
    """An sacct file read twice and concatenated, the second time with the running job
    finished: the ADBC path sees the ids are not all new and lets SQL match the nodes."""
    lines = _many_jobs(10)
    again = [
        ln.replace("|RUNNING|0:0|", "|FAILED|1:0|").replace(
            "|Unknown|1|gpu", "|2024-03-01T15:00:00|1|gpu"
        )
        for ln in lines[1:]
    ]
    text = "\n".join([*lines, *again]) + "\n"
    (bulk, report), (driver, _) = _load_both_ways(tmp_path, monkeypatch, text)
    assert bulk_runs and report.bad == []
    jobs, nodes = _dump(bulk)
    assert (jobs, nodes) == _dump(driver)
    assert len(jobs) == 80
    assert {j.state for j in jobs if j.job_id.endswith("013")} == {"FAILED"}


def test_bad_rows_in_later_blocks_keep_their_line_numbers(tmp_path, small_blocks):
    lines = [*_many_jobs(12), "7|7"]
    bad_at = [2, 30, 31, 64, 100, len(lines)]  # line numbers, 1-based; the header is line 1
    lines[1] = "|"
    lines[29] = "9|9|x|u|gpu|FAILED|1:0|2024-03-01T09:00:00|a|b|c|d|e|f|g|h"
    lines[30] = lines[30].replace("2024-03-01T", "2024-02-30T", 1)
    lines[63] = "|".join(["8", "8", "x", "u", "gpu", "FAILED"])
    lines[99] = lines[99].replace("2024-03-01T", " 2024-03-01T", 1)
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    report = sacct.ingest_text(engine, "\n".join(lines) + "\n")
    assert [b.line for b in report.bad] == bad_at
    assert [b.message.split(":")[0] for b in report.bad] == [
        "expected 14 fields, saw 2",
        # two surplus fields are taken as the job name's `|`: the shifted row then fails
        "Submit is not a time",
        "Submit is not a time",
        "expected 14 fields, saw 6",
        "Submit is not a time",
        "expected 14 fields, saw 2",
    ]
    assert report.written + report.skipped + len(report.bad) == report.read == len(lines) - 1


@pytest.mark.parametrize(
    "value",
    ["2024-02-30T00:00:00", "2024-03-01T24:00:00", "2024-03-01T09:00", "2024-03-01 09:00:00",
     "2024-03-01T09:00:00Z", "yesterday"],
)
def test_a_time_that_is_not_sacct_s_is_reported(tmp_path, value):
    header, first, *_ = SACCT.read_text().splitlines()
    row = first.split("|")
    row[10] = value  # End
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    row[0] = "2001"
    report = sacct.ingest_text(engine, f"{header}\n{first}\n{'|'.join(row)}\n")
    assert [(b.line, b.message) for b in report.bad] == [(3, f"End is not a time: {value}")]
    assert report.written == 1


def test_bytes_that_are_not_utf8_are_replaced_counted_and_every_job_lands(
    tmp_path, small_blocks
):
    path = tmp_path / "sacct.txt"
    lines = [ln.encode() for ln in _many_jobs(12)]
    late = next(i for i in range(80, len(lines)) if b"train_llm" in lines[i])
    lines[late] = lines[late].replace(b"train_llm", b"train_\xff\xfe")
    path.write_bytes(b"\n".join(lines) + b"\n")
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    report = sacct.ingest_text(engine, path)
    assert report.bad == [] and report.replaced == 2
    assert table_counts(engine)["jobs"] == len(lines) - 1 - report.skipped
    with engine.connect() as conn:
        names = set(conn.execute(select(schema.jobs.c.name)).scalars())
    assert "train_\ufffd\ufffd" in names


def test_the_adbc_path_is_only_for_a_file_nobody_else_holds(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    assert sqlite_bulk.usable_file(engine) == tmp_path / "h.db"
    with engine.connect():
        assert sqlite_bulk.usable_file(engine) is None  # a connection of ours is in use
    assert sqlite_bulk.usable_file(connect("sqlite://", create_missing=True)) is None  # in memory
