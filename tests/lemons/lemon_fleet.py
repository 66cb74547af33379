"""A tiny hand-built historian for lemon tests: SQLite in a temp dir, rows inserted with Core."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from sqlalchemy import insert

from rsc_health.historian import schema
from rsc_health.slurm.memory import MemorySlurm

AS_OF = datetime(2026, 3, 1)


class Fleet:
    """Insert helpers that fill in the columns a test does not care about."""

    def __init__(self, engine):
        self.engine = engine
        self._ids = itertools.count(1)

    def job(self, nodes, *, state="COMPLETED", end, minutes=60, job_id=None):
        pk = next(self._ids)
        start = end - timedelta(minutes=minutes)
        with self.engine.begin() as conn:
            conn.execute(
                insert(schema.jobs).values(
                    id=pk,
                    job_id=job_id or str(1000 + pk),
                    job_id_display=job_id or str(1000 + pk),
                    state=state,
                    submit=start,
                    start=start,
                    end=end,
                    nnodes=len(nodes),
                    gpus=8 * len(nodes),
                    nodelist=",".join(nodes),
                    instance_key=f"{pk}:{start}:{start}",
                )
            )
            conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
        return pk

    def attribute(self, pk, node, cause="xid", kind="check", code=""):
        with self.engine.begin() as conn:
            conn.execute(
                insert(schema.attributions).values(
                    job_pk=pk, node=node, cause=cause, kind=kind, code=code
                )
            )

    def failed(self, nodes, culprit, *, end, minutes=60, cause="xid", state="FAILED"):
        pk = self.job(nodes, state=state, end=end, minutes=minutes)
        if culprit:
            self.attribute(pk, culprit, cause=cause)
        return pk

    def xid(self, node, time, code="xid79", component="gpu0", status="fail"):
        with self.engine.begin() as conn:
            conn.execute(
                insert(schema.check_results).values(
                    id=f"c{next(self._ids)}",
                    time=time,
                    node=node,
                    source="sweep",
                    check="xid",
                    component=component,
                    status=status,
                    severity="drain_now" if status == "fail" else "none",
                    code=code,
                )
            )

    def event(self, node, start, hours=2, state="DRAIN", reason="x"):
        with self.engine.begin() as conn:
            conn.execute(
                insert(schema.node_events).values(
                    node=node,
                    start=start,
                    end=start + timedelta(hours=hours),
                    state=state,
                    reason=reason,
                )
            )

    def ticket(self, node, opened, closed=None, source="manual", reason="repair"):
        with self.engine.begin() as conn:
            conn.execute(
                insert(schema.tickets).values(
                    node=node, opened=opened, closed=closed, source=source, reason=reason
                )
            )

    def exclude(self, job_id, node, time):
        with self.engine.begin() as conn:
            conn.execute(insert(schema.job_exclusions).values(job_id=job_id, node=node, time=time))


def fleet_slurm(
    nodes: dict[str, tuple[str, str]] | None = None, *, size: int = 10, partition="learn"
) -> MemorySlurm:
    """The shipped in-memory Slurm holding n0..n(size-1) idle and `nodes` as {name: (state,
    reason)}, all in `partition`; a drain is stamped now, as scontrol would."""
    slurm = MemorySlurm([f"n{k}" for k in range(size)], partition=partition)
    for name, (state, reason) in (nodes or {}).items():
        slurm.add_node(name, state, reason)
    return slurm


def drained(slurm: MemorySlurm) -> list[tuple[str, str]]:
    """(node, reason) of every drain asked of Slurm."""
    return [(c[1], c[2]) for c in slurm.calls if c[0] == "drain"]
