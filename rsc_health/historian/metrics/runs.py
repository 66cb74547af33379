"""Measured ETTR per job run, next to the expected ETTR for the same run (paper Fig. 9).

A job run is the chain of instances of one Job ID across requeues, plus resubmissions linked by
a key (`link_by`): "job_id" (requeues only), "name_user" (same job name and user), or "tag"
(the first group of `tag_regex` in the job name -- the jobs table keeps no Comment column).
A submission joins the previous run with the same key when it became eligible no later than
`gap_s` after that run's last end, and did not start before the latest end among the key's
earlier submissions: a job that ran at the same time as another of its key (two sweeps under one
name, a job queued while its predecessor still ran and started beside it) starts a run of its
own. A run's job instances therefore never overlap, and its runtime never exceeds its
wallclock: measured ETTR <= 1.

Measured ETTR = productive runtime / wallclock from first eligibility to final end. As in the
paper, every instance that did not end COMPLETED counts as an interruption (so the measured
value is an underestimate), and productive runtime is the scheduled time less the paper's
unproductive terms (Appendix A, E[U]): u0 for every instance (the first start and each restart),
half a checkpoint interval per interruption, and w_cp per checkpoint interval of runtime.
The checkpoint interval is Daly-Young for the run's node count and the measured r_f unless set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sqlalchemy import Engine, Float, String, case, cast, func, literal, select, type_coerce

from rsc_health.historian.metrics._sql import (
    ALL_TIME,
    SECONDS_PER_DAY,
    Window,
    runtime_s,
    seconds_between,
)
from rsc_health.historian.metrics.ettr import expected_ettr, minutes
from rsc_health.historian.schema import jobs

LINK_MODES = ("job_id", "name_user", "tag")


@dataclass(frozen=True)
class RunOptions:
    link_by: str = "name_user"
    tag_regex: str = r"run=(\S+)"
    gap_s: float = 6 * 3600.0
    u0: float = minutes(5)  # days
    w_cp: float = minutes(5)  # days
    dt_cp: float | None = None  # days; None -> Daly-Young
    min_run_hours: float = 48.0
    min_gpus: int = 1

    def __post_init__(self):
        if self.link_by not in LINK_MODES:
            raise ValueError(
                f"link_by must be one of {', '.join(LINK_MODES)}, not {self.link_by!r}"
            )


def _submissions(window: Window, min_gpus: int):
    """One row per Job ID (of a cluster): its requeue chain folded up (first eligible, last
    end, ...)."""
    elig = func.coalesce(jobs.c.eligible, jobs.c.submit)
    return (
        select(
            jobs.c.job_id,
            func.min(jobs.c.name).label("name"),
            func.min(jobs.c.user).label("user"),
            func.min(elig).label("first"),
            func.max(jobs.c.end).label("last"),
            func.min(jobs.c.start).label("first_start"),
            func.count().label("instances"),
            func.sum(case((jobs.c.state != "COMPLETED", 1), else_=0)).label("interruptions"),
            func.sum(runtime_s()).label("runtime_s"),
            func.max(jobs.c.nnodes).label("nodes"),
            func.max(jobs.c.gpus).label("gpus"),
        )
        .where(jobs.c.start.is_not(None), jobs.c.gpus >= min_gpus, *window.clauses())
        # a Job ID is one cluster's: another cluster in the historian counts its own from 1
        .group_by(jobs.c.cluster, jobs.c.job_id)
    )


# What names a run and its size: the first columns of the linked runs and of job_runs' rows.
_RUN_KEY = ["job_ids", "name", "user", "gpus", "nodes", "instances", "interruptions"]
_RUN_COLS = [*_RUN_KEY, "runtime_s", "first", "last"]
_CHUNK = 100_000  # rows per fetch: bounded Python objects while streaming submissions


def _runs_by_job_id(engine: Engine, window: Window, opts: RunOptions) -> pd.DataFrame:
    """link_by=job_id: a run is one Job ID's requeue chain, so no linking is needed at all."""
    sub = _submissions(window, opts.min_gpus)
    q = sub.with_only_columns(
        literal(1).label("job_ids"), *(sub.selected_columns[c] for c in _RUN_COLS[1:])
    ).having(func.sum(runtime_s()) >= opts.min_run_hours * 3600.0)
    with engine.connect() as conn:
        return pd.DataFrame(conn.execute(q).all(), columns=_RUN_COLS)


