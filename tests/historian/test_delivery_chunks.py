"""A batch delivered in chunks gives the table one delivery would: a chunk boundary never cuts
one run's records in two (intervals.fold takes a (node, time) as the whole run), and a flush
cut between chunks and delivered again changes nothing its first chunks wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from rsc_health import spool
from rsc_health.historian import schema
from rsc_health.historian.db import HistorianUnavailable
from rsc_health.historian.ingest import delivery
from rsc_health.historian.ingest.delivery import _chunks, deliver
from rsc_health.historian.intervals import open_failures
from rsc_health.model import Finding, Severity, Status

T0 = datetime(2024, 3, 1, 0, 0, tzinfo=UTC)
C = schema.check_results


def _remap(t: datetime, gpus: int = 4) -> list[dict]:
    findings = [Finding("remap", f"gpu{i}", Status.FAIL, Severity.DRAIN_AFTER_JOB,
                        "row remap failure pending", code="remap_failed") for i in range(gpus)]
    return spool.check_records(findings, node="gpu001", source="sweep", time=t, job_id=None)


def _all_clear(t: datetime, source: str = "sweep") -> dict:
    return spool.record("check", "gpu001", t, source=source, job_id=None, check="ecc",
                        component="*", status="ok", severity="none", code="",
                        reason="all clear")


def _open_remaps(engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(r["component"] for r in open_failures(conn) if r["check"] == "remap")


def test_a_run_a_chunk_boundary_falls_inside_keeps_every_failure_open(historian, tmp_path):
    spool.append(tmp_path, _remap(T0))
    deliver(historian, tmp_path)
    assert _open_remaps(historian) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    # a backlog: two earlier runs, then the next sweep's 4 records across line 4
    spool.append(tmp_path, [_all_clear(T0 + timedelta(minutes=i)) for i in (1, 2)])
    spool.append(tmp_path, _remap(T0 + timedelta(hours=3)))
    deliver(historian, tmp_path, chunk_lines=4)
    assert _open_remaps(historian) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    with historian.connect() as conn:
        last = set(conn.execute(select(C.c.last_seen).where(C.c.check == "remap")).scalars())
    assert last == {datetime(2024, 3, 1, 3, 0)}


def test_a_checker_error_a_chunk_boundary_falls_inside_is_one_interval_counted_once(
        historian, tmp_path):
    def run(t):
        findings = [Finding("remap", "gpu0", Status.FAIL, Severity.DRAIN_AFTER_JOB, "pending",
                            code="remap_failed"),
                    Finding("checker", "dcgm", Status.ERROR, Severity.NONE,
                            "dcgm probe failed", code="dcgm_error")]
        return spool.check_records(findings, node="gpu001", source="sweep", time=t,
                                   job_id=None)

    spool.append(tmp_path, run(T0))
    deliver(historian, tmp_path)
    # epilog runs (which leave a sweep's checker interval alone), then the next sweep's 2
    # records across line 4
    spool.append(tmp_path, [_all_clear(T0 + timedelta(minutes=i), "epilog") for i in (1, 2, 3)])
    spool.append(tmp_path, run(T0 + timedelta(hours=3)))
    deliver(historian, tmp_path, chunk_lines=4)
    with historian.connect() as conn:
        rows = conn.execute(select(C.c.time, C.c.last_seen, C.c.is_open)
                            .where(C.c.check == "checker")).all()
        fails = conn.execute(select(schema.check_days.c.fail)
                             .where(schema.check_days.c.check == "checker")).scalars().all()
    assert [tuple(r) for r in rows] == [(datetime(2024, 3, 1, 0, 0),
                                         datetime(2024, 3, 1, 3, 0), True)]
    assert sum(fails) == 1


def test_chunks_stay_bounded_whatever_the_batch_holds(tmp_path):
    # distinct runs: cut at the size, as before
    spool.append(tmp_path, [_all_clear(T0 + timedelta(minutes=i)) for i in range(10)])
    batch = spool.claim(tmp_path)[0]
    assert [len(c) for c in _chunks(batch, 4)] == [4, 4, 2]
    spool.done(batch)
    # one "run" of 10 records (no node writes one that long): never more than twice the size
    spool.append(tmp_path, _remap(T0, gpus=10))
    batch = spool.claim(tmp_path)[0]
    chunks = list(_chunks(batch, 4))
    assert [len(c) for c in chunks] == [8, 2]
    assert sum(chunks, []) == list(spool.read_batch(batch))


def _checker_run(i: int, error: bool) -> list[dict]:
    t = T0 + timedelta(minutes=5 * i)
    findings = [Finding("ecc", "gpu0", Status.OK, Severity.NONE, "clean")]
    if error:
        findings.append(Finding("checker", "dcgm", Status.ERROR, Severity.WARN,
                                "dcgm probe failed", code="dcgm_error"))
    return spool.check_records(findings, node="gpu001", source="sweep", time=t, job_id=None)


def _checker_table(engine) -> tuple[list[tuple], list[tuple]]:
    with engine.connect() as conn:
        rows = conn.execute(select(C.c.id, C.c.time, C.c.last_seen, C.c.is_open)
                            .where(C.c.check == "checker").order_by(C.c.time)).all()
        days = conn.execute(select(schema.check_days.c.day, schema.check_days.c.fail,
                                   schema.check_days.c.warn)
                            .where(schema.check_days.c.check == "checker")).all()
    return [tuple(r) for r in rows], [tuple(d) for d in days]


def test_a_flush_cut_between_chunks_and_delivered_again_leaves_a_closed_checker_error_as_it_was(
        historian, tmp_path, monkeypatch):
    # three sweeps that could not ask DCGM, then clean ones (which close the error by leaving
    # it out): chunks [runs 0-1], [runs 2-4], [run 5], and the database lost on the third
    records = [r for i in range(6) for r in _checker_run(i, error=i < 3)]
    spool.append(tmp_path, records)
    real, writes = delivery._write, []

    def lost_on_the_third(conn, rows, report):
        writes.append(len(rows.checks))
        if len(writes) == 3:
            raise OperationalError("COMMIT", {}, Exception("server closed the connection"))
        return real(conn, rows, report)

    monkeypatch.setattr(delivery, "_write", lost_on_the_third)
    with pytest.raises(HistorianUnavailable):
        deliver(historian, tmp_path, chunk_lines=4)
    cut = _checker_table(historian)
    monkeypatch.setattr(delivery, "_write", real)
    deliver(historian, tmp_path, chunk_lines=4)  # the next flush: the whole batch again
    # one error, seen 00:00..00:10 and closed, counted once
    assert [row[1:] for row in cut[0]] == [(datetime(2024, 3, 1, 0, 0),
                                            datetime(2024, 3, 1, 0, 10), False)]
    assert sum(fail for _, fail, _ in cut[1]) == 1
    assert _checker_table(historian) == cut
    # and the one delivery of the same records into an empty table gives that table too
    with historian.begin() as conn:
        conn.execute(C.delete())
        conn.execute(schema.check_days.delete())
    spool.append(tmp_path, records)
    deliver(historian, tmp_path)
    assert _checker_table(historian) == cut


def test_an_error_after_a_clean_run_still_opens_a_new_interval(historian, tmp_path):
    records = [r for i, error in enumerate([True, False, True, True])
               for r in _checker_run(i, error)]
    spool.append(tmp_path, records)
    deliver(historian, tmp_path, chunk_lines=2)
    rows, days = _checker_table(historian)
    assert [row[1:] for row in rows] == [
        (datetime(2024, 3, 1, 0, 0), datetime(2024, 3, 1, 0, 0), False),
        (datetime(2024, 3, 1, 0, 10), datetime(2024, 3, 1, 0, 15), True)]
    assert sum(fail for _, fail, _ in days) == 2
