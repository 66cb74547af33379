"""A job as `ingest sacct` leaves it in the historian: its row in `jobs` (one instance, keyed
as sacct_parse keys it) and its nodes in `job_nodes`. Shared by the fail-slow and step-time
tests that need a job the historian holds."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import insert

from rsc_health.historian import schema


def add_job(engine, job_id: str, start: datetime, nodes: list[str], *,
            end: datetime | None = None, state: str = "RUNNING",
            submit: datetime | None = None) -> int:
    """The job's row (end None: sacct last read it running) and its nodes; its primary key."""
    with engine.begin() as conn:
        pk = conn.execute(insert(schema.jobs).values(
            job_id=job_id, job_id_display=job_id, state=state,
            submit=start if submit is None else submit, start=start, end=end,
            nnodes=len(nodes), instance_key=f"{job_id}:{start}:{start}")
            .returning(schema.jobs.c.id)).scalar_one()
        conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
    return pk