def _runs_in_sql(engine: Engine, window: Window, opts: RunOptions) -> pd.DataFrame:
    """Link submissions into runs with window functions, aggregate, keep the long ones.

    prev_end = latest end among the key's earlier submissions; a submission starts a new run
    when there is none, it became eligible more than gap_s later, or it started before
    prev_end (it ran beside an earlier submission); the running sum of those
    starts numbers the runs. Only runs of at least min_run_hours leave the database. Used where
    the server sorts faster than the rows travel (PostgreSQL); SQLite links in numpy instead.
    """
    sub = _submissions(window, opts.min_gpus).subquery("sub")
    key = [sub.c.name, sub.c.user]
    order = [sub.c.first, sub.c.job_id]
    prev_end = func.max(sub.c.last).over(partition_by=key, order_by=order, rows=(None, -1))
    w1 = select(sub, prev_end.label("prev_end")).subquery("w1")
    starts_run = case(
        (w1.c.prev_end.is_(None), 1),
        (seconds_between(w1.c.prev_end, w1.c.first) > opts.gap_s, 1),
        # started while an earlier submission of the key still ran: not the same run
        (seconds_between(w1.c.prev_end, w1.c.first_start) < 0, 1),
        else_=0,
    )
    run_no = func.sum(starts_run).over(
        partition_by=[w1.c.name, w1.c.user], order_by=[w1.c.first, w1.c.job_id], rows=(None, 0)
    )
    w2 = select(w1, run_no.label("run_no")).subquery("w2")
    total = func.sum(w2.c.runtime_s)
    q = (
        select(
            func.count().label("job_ids"),
            func.min(w2.c.name),
            func.min(w2.c.user),
            func.max(w2.c.gpus),
            func.max(w2.c.nodes),
            func.sum(w2.c.instances),
            func.sum(w2.c.interruptions),
            total,
            func.min(w2.c.first),
            func.max(w2.c.last),
        )
        .group_by(w2.c.name, w2.c.user, w2.c.run_no)
        .having(total >= opts.min_run_hours * 3600.0)
    )
    with engine.connect() as conn:
        return pd.DataFrame(conn.execute(q).all(), columns=_RUN_COLS)


class _Codes:
    """Strings -> small integer codes, across chunks; ranks follow the strings' binary order."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def encode(self, values) -> np.ndarray:
        codes, uniques = pd.factorize(np.asarray(values, dtype=object))
        index = self.index
        mapped = np.fromiter(
            (index.setdefault(u, len(index)) for u in uniques), dtype=np.int64, count=len(uniques)
        )
        return mapped[codes] if len(codes) else np.zeros(0, np.int64)

    def strings(self) -> np.ndarray:
        out = np.empty(len(self.index), dtype=object)
        for s, i in self.index.items():
            out[i] = s
        return out

    def ranks(self) -> np.ndarray:
        """rank[code]: position of the code's string in sorted (code point) order."""
        strings = self.strings()
        order = sorted(range(len(strings)), key=strings.__getitem__)
        rank = np.empty(len(strings), dtype=np.int64)
        rank[order] = np.arange(len(strings))
        return rank


def _us(values: np.ndarray) -> np.ndarray:
    """Timestamps (datetime objects, or SQLite's ISO text) -> int64 microseconds, the
    resolution both databases store."""
    try:
        return values.astype("datetime64[us]").view(np.int64)
    except (ValueError, TypeError):  # a spelling numpy does not read: let pandas try
        ts = pd.to_datetime(pd.Series(values, dtype=object), format="ISO8601")
        return ts.to_numpy("datetime64[us]").view(np.int64)


def _stream(conn, stmt):
    """Row tuples of `stmt`, a chunk at a time, straight from the DBAPI cursor: no Row objects
    and no type processing (the callers convert whole columns at once). PostgreSQL streams
    through a server-side cursor, so neither side holds the whole result."""
    compiled = stmt.compile(dialect=conn.dialect)
    params = compiled.construct_params()
    if compiled.positional:
        params = tuple(params[k] for k in compiled.positiontup)
    dbapi = conn.connection.dbapi_connection
    named = conn.dialect.name == "postgresql"
    cur = dbapi.cursor(name="rsc_health_runs") if named else dbapi.cursor()
    try:
        cur.execute(str(compiled), params)
        while rows := cur.fetchmany(_CHUNK):
            yield rows
    finally:
        cur.close()


