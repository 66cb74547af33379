"""Qualification runs and results in the historian, and the peers a new result is judged by:
the latest usable value (_usable) of the same metric, slot and test from each other node with
the same GPU model and driver, within [qualify] peer_days (one value per node: a node
qualified ten times counts once)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, func, or_, select

from rsc_health.historian import schema
from rsc_health.qualify.judge import INCONCLUSIVE, PASS, UNJUDGED, Judgement, robust_spread


@dataclass(frozen=True)
class Run:
    run_id: str
    node: str
    tier: str
    started: datetime
    ended: datetime
    verdict: str
    reason: str
    gpu_model: str = ""
    driver: str = ""
    job_id: str | None = None


def peers(conn, *, metric: str, idx: str, gpu_model: str, driver: str, exclude_node: str,
          since: datetime, test: str | None = None) -> list[float]:
    """`test`: only values measured by that test ([qualify.tests.NAME]): one metric name from
    two tests is two measurements (dcgm-diag/passed_results of `dcgmi diag -r 1` and `-r 3`,
    gpu-burn's Gflop/s over 60 s and over 600 s), and a node is judged against its own."""
    r, q = schema.qualify_runs, schema.qualify_results
    same_test = [q.c.test == test] if test is not None else []
    newest = (
        select(r.c.node, q.c.value,
               func.row_number().over(partition_by=r.c.node,
                                      order_by=r.c.ended.desc()).label("n"))
        .select_from(q.join(r, q.c.run_id == r.c.run_id))
        .where(and_(q.c.metric == metric, q.c.idx == idx, _usable(q), *same_test,
                    r.c.gpu_model == gpu_model, r.c.driver == driver,
                    r.c.node != exclude_node, r.c.ended >= since, q.c.value.is_not(None)))
        .subquery()
    )
    return [float(v) for v in conn.execute(select(newest.c.value).where(newest.c.n == 1))
            .scalars()]


def expected(conn, *, test: str, gpu_model: str, driver: str, exclude_node: str,
             since: datetime, min_peers: int) -> set[tuple[str, str]]:
    """The (metric, index) pairs a node of this group owes in `test`: those in the newest run
    of the test (any verdict: a value's presence, not its worth) of at least min_peers other
    nodes, and of more than half of the nodes that ran it (a few odd nodes of the group, e.g.
    fewer HCAs, never set what the rest owe). A node lacking one proved less than its peers
    (verdict.missing): never a pass."""
    r, q = schema.qualify_runs, schema.qualify_results
    newest = (
        select(r.c.node, r.c.run_id,
               func.row_number().over(partition_by=r.c.node,
                                      order_by=r.c.ended.desc()).label("n"))
        .where(and_(r.c.gpu_model == gpu_model, r.c.driver == driver,
                    r.c.node != exclude_node, r.c.ended >= since,
                    r.c.run_id.in_(select(q.c.run_id).where(q.c.test == test))))
        .subquery()
    )
    rows = conn.execute(
        select(newest.c.node, q.c.metric, q.c.idx)
        .select_from(q.join(newest, q.c.run_id == newest.c.run_id))
        .where(and_(newest.c.n == 1, q.c.test == test))
    ).all()
    nodes = {node for node, _m, _i in rows}
    holders: dict[tuple[str, str], set[str]] = {}
    for node, metric, idx in rows:
        holders.setdefault((metric, idx or ""), set()).add(node)
    return {key for key, by in holders.items()
            if len(by) >= max(min_peers, 1) and 2 * len(by) > len(nodes)}


def _usable(q):
    """A value a peer may be judged by: one that passed, or one measured before the group had
    enough peers to judge it (UNJUDGED). A fleet's first nodes of a new GPU model or driver
    are peers to each other that way; the median and MAD stay robust to the odd bad one among
    them, and a value that failed its judgement is never a peer."""
    return or_(q.c.status == PASS, and_(q.c.status == INCONCLUSIVE, q.c.basis == UNJUDGED))


def record(conn, run: Run, judgements: list[tuple[str, Judgement, str, bool]]) -> None:
    """judgements: (test, judgement, unit, higher_is_better) per metric."""
    conn.execute(schema.qualify_runs.insert().values(**run.__dict__))
    rows = [dict(run_id=run.run_id, test=test, metric=j.metric, idx=j.index, value=j.value,
                 unit=unit, higher_is_better=hib, status=j.status, reason=j.reason,
                 basis=j.basis, peer_median=j.median, threshold=j.threshold,
                 percentile=j.percentile, peers=j.peers)
            for test, j, unit, hib in judgements]
    if rows:
        conn.execute(schema.qualify_results.insert(), rows)


def baseline(conn, *, since: datetime) -> list[dict]:
    """The fleet's own baseline: per GPU model, driver, metric and slot, the passing values'
    node count, median and robust spread (what a new result is judged against)."""
    r, q = schema.qualify_runs, schema.qualify_results
    rows = conn.execute(
        select(r.c.gpu_model, r.c.driver, q.c.metric, q.c.idx, q.c.unit, r.c.node, q.c.value)
        .select_from(q.join(r, q.c.run_id == r.c.run_id))
        .where(and_(_usable(q), r.c.ended >= since, q.c.value.is_not(None)))
        .order_by(r.c.ended)
    ).all()
    latest: dict[tuple, dict[str, float]] = {}
    units: dict[tuple, str] = {}
    for model, driver, metric, idx, unit, node, value in rows:
        key = (model, driver, metric, idx)
        latest.setdefault(key, {})[node] = float(value)  # ordered by time: the newest wins
        units[key] = unit
    out = []
    for key, by_node in sorted(latest.items()):
        values = list(by_node.values())
        med = statistics.median(values)
        out.append(dict(gpu_model=key[0], driver=key[1], metric=key[2], idx=key[3],
                        unit=units[key], nodes=len(values), median=med,
                        spread_pct=round(100 * robust_spread(values) / med, 3) if med else None))
    return out


def latest_runs(conn, node: str, limit: int = 5) -> list[dict]:
    r = schema.qualify_runs
    runs = conn.execute(select(r).where(r.c.node == node).order_by(r.c.ended.desc())
                        .limit(limit)).mappings().all()
    q = schema.qualify_results
    out = []
    for run in runs:
        results = conn.execute(select(q).where(q.c.run_id == run["run_id"])
                               .order_by(q.c.test, q.c.metric, q.c.idx)).mappings().all()
        out.append({**dict(run), "results": [dict(x) for x in results]})
    return out


def since(now: datetime, cfg) -> datetime:
    return now - timedelta(days=float(cfg.get("qualify.peer_days")))
