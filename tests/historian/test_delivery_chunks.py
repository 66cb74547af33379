"""A batch delivered in chunks gives the table one delivery would: a chunk boundary never cuts
one run's records in two (intervals.fold takes a (node, time) as the whole run)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from rsc_health import spool
from rsc_health.historian import schema
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