def _instances_sqlite(conn, window: Window, opts: RunOptions):
    """SQLite: one plain scan of the job instances (in table order, no index, no sort); the
    requeue chains are folded in numpy by _fold. Times as text: SQLite's own, parsed at once."""
    elig = func.coalesce(jobs.c.eligible, jobs.c.submit)
    stmt = select(
        jobs.c.job_id,
        jobs.c.name,
        jobs.c.user,
        type_coerce(elig, String),
        type_coerce(jobs.c.end, String),
        type_coerce(jobs.c.start, String),
        case((jobs.c.state != "COMPLETED", 1), else_=0),
        runtime_s(),
        jobs.c.nnodes,
        jobs.c.gpus,
        literal(1),
        jobs.c.cluster,  # _fold: a Job ID is one cluster's
    ).where(jobs.c.start.is_not(None), jobs.c.gpus >= opts.min_gpus, *window.clauses())
    return _stream(conn, stmt), True


def _submissions_db(conn, window: Window, opts: RunOptions):
    """Other databases: the server folds each Job ID's requeue chain (GROUP BY job_id)."""
    sub = _submissions(window, opts.min_gpus).subquery("sub")
    stmt = select(
        sub.c.job_id,
        sub.c.name,
        sub.c.user,
        type_coerce(sub.c.first, String),
        type_coerce(sub.c.last, String),
        type_coerce(sub.c.first_start, String),
        sub.c.interruptions,
        cast(sub.c.runtime_s, Float),
        sub.c.nodes,
        sub.c.gpus,
        sub.c.instances,
    )
    return _stream(conn, stmt), False


def _job_ids(text: np.ndarray) -> np.ndarray:
    """Job IDs as int64 where every one is a plain decimal number (Slurm's JobIDRaw is), which
    is 8 bytes a row instead of a string object; as strings otherwise."""
    try:
        nums = text.astype(np.int64)
    except (ValueError, OverflowError):
        return text
    if (nums.astype(str).astype(object) == text).all():  # no "007", "+7" or " 7"
        return nums
    return text


_ROW = np.dtype([
    ("job_id", object), ("name", object), ("user", object), ("first", object),
    ("last", object), ("first_start", object), ("interruptions", np.int32),
    ("runtime_s", np.float64), ("nodes", np.int32), ("gpus", np.int32), ("instances", np.int32),
    ("cluster", object),
])


def _columns(chunks, names: _Codes, users: _Codes) -> dict[str, np.ndarray]:
    """Row chunks -> column arrays: job IDs, name/user codes, times as int64 us, counts, and
    (SQLite's instances) cluster codes. Each chunk becomes one structured array in C (no
    per-value Python work), then columns."""
    keys = _ROW.names
    parts: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    clusters = _Codes()
    for rows in chunks:
        width = len(rows[0])
        dtype = _ROW if width == len(keys) else np.dtype(_ROW.descr[:width])
        arr = np.array(rows, dtype=dtype)
        del rows
        parts["job_id"].append(_job_ids(arr["job_id"]))
        parts["name"].append(names.encode(arr["name"]).astype(np.int32))
        parts["user"].append(users.encode(arr["user"]).astype(np.int32))
        parts["first"].append(_us(arr["first"]))
        parts["last"].append(_us(arr["last"]))
        parts["first_start"].append(_us(arr["first_start"]))
        for k in keys[6:-1]:
            parts[k].append(
                np.ascontiguousarray(arr[k]) if k in arr.dtype.names
                else np.ones(len(arr), np.int32)
            )
        if "cluster" in (arr.dtype.names or ()):
            parts["cluster"].append(clusters.encode(arr["cluster"]).astype(np.int32))
        del arr
    if any(p.dtype == object for p in parts["job_id"]):  # one odd Job ID: all as strings
        parts["job_id"] = [p.astype(str).astype(object) for p in parts["job_id"]]
    out = {}
    for k in keys:  # one column at a time, so the chunks and the whole never coexist
        chunks_k = parts.pop(k)
        if k == "cluster" and not chunks_k:
            continue  # submissions folded by the server, per cluster already
        out[k] = np.concatenate(chunks_k) if chunks_k else np.zeros(0, np.int64)
        del chunks_k
    return out


