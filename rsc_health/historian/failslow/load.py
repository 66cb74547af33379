"""`detect(engine, now, cfg)`: the last [failslow] lookback_min minutes of the historian, judged
by the pure core.

    samples     rsc_health.historian.telemetry.load_samples (the telemetry helper's one door;
                none until it is installed: the step times are judged alone)
    membership  jobs of two or more nodes running in the window (jobs, job_nodes; a job sacct
                last read running ends on each node at its epilog, job_ends; a job sacct has
                not told of yet runs on the nodes whose prologs told, job_starts, once all
                it names have), each node's GPU model from its newest qualification run
                (qualify_runs) and its pipeline stage from the job's own step times when it
                wrote them
    steps       step_times in the window
    suspects    the nodes with an open suspect episode (historian.suspects.active): their
                onset was seen by an earlier window, and they are judged against their peers,
                not against their own start in this one (core.find_runs)
    rollups     finished multi-node jobs' telemetry rollups of the last [failslow]
                recurring_days (telemetry_job_rollups): each node's mean over each job, and
                each job's step times per node and stage averaged by the database; judged
                across jobs (recurring.py), counted from each node's last ended episode
                (historian.suspects.ended_at); read and judged only once every [failslow]
                recurring_every_min (the last judgement's time in ingest_cursors,
                ACROSS_CURSOR): the passes between judge inside jobs only

A job is (cluster, job id): two clusters in one historian count job ids each from its own
start, so a job id both clusters' jobs hold in the window is told apart as ID@CLUSTER (a step
row, which names no cluster, takes that of the job its node ran) before the core pools a job's
nodes as peers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy import Engine, and_, func, or_, select
from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError

from rsc_health.historian import schema
from rsc_health.historian.db import HistorianUnavailable, first_line, safe_url, writer
from rsc_health.historian.failslow.core import (
    MEMBER_COLUMNS,
    SAMPLE_COLUMNS,
    STEP_COLUMNS,
    FleetRate,
    Rules,
    detect_frame,
    fleet_rates,
    judged,
    shared_samples,
)
from rsc_health.historian.failslow.evidence import SuspectEvidence
from rsc_health.historian.failslow.recurring import ROLLUP_COLUMNS, Across, recurring_frame
from rsc_health.historian.freshness import CLOCK_AHEAD_S
from rsc_health.historian.ingest import bulk_write
from rsc_health.historian.suspects import active, ended_at


def _samples(engine: Engine, since: datetime, until: datetime) -> pd.DataFrame:
    try:
        from rsc_health.historian.telemetry import load_samples  # the telemetry helper's door
    except ImportError:
        return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    return load_samples(engine, since, until)


def _ended_by_epilogs(rows: pd.DataFrame, epilogs: pd.DataFrame) -> pd.DataFrame:
    """Each run with no end from sacct ended on a node at the first epilog that node ran for
    it: one logged at least CLOCK_AHEAD_S after the run's start. A node's clock may run that
    far ahead of slurmctld's (delivery believes it), and a requeued job's new run starts on
    the same nodes minutes after its last run's epilogs: one stamped by a clock ahead fell
    after the new start and ended the new run at once (helper-111)."""
    if epilogs.empty or rows.empty:
        return rows
    epilogs = epilogs.merge(rows[["pk", "node", "start"]], on=["pk", "node"])
    epilogs = epilogs[pd.to_datetime(epilogs["time"])
                      >= pd.to_datetime(epilogs["start"]) + pd.Timedelta(seconds=CLOCK_AHEAD_S)]
    first = epilogs.groupby(["pk", "node"], sort=False)["time"].min().rename("epilog")
    out = rows.merge(first, left_on=["pk", "node"], right_index=True, how="left")
    out["end"] = out["end"].where(out["end"].notna(), out["epilog"])
    return out.drop(columns="epilog")


def _gpu_models(conn) -> pd.DataFrame:
    """node, gpu_model: each node's newest qualification run's model (none: not listed)."""
    q = schema.qualify_runs
    newest = (select(q.c.node, func.max(q.c.ended).label("ended"))
              .where(q.c.gpu_model != "").group_by(q.c.node).subquery())
    models = (select(q.c.node, q.c.gpu_model)
              .join(newest, and_(newest.c.node == q.c.node, newest.c.ended == q.c.ended)))
    return pd.DataFrame(conn.execute(models).all(),
                        columns=["node", "gpu_model"]).drop_duplicates("node")


# How long a job sacct has not told of runs on a node whose epilog for it never came (the
# node died, its spool was lost, or a job_start no sacct row will ever match): the hourly
# `ingest sacct` tells of a job within the hour it started, so this is three ingests missed.
UNTOLD_MAX = timedelta(hours=3)


def membership(engine: Engine, since: datetime, until: datetime,
               gpus: pd.DataFrame | None = None) -> pd.DataFrame:
    """Multi-node job instances that ran in [since, until]: job_id, node, start, end, cluster,
    gpu_model (the node's newest qualification run's, '' when never qualified; `gpus`: those
    models already read).

    A job sacct last read running has no end until the next `ingest sacct` (hourly): on each
    node it ends when that node's epilog ran for it (job_ends, the first after its start),
    else it is running there. Otherwise another job's telemetry on the node (a one-node job
    at its power cap) was judged in it, against the job's other nodes.

    A job sacct has not told of yet (no row of its id running at its prologs' time) is read
    from its nodes' prologs (`untold`), so it is judged from the flush that delivers them, not
    from the next hourly ingest; once sacct tells of it, its row is the job and they are not
    read."""
    with engine.connect() as conn:
        rows = _runs(conn, since, until, many=True)
        more = untold(conn, since, until)
        gpus = _gpu_models(conn) if gpus is None else gpus
    members = _with_untold(rows, more)
    members = members.merge(gpus, on="node", how="left")
    return members.assign(gpu_model=members["gpu_model"].fillna(""))


def co_tenants(engine: Engine, since: datetime, until: datetime) -> pd.DataFrame:
    """One-node jobs that ran in [since, until] on a node a multi-node job ran on in it:
    job_id, node, start, end (an end sacct has not said yet: the node's epilog's, as for
    `membership`). Never judged (no peers), but a node one of them shared with a multi-node
    job (OverSubscribe, GPUs split) says one node-level figure, its worst GPU's, whoever's GPU
    that is: core.shared_samples marks its samples judged in no job, as for two multi-node
    jobs (core.telemetry_observations)."""
    with engine.connect() as conn:
        rows = _runs(conn, since, until, many=False)
    return rows.drop(columns="cluster")[list(MEMBER_COLUMNS)].reset_index(drop=True)


def _runs(conn, since: datetime, until: datetime, *, many: bool) -> pd.DataFrame:
    """The runs in [since, until] of the jobs of two or more nodes (`many`), or of the
    one-node jobs on a node one of those ran on: job_id, node, start, end, cluster, each
    open run ended at its node's epilog (_ended_by_epilogs)."""
    j, jn, je = schema.jobs, schema.job_nodes, schema.job_ends
    in_window = (j.c.start.is_not(None), j.c.start <= until,
                 or_(j.c.end.is_(None), j.c.end >= since))
    size = j.c.nnodes >= 2
    if not many:
        # only where a judged job ran: a fleet's one-node jobs elsewhere change nothing
        judged_nodes = (select(jn.c.node).select_from(j.join(jn, jn.c.job_pk == j.c.id))
                        .where(size, *in_window))
        size = and_(j.c.nnodes < 2, jn.c.node.in_(judged_nodes))
    stmt = (select(j.c.id, j.c.job_id, jn.c.node, j.c.start, j.c.end, j.c.cluster)
            .select_from(j.join(jn, jn.c.job_pk == j.c.id))
            .where(size, *in_window))
    # The epilogs of the runs whose end sacct has not said: a fleet's running jobs at most,
    # each probed by (node, job_id).
    open_runs = (select(j.c.id.label("pk"), jn.c.node, j.c.job_id, j.c.start)
                 .select_from(j.join(jn, jn.c.job_pk == j.c.id))
                 .where(size, j.c.end.is_(None), j.c.start.is_not(None),
                        j.c.start <= until).subquery())
    ends = (select(open_runs.c.pk, open_runs.c.node, je.c.time)
            .select_from(open_runs.join(je, and_(je.c.node == open_runs.c.node,
                                                 je.c.job_id == open_runs.c.job_id,
                                                 je.c.time >= open_runs.c.start))))
    rows = pd.DataFrame(conn.execute(stmt).all(), columns=["pk", *MEMBER_COLUMNS, "cluster"])
    epilogs = pd.DataFrame(conn.execute(ends).all(), columns=["pk", "node", "time"])
    rows = _ended_by_epilogs(rows, epilogs)
    if not many:
        rows = _ended_by_next_start(conn, rows)
    return rows.drop(columns="pk")


def _ended_by_next_start(conn, rows: pd.DataFrame) -> pd.DataFrame:
    """Each one-node run still with no end (no end from sacct, no epilog) ends on its node
    at the next start there of another job (any size): its node's own history says it had
    left by then. A row sacct last read RUNNING whose epilog never came (the node crashed in
    it, its spool lost) otherwise ran for ever, and every later sample of the node was
    'shared', its slow GPU judged in no job (helper-210). The price: a one-node job really
    still running when a multi-node job joins its node (OverSubscribe, GPUs split) is read as
    ended at that start, judged as before co-tenants were read, until sacct says its end."""
    open_runs = rows[rows["end"].isna()]
    if open_runs.empty:
        return rows
    j, jn = schema.jobs, schema.job_nodes
    later, on = j.alias("later"), jn.alias("on_node")
    # one index probe per open run (ix_job_nodes_node): the first start after it on its node
    nxt = (select(func.min(later.c.start))
           .select_from(later.join(on, on.c.job_pk == later.c.id))
           .where(on.c.node == jn.c.node, later.c.start > j.c.start, later.c.id != j.c.id)
           .scalar_subquery())
    stmt = (select(j.c.id, jn.c.node, nxt).select_from(j.join(jn, jn.c.job_pk == j.c.id))
            .where(j.c.id.in_(sorted({int(pk) for pk in open_runs["pk"]}))))
    nxt = (pd.DataFrame(conn.execute(stmt).all(), columns=["pk", "node", "next"])
           .set_index(["pk", "node"])["next"])
    out = rows.merge(nxt, left_on=["pk", "node"], right_index=True, how="left")
    out["end"] = out["end"].where(out["end"].notna(), out["next"])
    return out.drop(columns="next")


def untold(conn, since: datetime, until: datetime) -> pd.DataFrame:
    """Multi-node jobs `ingest sacct` has not told of, running in [since, until], from their
    nodes' prologs (job_starts): job_id, node, start, end, nodes_digest.

    On each node the job runs from its prolog's time to the first of: that node's epilog for
    it (job_ends), its next prolog for the same job id (a requeue's new run), UNTOLD_MAX (all
    stamped by the node's own clock, in the order the node ran them: unlike sacct's start, no
    clock ahead moves an epilog past the prolog after it, _ended_by_epilogs). A job
    is read once every node its nodelist names has told (a prolog of each, of the same list;
    a requeue onto the same nodes: each node's k-th prolog of it is its k-th run): judged
    among the nodes that flushed first, a leaf switch's congestion made one of them a suspect
    (core.delivered, which holds a slot back only for the nodes membership names). It is not
    read when a row of its job id, of any cluster, was running at any of its prologs' time
    (sacct's row is the job) or when its nodes' prologs name no list (an older node's)."""
    s, je, j = schema.job_starts, schema.job_ends, schema.jobs
    later = s.alias("later")
    # index probes per prolog row in the window (the primary keys, ix_jobs_job_id)
    epilog = (select(func.min(je.c.time))
              .where(je.c.node == s.c.node, je.c.job_id == s.c.job_id, je.c.time >= s.c.time)
              .scalar_subquery())
    again = (select(func.min(later.c.time))
             .where(later.c.node == s.c.node, later.c.job_id == s.c.job_id,
                    later.c.time > s.c.time)
             .scalar_subquery())
    told = (select(j.c.id)
            .where(j.c.job_id == s.c.job_id, j.c.start.is_not(None), j.c.start <= until,
                   or_(j.c.end.is_(None), j.c.end >= s.c.time))
            .exists())
    # a prolog sacct told of is left out: its job is read whole from sacct, and the rest of
    # a run some of whose prologs it told of is never whole
    stmt = (select(s.c.job_id, s.c.node, s.c.time, epilog, again, s.c.nnodes,
                   s.c.nodes_digest)
            .where(s.c.time >= since - UNTOLD_MAX, s.c.time <= until, ~told))
    cols = ["job_id", "node", "start", "epilog", "again", "nnodes", "nodes_digest"]
    rows = pd.DataFrame(conn.execute(stmt).all(), columns=cols)
    out = [*MEMBER_COLUMNS, "nodes_digest"]
    if rows.empty:
        return pd.DataFrame(columns=out)
    start = pd.to_datetime(rows["start"])
    ends = pd.concat([pd.to_datetime(rows["epilog"]), pd.to_datetime(rows["again"]),
                      start + UNTOLD_MAX], axis=1)
    rows = rows.assign(job_id=rows["job_id"].astype(str), node=rows["node"].astype(str),
                       start=start, end=ends.min(axis=1))
    rows = rows.sort_values(["start", "node"], kind="stable")
    rows = rows.assign(run=rows.groupby(["job_id", "nodes_digest", "node"]).cumcount())
    run = rows.groupby(["job_id", "nodes_digest", "run"])
    whole = run["node"].transform("nunique").to_numpy() == rows["nnodes"].to_numpy()
    keep = whole & (rows["end"] >= since).to_numpy()
    return rows.loc[keep, out].reset_index(drop=True)


def _with_untold(members: pd.DataFrame, more: pd.DataFrame) -> pd.DataFrame:
    """`members` (sacct's, with their cluster) and the jobs sacct has not told of. A prolog
    names no cluster: the window's one cluster when its jobs name one, else ''. When they name
    several, a job id whose prologs name two nodelists may be two clusters' jobs (each counts
    its own ids): it is not read (a requeue onto other nodes waits for sacct there too)."""
    if more.empty:
        return members
    clusters = set(members["cluster"].fillna("").astype(str)) - {""}
    if len(clusters) > 1:
        lists = more.groupby("job_id")["nodes_digest"].transform("nunique")
        more = more[lists.to_numpy() == 1]
    more = more.drop(columns="nodes_digest").assign(
        cluster=next(iter(clusters)) if len(clusters) == 1 else "")
    if members.empty:
        return more.reset_index(drop=True)
    return pd.concat([members, more], ignore_index=True)


def _workload(jobs: pd.DataFrame) -> pd.Series:
    """What ran, a placement's half of its key (recurring.py): the job's cluster, user and
    name, one per line."""
    return (jobs["cluster"].fillna("").astype(str) + "\n" + jobs["user"].fillna("").astype(str)
            + "\n" + jobs["name"].fillna("").astype(str))


def job_rollups(engine: Engine, since: datetime, until: datetime, metrics: list[str],
                gpus: pd.DataFrame | None = None) -> pd.DataFrame:
    """Finished multi-node jobs' telemetry rollups, ended in [since, until], as
    recurring.ROLLUP_COLUMNS: each node's mean of each of `metrics` the rollups hold (the
    telemetry vocabulary's; others are not rolled up), group its GPU model (`gpus`: the
    models already read), workload the job's cluster, user and name. A job id two clusters'
    jobs share is written ID@CLUSTER, as for the sweeps."""
    r, j = schema.telemetry_job_rollups, schema.jobs
    held = [m for m in metrics if f"{m}_mean" in r.c]
    if not held:
        return pd.DataFrame(columns=list(ROLLUP_COLUMNS))
    stmt = (select(j.c.id, j.c.job_id, j.c.cluster, j.c.start, j.c.end, j.c.user, j.c.name,
                   r.c.node, *(r.c[f"{m}_mean"] for m in held))
            .select_from(r.join(j, j.c.id == r.c.job_pk))
            .where(j.c.end >= since, j.c.end <= until, j.c.start.is_not(None)))
    with engine.connect() as conn:
        wide = pd.DataFrame(conn.execute(stmt).all(),
                            columns=["pk", "job_id", "cluster", "start", "end", "user", "name",
                                     "node", *held])
        gpus = _gpu_models(conn) if gpus is None else gpus
    if wide.empty:
        return pd.DataFrame(columns=list(ROLLUP_COLUMNS))
    wide = wide.assign(job_id=wide["job_id"].astype(str))
    shared = wide.groupby("job_id")["pk"].transform("nunique") > 1
    wide.loc[shared, "job_id"] = (wide.loc[shared, "job_id"] + "@"
                                  + wide.loc[shared, "cluster"].fillna("").astype(str))
    wide = wide.merge(gpus, on="node", how="left").assign(workload=_workload)
    long = wide.melt(id_vars=["job_id", "node", "gpu_model", "start", "end", "workload"],
                     value_vars=held,
                     var_name="metric", value_name="value").dropna(subset=["value"])
    long = long.assign(group=long["gpu_model"].fillna(""), value=long["value"].astype(float))
    return long[list(ROLLUP_COLUMNS)].reset_index(drop=True)


def job_steps(engine: Engine, since: datetime, until: datetime, metric: str) -> pd.DataFrame:
    """Per-rank step times of [since, until] as recurring.ROLLUP_COLUMNS: each (job, node,
    stage)'s mean seconds a step (its slowest rank's, as the table keeps them; averaged by the
    database, one row a job and node), `metric` the steps metric, group the stage (a stage's
    nodes are each other's peers, as in the sweeps), start and end its first and last step,
    workload the job's cluster, user and name as job_rollups gives them (the jobs table, for
    the job id that ran on the node). Only multi-node jobs the historian holds, on their
    nodes, inside their runs (a requeued job's each). Seconds only: NVRx's relative GPU
    scores are not times."""
    st = schema.step_times
    j, jn = schema.jobs, schema.job_nodes
    # A job's file is the job's word, not Slurm's (as in the sweeps, step_observations): only
    # lines of a job the historian holds, of a node it ran on, each inside a run of it there
    # (a requeued job's runs each), before they are averaged. Lines naming other nodes, or
    # job ids Slurm never ran, made a node no job held a suspect across "its" placements.
    placed = (select(j.c.job_id, jn.c.node).select_from(j.join(jn, jn.c.job_pk == j.c.id))
              .where(j.c.nnodes >= 2, j.c.start.is_not(None), j.c.start <= until,
                     or_(j.c.end.is_(None), j.c.end >= since)))
    ran = placed.add_columns(j.c.start, j.c.end).subquery()
    inside = and_(ran.c.job_id == st.c.job_id, ran.c.node == st.c.node,
                  st.c.time >= ran.c.start, or_(ran.c.end.is_(None), st.c.time <= ran.c.end))
    lines = (select(st.c.job_id, st.c.node, st.c.stage, st.c.step, st.c.seconds, st.c.time)
             .where(st.c.time >= since, st.c.time <= until, st.c.unit == "s",
                    select(ran.c.job_id).where(inside).exists())).subquery()
    stmt = (select(lines.c.job_id, lines.c.node, lines.c.stage, func.avg(lines.c.seconds),
                   func.min(lines.c.time), func.max(lines.c.time))
            .group_by(lines.c.job_id, lines.c.node, lines.c.stage))
    known = placed.add_columns(j.c.cluster, j.c.user, j.c.name)
    with engine.connect() as conn:
        rows = pd.DataFrame(conn.execute(stmt).all(),
                            columns=["job_id", "node", "stage", "value", "start", "end"])
        if rows.empty:
            return pd.DataFrame(columns=list(ROLLUP_COLUMNS))
        jobs = pd.DataFrame(conn.execute(known).all(),
                            columns=["job_id", "node", "cluster", "user", "name"])
    rows = rows.assign(job_id=rows["job_id"].astype(str), node=rows["node"].astype(str),
                       metric=metric, group="stage:" + rows["stage"].fillna("").astype(str),
                       value=pd.to_numeric(rows["value"], errors="coerce"),
                       start=pd.to_datetime(rows["start"]), end=pd.to_datetime(rows["end"]))
    # A team's training resubmitted onto the same nodes under a new id each time is one
    # placement, as its telemetry is: its stage-less files' last stage is a role, not chance.
    work = (jobs.assign(job_id=jobs["job_id"].astype(str), node=jobs["node"].astype(str),
                        workload=_workload)
            .drop_duplicates(["job_id", "node"])[["job_id", "node", "workload"]])
    rows = rows.merge(work, on=["job_id", "node"], how="inner")
    return rows[list(ROLLUP_COLUMNS)]


def steps(engine: Engine, since: datetime, until: datetime) -> pd.DataFrame:
    st = schema.step_times
    stmt = (select(st.c.job_id, st.c.rank, st.c.node, st.c.stage, st.c.step, st.c.seconds,
                   st.c.time)
            .where(st.c.time >= since, st.c.time <= until))
    with engine.connect() as conn:
        return pd.DataFrame(conn.execute(stmt).all(), columns=list(STEP_COLUMNS))


def one_cluster_per_job(members: pd.DataFrame,
                        step_rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Members and step rows with each job id that two clusters' jobs share in the window
    written ID@CLUSTER: one job to the core, its own nodes its peers. A step row takes the
    cluster of the job with its id that ran on its node (the file names none)."""
    if members.empty or "cluster" not in members:
        return members, step_rows
    cluster = members["cluster"].fillna("").astype(str)
    members = members.assign(job_id=members["job_id"].astype(str), cluster=cluster)
    per_id = members.groupby("job_id")["cluster"].nunique()
    shared = set(per_id[per_id > 1].index)
    if not shared:
        return members.drop(columns="cluster"), step_rows
    mine = members["job_id"].isin(shared)
    tag = members.loc[mine, ["job_id", "node", "cluster"]].drop_duplicates(["job_id", "node"])
    members = members.assign(job_id=members["job_id"].where(
        ~mine, members["job_id"] + "@" + members["cluster"])).drop(columns="cluster")
    if step_rows.empty:
        return members, step_rows
    rows = step_rows.assign(job_id=step_rows["job_id"].astype(str),
                            node=step_rows["node"].astype(str))
    rows = rows.merge(tag, on=["job_id", "node"], how="left")
    rows["job_id"] = rows["job_id"].where(rows["cluster"].isna(),
                                          rows["job_id"] + "@" + rows["cluster"].fillna(""))
    return members, rows.drop(columns="cluster")[list(step_rows.columns)]


def with_stages(members: pd.DataFrame, step_rows: pd.DataFrame) -> pd.DataFrame:
    """Each (job, node)'s pipeline stage from the job's drop-file step times (the stage most
    of its rows name); NVRx sections and the GPU score are not stages."""
    if step_rows.empty or members.empty:
        return members.assign(stage=None)
    pipe = step_rows[~step_rows["stage"].astype(str).str.startswith("section:")
                     & (step_rows["stage"] != "gpu") & (step_rows["stage"] != "")]
    if pipe.empty:
        return members.assign(stage=None)
    stage = (pipe.groupby(["job_id", "node"])["stage"]
             .agg(lambda s: s.value_counts().index[0]).rename("stage").reset_index())
    return members.merge(stage, on=["job_id", "node"], how="left")


def detect(engine: Engine, now: datetime, cfg: Any) -> list[SuspectEvidence]:
    """HistorianUnavailable (one line, no password) when the database cannot be read: a
    detector that cannot see must say so, never answer "no suspects"."""
    rules = Rules.from_config(cfg)
    across = Across.from_config(cfg)
    try:
        samples, members, step_rows, gpus = _window(engine, now, cfg)
        known = {e.node for e in active(engine)}  # the suspects table's one door
        rolled = pd.DataFrame(columns=list(ROLLUP_COLUMNS))
        judge_across = across.days > 0 and across.due(last_across(engine), now)
        if judge_across:
            back = now - timedelta(days=across.days)
            parts = [f for f in (job_rollups(engine, back, now, list(rules.metrics), gpus),
                                 job_steps(engine, back, now, rules.steps_metric)) if len(f)]
            rolled = pd.concat(parts, ignore_index=True) if parts else rolled
        counted_from = ended_at(engine) if len(rolled) else {}
        found = detect_frame(samples, members, step_rows, rules, known, now)
        if not judge_across:
            return found
        found += recurring_frame(rolled, rules, alpha=across.alpha, min_jobs=across.min_jobs,
                                 counted_from=counted_from, now=now)
        _judged_across(engine, now)
        return found
    except (OperationalError, InterfaceError, ProgrammingError) as exc:
        raise _unavailable(engine, exc, "fail-slow detection") from exc


def _window(engine: Engine, now: datetime, cfg: Any
            ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None, pd.DataFrame]:
    """What one detector pass at `now` reads, the last [failslow] lookback_min minutes:
    telemetry samples, the multi-node jobs' membership (one cluster per job id, each node's
    stage from its step files), the step rows (None: none), and the nodes' GPU models (read
    once: the rollups want them too)."""
    since = now - timedelta(minutes=float(cfg.get("failslow.lookback_min")))
    step_rows = steps(engine, since, now)
    with engine.connect() as conn:
        gpus = _gpu_models(conn)  # once a pass: the window's jobs and the rollups'
    members, step_rows = one_cluster_per_job(membership(engine, since, now, gpus), step_rows)
    samples = shared_samples(_samples(engine, since, now), co_tenants(engine, since, now))
    return (samples, with_stages(members, step_rows),
            step_rows if not step_rows.empty else None, gpus)


def _unavailable(engine: Engine, exc: Exception, what: str) -> HistorianUnavailable:
    return HistorianUnavailable(f"historian database {safe_url(str(engine.url))} could not be "
                                f"read for {what}: {first_line(exc)}")


def rates(engine: Engine, now: datetime, cfg: Any) -> list[FleetRate]:
    """The fleet's one-sweep excursions per judged metric in the window a detector pass at
    `now` reads (core.fleet_rates: what `fleet_chance` judges against), for an operator."""
    rules = Rules.from_config(cfg)
    try:
        samples, members, step_rows, _ = _window(engine, now, cfg)
    except (OperationalError, InterfaceError, ProgrammingError) as exc:
        raise _unavailable(engine, exc, "the fleet's rates") from exc
    return fleet_rates(judged(samples, members, step_rows, rules, now=now), rules)


# ingest_cursors: when the last pass judged across jobs ([failslow] recurring_every_min).
ACROSS_CURSOR = "failslow_across_jobs"


def last_across(engine: Engine) -> datetime | None:
    """The last across-jobs judgement's time (naive UTC, as the historian keeps times), None
    when never made or not a time."""
    c = schema.ingest_cursors
    with engine.connect() as conn:
        value = conn.execute(select(c.c.value).where(c.c.name == ACROSS_CURSOR)).scalar()
    try:
        kept = datetime.fromisoformat(str(value)) if value is not None else None
    except ValueError:
        return None
    if kept is not None and kept.tzinfo is not None:  # written by hand, with an offset
        kept = kept.astimezone(UTC).replace(tzinfo=None)
    return kept


def _judged_across(engine: Engine, now: datetime) -> None:
    """Keep `now` as the last across-jobs judgement's time (after it was made: a pass that
    fails before it judges again next time). One upsert, as the sacct cursor is kept: two
    passes at once (the timer and the strigger hook) each leave their time, neither fails."""
    with writer(engine).begin() as conn:
        bulk_write(conn, schema.ingest_cursors, ("name", "value"),
                   [(ACROSS_CURSOR, now.isoformat())], conflict=("name",), update=("value",))