def _fold(c: dict[str, np.ndarray], name_rank: np.ndarray, user_rank: np.ndarray) -> dict:
    """Job instances -> one row per Job ID, as _submissions folds them: min name and user (in
    binary string order), min first, max last, summed counts and runtime, max size. The few
    requeued Job IDs are folded into their first instance's row; their other rows are dropped.
    A Job ID is one cluster's (`cluster`): another cluster's same number is another job."""
    codes, uniques = pd.factorize(c["job_id"])
    cluster = c.pop("cluster", None)
    if cluster is not None and len(cluster) and cluster.min() != cluster.max():
        codes, uniques = pd.factorize(cluster.astype(np.int64) * len(uniques) + codes)
    if len(uniques) == len(codes):  # no requeues: every instance is its own submission
        return c
    idx = np.flatnonzero(np.bincount(codes)[codes] > 1)
    idx = idx[np.argsort(codes[idx], kind="stable")]  # by Job ID, table order within
    starts = np.flatnonzero(np.r_[True, codes[idx][1:] != codes[idx][:-1]])
    del codes, uniques
    lead = idx[starts]
    for k, ufunc in (("first", np.minimum), ("last", np.maximum),
                     ("first_start", np.minimum), ("nodes", np.maximum),
                     ("gpus", np.maximum), ("interruptions", np.add), ("instances", np.add)):
        c[k][lead] = ufunc.reduceat(c[k][idx], starts)
    # Summed in table order, one Job ID at a time, as the database sums them.
    c["runtime_s"][lead] = [float(sum(x)) for x in np.split(c["runtime_s"][idx], starts[1:])]
    for k, rank in (("name", name_rank), ("user", user_rank)):
        code_of_rank = np.argsort(rank)
        c[k][lead] = code_of_rank[np.minimum.reduceat(rank[c[k][idx]], starts)]
    keep = np.ones(len(c["job_id"]), dtype=bool)
    keep[idx] = False
    keep[lead] = True
    for k in list(c):
        c[k] = c[k][keep]
    return c


def _runs_in_numpy(engine: Engine, window: Window, opts: RunOptions) -> pd.DataFrame:
    """The linking of _runs_in_sql (and, for regex tags, of tags) in numpy over streamed rows.

    Same rule, same order: submissions sorted by (key, first eligible, job_id); prev_end is the
    running maximum of earlier ends within the key; a submission starts a run when it has none,
    is eligible more than gap_s after it, or started before it. name and user of a run are its
    first submission's (for name_user they are the key itself).
    """
    names, users = _Codes(), _Codes()
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            chunks, instances = _instances_sqlite(conn, window, opts)
        else:
            chunks, instances = _submissions_db(conn, window, opts)
        c = _columns(chunks, names, users)
    if not len(c["job_id"]):
        return pd.DataFrame(columns=_RUN_COLS)
    name_strings, user_strings = names.strings(), users.strings()
    if instances:
        c = _fold(c, names.ranks(), users.ranks())
    n = len(c["job_id"])
    if opts.link_by == "tag":
        tags = pd.Series(name_strings, dtype=object).str.extract(opts.tag_regex, expand=False)
        tag_codes, _ = pd.factorize(tags)  # -1 where a name has no tag
        key = tag_codes[c["name"]].astype(np.int64)
        untagged = key < 0
        key[untagged] = -1 - np.flatnonzero(untagged)  # a run of its own Job ID
    else:
        key = c["name"].astype(np.int64) * max(len(user_strings), 1) + c["user"]
    first, last = c["first"], c["last"]
    order = np.lexsort((first, key))
    _break_ties_by_job_id(order, key, first, c["job_id"])
    k, f, la = key[order], first[order], last[order]
    new_key = np.r_[True, k[1:] != k[:-1]]
    seg = np.cumsum(new_key) - 1
    del k, key
    # Latest end so far within each key: a running maximum that restarts at every key, done as
    # one running maximum of (key segment, rank of end), which only grows across segments.
    by_end = np.argsort(la, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_end] = np.arange(n)
    base = seg * n
    cummax = la[by_end[np.maximum.accumulate(base + rank) - base]]
    del by_end, rank, base, seg
    prev_end = np.r_[np.int64(0), cummax[:-1]]
    gap_us = f - prev_end
    overlaps = c["first_start"][order] < prev_end
    starts_run = new_key | (gap_us > np.int64(round(opts.gap_s * 1e6))) | overlaps
    run_of_row = np.cumsum(starts_run) - 1
    del starts_run, prev_end, cummax
    runtime = np.bincount(run_of_row, weights=c["runtime_s"][order])
    keep = runtime >= opts.min_run_hours * 3600.0
    if not keep.any():
        return pd.DataFrame(columns=_RUN_COLS)
    # Only the rows of the runs that are kept go on (a few percent of all, typically).
    rows = keep[run_of_row]
    order, f, la, run_of_row = order[rows], f[rows], la[rows], run_of_row[rows]
    starts = np.flatnonzero(np.r_[True, run_of_row[1:] != run_of_row[:-1]])
    lead = order[starts]  # each run's first submission
    runs = pd.DataFrame(
        {
            "job_ids": np.diff(np.r_[starts, len(order)]),
            "name": name_strings[c["name"][lead]],
            "user": user_strings[c["user"][lead]],
            "gpus": np.maximum.reduceat(c["gpus"][order], starts),
            "nodes": np.maximum.reduceat(c["nodes"][order], starts),
            "instances": np.add.reduceat(c["instances"][order], starts),
            "interruptions": np.add.reduceat(c["interruptions"][order], starts),
            "runtime_s": runtime[keep],
            "first": np.minimum.reduceat(f, starts).view("datetime64[us]"),
            "last": np.maximum.reduceat(la, starts).view("datetime64[us]"),
        }
    )
    return runs


def _break_ties_by_job_id(order, key, first, job_id) -> None:
    """Within equal (key, first), order by job_id text, as the SQL ORDER BY does (in place)."""
    k, f = key[order], first[order]
    tie = (k[1:] == k[:-1]) & (f[1:] == f[:-1])
    if not tie.any():
        return
    pos = np.flatnonzero(tie)
    group_starts = pos[np.r_[True, pos[1:] != pos[:-1] + 1]]
    for s in group_starts.tolist():
        e = s + 1
        while e < len(tie) and tie[e]:
            e += 1
        block = order[s : e + 1]
        order[s : e + 1] = sorted(block.tolist(), key=lambda i: str(job_id[i]))


def job_runs(
    engine: Engine, r_f: float, window: Window = ALL_TIME, opts: RunOptions = RunOptions()
) -> pd.DataFrame:
    """One row per job run of at least `min_run_hours` runtime, longest first."""
    cols = [
        *_RUN_KEY,
        "runtime_hours",
        "wallclock_hours",
        "queue_hours",
        "productive_hours",
        "checkpoint_interval_min",
        "measured_ettr",
        "expected_ettr",
    ]
    if opts.link_by == "job_id":
        fetch = _runs_by_job_id
    elif opts.link_by == "name_user" and engine.dialect.name != "sqlite":
        fetch = _runs_in_sql
    else:
        fetch = _runs_in_numpy
    runs = fetch(engine, window, opts)
    if runs.empty:
        return pd.DataFrame(columns=cols)
    for c in ("first", "last"):
        runs[c] = pd.to_datetime(runs[c])
    runs["runtime_s"] = runs["runtime_s"].astype(float)
    day = SECONDS_PER_DAY
    runtime = runs["runtime_s"].to_numpy() / day
    wall = (runs["last"] - runs["first"]).dt.total_seconds().to_numpy() / day
    nodes = runs["nodes"].to_numpy(dtype=float)
    lam = nodes * r_f
    with np.errstate(divide="ignore"):
        dt = np.sqrt(2.0 * opts.w_cp / lam) if opts.dt_cp is None else np.full_like(lam, opts.dt_cp)
    ints = runs["interruptions"].to_numpy(dtype=float)
    inst_n = runs["instances"].to_numpy(dtype=float)
    ckpt_share = np.where(np.isinf(dt), 0.0, opts.w_cp / (dt + opts.w_cp))
    lost = opts.u0 * inst_n + ints * np.where(np.isinf(dt), 0.0, dt / 2.0) + runtime * ckpt_share
    productive = np.clip(runtime - lost, 0.0, None)
    queue = np.clip(wall - runtime, 0.0, None)
    runs["runtime_hours"] = runtime * 24
    runs["wallclock_hours"] = wall * 24
    runs["queue_hours"] = queue * 24
    runs["productive_hours"] = productive * 24
    runs["checkpoint_interval_min"] = dt * 1440
    runs["measured_ettr"] = np.where(wall > 0, productive / wall, np.nan)
    # Expected ETTR for the same N, productive runtime, r_f and this run's mean queue per instance.
    with np.errstate(divide="ignore", invalid="ignore"):
        runs["expected_ettr"] = expected_ettr(
            nodes,
            r_f,
            np.maximum(productive, 1e-9),
            u0=opts.u0,
            w_cp=opts.w_cp,
            dt_cp=None if opts.dt_cp is None else np.full_like(lam, opts.dt_cp),
            queue=queue / inst_n,
        )
    runs["interruptions"] = runs["interruptions"].astype(int)
    runs = runs.sort_values("runtime_hours", ascending=False).reset_index(drop=True)
    return runs[cols]
