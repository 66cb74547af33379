"""Telemetry in the historian: the one door to the samples, and their rollups.

Each sweep's `telemetry` spool record lands as rows of `telemetry_samples` (node, time, metric,
value, component: the vocabulary of model.Metric; historian/ingest/delivery.py), kept
`[historian] telemetry_retention_days` (retention.py prunes them). `load_samples` is how
anything reads them (the fail-slow detector included).

`rollup` (run by `healthctl ingest telemetry`, from the ingest timer after sacct) condenses
them, to keep after the samples are gone:

- per node and multi-node job (`telemetry_job_rollups`): the samples of each node of the job
  (job_nodes) between its start and end, for every job of 2+ nodes that has ended and has
  no rollup yet (a job sacct brought in late is still rolled up, while its samples last);
- per node-day outside such jobs (`telemetry_day_rollups`): for each whole day (UTC) the
  samples no multi-node job of that node covered, once the day is `SETTLE` old (nodes flush
  their spools every 30 minutes), and never a day after the newest sample's. A job still
  running at the time counts as covering.

Each job and day is rolled up once more `LATE` (a day) after the first time: a node cut off
from the historian for hours delivers its spool once back, and its samples of a job or day
already rolled up land in them then (`late_jobs`, `late_days` count those that grew). A job
or day whose samples are no more than its rows hold (a count: almost always) is left as it is,
and so is one that retention has begun to prune.

Each rollup row is one node's, with per metric: n, mean, min, max, `past` (samples beyond
the metric's warn threshold, [telemetry] warn_above / warn_below: the fraction is past / n;
NULL for a metric with no threshold)
and `worst`, the component that was the worst most often (schema.py says why wide). What a
row would repeat is kept once: the row's sample count in `sweeps` (a metric's n is NULL when
it equals it; 0016) and a metric that held one value in its min (mean and max NULL); the
readers give every figure back whole.
`load_rollups` reads them back one row per metric. Rolling up the same job or day again
replaces its rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Engine, and_, delete, exists, func, select

from rsc_health.historian import schema
from rsc_health.historian.db import TURNS_TELEMETRY_ROLLUP, take_turns, writer
from rsc_health.model import LOWER_IS_WORSE, ROLLED_UP, Metric

COLUMNS = ["node", "time", "metric", "value", "component"]
CURSOR = "telemetry_rollup_day"  # ingest_cursors: the first day not rolled up yet
SETTLE = timedelta(hours=1)  # a day is rolled up once every node has flushed it
# ... and again LATE after that, with the samples of a node that flushed late (cut off for
# hours); the ingest_cursors of that second pass: the first job end, and the first day, not
# rolled up again yet.
LATE = timedelta(days=1)
LATE_JOBS = "telemetry_rollup_late_jobs"
LATE_DAYS = "telemetry_rollup_late_days"
NODES_PER_QUERY = 500  # node names per IN (...) list
_METRICS = frozenset(m.value for m in ROLLED_UP)  # the metrics the rollups hold


def _naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo is not None else t


def load_samples(engine: Engine, since: datetime, until: datetime,
                 nodes: Iterable[str] | None = None):
    """The samples with since <= time < until (of `nodes` only, when given), as a
    pandas.DataFrame[node, time, metric, value, component] ordered by node, metric, time:
    one row per metric a sweep sampled. Times are naive UTC, as the historian keeps them."""
    import pandas as pd

    s = schema.telemetry_samples
    names = [c.name for c in s.columns]
    base = select(s).where(s.c.time >= _naive(since), s.c.time < _naive(until))
    wanted = None if nodes is None else sorted(set(nodes))
    rows: list = []
    with engine.connect() as conn:
        if wanted is None:
            rows = list(conn.execute(base))
        else:
            for i in range(0, len(wanted), NODES_PER_QUERY):
                rows += list(conn.execute(base.where(s.c.node.in_(wanted[i:i + NODES_PER_QUERY]))))
    wide = pd.DataFrame(rows, columns=names)
    parts = []
    for m in Metric:
        part = wide.loc[wide[m.value].notna(), ["node", "time", m.value, f"{m.value}_c"]]
        part.columns = ["node", "time", "value", "component"]
        part.insert(2, "metric", m.value)
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    frame["time"] = pd.to_datetime(frame["time"])
    frame["value"] = frame["value"].astype(float)
    frame["component"] = frame["component"].fillna("").astype(str)
    return frame.sort_values(["node", "metric", "time"], kind="stable").reset_index(drop=True)


@dataclass
class RollupReport:
    jobs: int = 0
    job_rows: int = 0
    days: int = 0
    day_rows: int = 0
    # Rolled up again LATE after the first time, holding samples that came after it.
    late_jobs: int = 0
    late_days: int = 0

    def summary(self) -> str:
        text = (f"telemetry rollups: {self.jobs} job(s) -> {self.job_rows} row(s), "
                f"{self.days} day(s) -> {self.day_rows} row(s)")
        if self.late_jobs or self.late_days:
            text += (f"; {self.late_jobs} job(s) and {self.late_days} day(s) rolled up again "
                     "with samples that came late")
        return text


def warn_limit(cfg, metric: Metric) -> float | None:
    """The metric's warn line ([telemetry] warn_above, or warn_below for LOWER_IS_WORSE)."""
    table = cfg.get("telemetry.warn_below" if metric in LOWER_IS_WORSE else "telemetry.warn_above")
    value = table.get(metric.value)
    return None if value is None else float(value)


def _aggregate(conn, where, cfg) -> dict[tuple[str, str], dict]:
    """(node, metric) -> n, mean, min, max, past, worst of the samples `where`: one read of
    the rows, the figures in pandas (a GROUP BY per metric for its most frequent worst
    component cost a scan each, and the node-day's NOT EXISTS with every one)."""
    import pandas as pd

    s = schema.telemetry_samples
    frame = pd.DataFrame(list(conn.execute(select(s).where(where))),
                         columns=[c.name for c in s.columns])
    parts = []
    for m in ROLLED_UP:
        sub = frame.loc[frame[m.value].notna(), ["node", m.value, f"{m.value}_c"]]
        if sub.empty:
            continue
        values = sub[m.value].astype(float)
        limit = warn_limit(cfg, m)
        if limit is None:
            past = values * 0
        else:
            past = (values < limit) if m in LOWER_IS_WORSE else (values > limit)
        parts.append(pd.DataFrame({"node": sub["node"], "metric": m.value, "v": values,
                                   "past": past.astype(int),
                                   "comp": sub[f"{m.value}_c"].fillna("").astype(str)}))
    if not parts:
        return {}
    long = pd.concat(parts, ignore_index=True)
    # A metric with no warn line has nothing to count: its `past` is NULL, not a claimed 0
    # (and 4 bytes less a row: the storage budget).
    unlined = {m.value for m in Metric if warn_limit(cfg, m) is None}
    figures = long.groupby(["node", "metric"]).agg(
        n=("v", "size"), mean=("v", "mean"), min=("v", "min"), max=("v", "max"),
        past=("past", "sum"))
    # The most frequent worst component; ties to the smaller name, so a rerun writes the
    # same row.
    counts = long.groupby(["node", "metric", "comp"]).size().reset_index(name="k")
    worst = counts.sort_values(["node", "metric", "k", "comp"],
                               ascending=[True, True, False, True]) \
        .drop_duplicates(["node", "metric"]).set_index(["node", "metric"])["comp"]
    figures = figures.join(worst)
    # A metric that held one value over the job or day (a link ratio at 1.0, an error rate
    # at 0: most of them, most of the time) keeps it once, in min; mean and max are NULL and
    # read back as min (`_filled`): a NULL costs a row no bytes (the storage budget).
    return {(str(node), str(metric)): {
        "n": int(n), "mean": None if lo == hi else float(mean), "min": float(lo),
        "max": None if lo == hi else float(hi),
        "past": None if metric in unlined else int(past), "worst": str(comp)[:16]}
        for (node, metric), n, mean, lo, hi, past, comp in figures.itertuples()}


def _reported(row, metric: str) -> bool:
    """Whether a rollup row holds the metric (its min is set whenever it does; its n is NULL
    when it equals the row's sweeps, since 0016)."""
    return row.get(f"{metric}_min") is not None or row.get(f"{metric}_n") is not None


def _filled(stats: dict, sweeps=None) -> dict:
    """A metric's stats as stored, read back whole: n from the row's `sweeps` where the
    rollup kept it once (0016), mean and max from min where it kept a constant once."""
    if stats.get("n") is None and sweeps is not None:
        stats["n"] = sweeps
    if stats.get("n") is not None and stats.get("min") is not None:
        for stat in ("mean", "max"):
            if stats.get(stat) is None:
                stats[stat] = stats["min"]
    return stats


def _wide(agg: dict[tuple[str, str], dict], key: dict) -> list[dict]:
    """One row per node: `key` (job_pk or day), node, and `<metric>_<stat>` for its metrics."""
    rows: dict[str, dict] = {}
    for (node, metric), stats in agg.items():
        if metric not in _METRICS:
            continue  # a name no column holds (a newer node's): in the samples only
        row = rows.setdefault(node, {**key, "node": node})
        row.update({f"{metric}_{stat}": value for stat, value in stats.items()})
    for row in rows.values():
        # The row's sample count once (0016): most metrics are sampled every sweep, and a
        # NULL costs no bytes; a metric sampled less often keeps its own n.
        counts = [row[f"{m}_n"] for m in _METRICS if row.get(f"{m}_n") is not None]
        row["sweeps"] = max(counts)
        for m in _METRICS:
            if row.get(f"{m}_n") == row["sweeps"]:
                row[f"{m}_n"] = None
    return list(rows.values())


def load_rollups(engine: Engine, kind: str, since, until, nodes: Iterable[str] | None = None):
    """Rollups as a long pandas.DataFrame[<job_pk or day>, node, metric, n, mean, min, max,
    past, worst]: kind "job" (jobs that ended since <= end < until) or "day" (since <= day <
    until), one row per metric a node reported."""
    import pandas as pd

    if kind == "job":
        r, j = schema.telemetry_job_rollups, schema.jobs
        q = select(r).join(j, j.c.id == r.c.job_pk).where(j.c.end >= _naive(since),
                                                          j.c.end < _naive(until))
        first = "job_pk"
    else:
        r = schema.telemetry_day_rollups
        q = select(r).where(r.c.day >= since, r.c.day < until)
        first = "day"
    if nodes is not None:
        q = q.where(r.c.node.in_(sorted(set(nodes))))
    with engine.connect() as conn:
        wide = [dict(row._mapping) for row in conn.execute(q)]
    stats = [stat for stat, _kind in schema.ROLLUP_STATS]
    long = [{first: row[first], "node": row["node"], "metric": m.value,
             **_filled({stat: row[f"{m.value}_{stat}"] for stat in stats}, row.get("sweeps"))}
            for row in wide for m in ROLLED_UP if _reported(row, m.value)]
    return pd.DataFrame(long, columns=[first, "node", "metric", *stats])


def latest_rollups(engine: Engine, node: str, cfg=None) -> dict:
    """A node's newest rollups, for `healthctl node`: {"job": {job_id, start, end, metrics},
    "day": {day, metrics}} (None where it has none). `metrics`: {metric: {n, mean, min, max,
    past, past_frac, worst, limit}}, in the vocabulary's order; `limit` is the metric's warn
    threshold from `cfg` ([telemetry] warn_above / warn_below), what `past` counted against."""
    j, r, d = schema.jobs, schema.telemetry_job_rollups, schema.telemetry_day_rollups
    with engine.connect() as conn:
        job = conn.execute(select(r, j.c.job_id, j.c.start, j.c.end)
                           .join(j, j.c.id == r.c.job_pk).where(r.c.node == node)
                           .order_by(j.c.end.desc(), j.c.id.desc()).limit(1)).first()
        day = conn.execute(select(d).where(d.c.node == node)
                           .order_by(d.c.day.desc()).limit(1)).first()

    def metrics(row) -> dict:
        out = {}
        for m in ROLLED_UP:
            if not _reported(row._mapping, m.value):
                continue
            stats = _filled({stat: row._mapping.get(f"{m.value}_{stat}")
                             for stat, _kind in schema.ROLLUP_STATS},
                            row._mapping.get("sweeps"))
            n = stats["n"]
            past = stats.get("past")
            stats["past_frac"] = past / n if n and past is not None else None
            stats["limit"] = warn_limit(cfg, m) if cfg is not None else None
            out[m.value] = stats
        return out

    return {
        "job": None if job is None else {
            "job_id": job.job_id, "start": job.start, "end": job.end, "metrics": metrics(job)},
        "day": None if day is None else {"day": day.day, "metrics": metrics(day)},
    }


def _jobs_to_roll(conn, until: datetime, oldest: datetime) -> list[tuple[int, datetime, datetime]]:
    j, r = schema.jobs, schema.telemetry_job_rollups
    q = select(j.c.id, j.c.start, j.c.end).where(
        j.c.nnodes >= 2, j.c.start.is_not(None), j.c.end.is_not(None), j.c.end < until,
        j.c.end >= oldest, ~exists().where(r.c.job_pk == j.c.id))
    return [(int(pk), start, end) for pk, start, end in conn.execute(q)]


def rollup(engine: Engine, now: datetime, cfg) -> RollupReport:
    """Roll up what is due (see the module's docstring); idempotent."""
    now = _naive(now)
    report = RollupReport()
    s = schema.telemetry_samples
    retention = int(cfg.get("historian.telemetry_retention_days"))
    oldest = now - timedelta(days=retention) if retention > 0 else datetime(1970, 1, 1)
    with engine.connect() as conn:
        # A job that ended before the first sample kept has none: it is not asked about on
        # every run (the jobs from before telemetry was deployed, or already pruned).
        first, newest = (_as_datetime(t) for t in conn.execute(
            select(func.min(s.c.time), func.max(s.c.time))).one())
        jobs = [] if first is None else _jobs_to_roll(conn, now - SETTLE, max(oldest, first))
    if newest is None:
        return report
    for pk, start, end in jobs:
        n, _grew = _roll_job(engine, pk, start, end, cfg)
        report.jobs += 1 if n else 0
        report.job_rows += n
    days = _days_due(engine, now, newest)
    for day in days:
        n, _grew = _roll_day(engine, day, cfg, first_pass=True)
        report.days += 1
        report.day_rows += n
    # Nor the second pass past the newest sample: a clock run ahead would move its cursors
    # past the jobs and days to come.
    _late_pass(engine, min(now, newest + SETTLE + LATE), oldest, cfg, report,
               {pk for pk, _, _ in jobs}, set(days))
    return report


def _as_datetime(value) -> datetime | None:
    """A time column's value (SQLite's text, in an aggregate) as a datetime."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def _roll_job(engine: Engine, pk: int, start: datetime, end: datetime, cfg, *,
              first_pass: bool = True) -> tuple[int, bool]:
    s, jn = schema.telemetry_samples, schema.job_nodes
    where = and_(s.c.time >= start, s.c.time <= end,
                 s.c.node.in_(select(jn.c.node).where(jn.c.job_pk == pk)))
    with writer(engine).begin() as conn:
        _take_turns(conn)
        return _replace_rollup(conn, schema.telemetry_job_rollups, "job_pk", pk, where, cfg,
                               only_if_more=not first_pass)


def _roll_day(engine: Engine, day: date, cfg, *, first_pass: bool) -> tuple[int, bool]:
    s, jn, j = schema.telemetry_samples, schema.job_nodes, schema.jobs
    lo = datetime(day.year, day.month, day.day)
    hi = lo + timedelta(days=1)
    in_job = exists().where(
        jn.c.node == s.c.node, jn.c.job_pk == j.c.id, j.c.nnodes >= 2,
        j.c.start.is_not(None), j.c.start <= s.c.time,
        (j.c.end.is_(None)) | (j.c.end >= s.c.time))
    where = and_(s.c.time >= lo, s.c.time < hi, ~in_job)
    with writer(engine).begin() as conn:
        _take_turns(conn)
        result = _replace_rollup(conn, schema.telemetry_day_rollups, "day", day, where, cfg,
                                 only_if_more=not first_pass)
        if first_pass:
            _save_cursor(conn, day + timedelta(days=1))
    return result


def _late_pass(engine: Engine, now: datetime, oldest: datetime, cfg, report: RollupReport,
               rolled_jobs: set[int], rolled_days: set[date]) -> None:
    """Roll each job and day up a second time, LATE after the first: the samples a node
    delivered late (cut off from the historian for hours, then flushing its spool) land in
    them. Only a job or day whose samples retention still keeps whole (re-rolling one half
    pruned would lose what the first pass saw); counted in the report when it grew."""
    due = now - SETTLE - LATE
    c, j = schema.ingest_cursors, schema.jobs
    with engine.connect() as conn:
        saved = dict(conn.execute(select(c.c.name, c.c.value).where(
            c.c.name.in_((CURSOR, LATE_JOBS, LATE_DAYS)))).all())
        # None yet (a new historian, or one from before this pass): nothing behind `due`
        # is rolled up again, only what ends from now on.
        jobs_from = datetime.fromisoformat(saved[LATE_JOBS]) if LATE_JOBS in saved else due
        jobs = [] if jobs_from >= due else [
            (int(pk), start, end) for pk, start, end in conn.execute(
                select(j.c.id, j.c.start, j.c.end).where(
                    j.c.nnodes >= 2, j.c.start.is_not(None), j.c.end >= jobs_from,
                    j.c.end < due, j.c.start >= oldest).order_by(j.c.end, j.c.id))]
    for pk, start, end in jobs:
        if pk not in rolled_jobs and _roll_job(engine, pk, start, end, cfg,
                                               first_pass=False)[1]:
            report.late_jobs += 1
    days_from = date.fromisoformat(saved[LATE_DAYS]) if LATE_DAYS in saved else due.date()
    # Days the first pass has rolled up (before its cursor) whose end is LATE behind it.
    first_cursor = date.fromisoformat(saved[CURSOR]) if CURSOR in saved else days_from
    days_to = min(due.date(), first_cursor)
    for i in range((days_to - days_from).days):
        day = days_from + timedelta(days=i)
        if day not in rolled_days and datetime(day.year, day.month, day.day) >= oldest \
                and _roll_day(engine, day, cfg, first_pass=False)[1]:
            report.late_days += 1
    with writer(engine).begin() as conn:
        _take_turns(conn)
        _save(conn, LATE_JOBS, max(jobs_from, due).isoformat(sep=" "))
        _save(conn, LATE_DAYS, max(days_from, days_to).isoformat())


def _take_turns(conn) -> None:
    """Two rollups at once (two ingest timers overlapping, one run by hand) take turns, one
    transaction at a time: under READ COMMITTED on PostgreSQL both deleted the job's (or
    day's, or the cursor's) rows before either inserted, and the second's insert failed on
    the key the first had just written (a duplicate-key error, the run lost). Waiting here,
    before the read, the second reads and replaces what the first committed. SQLite's
    writers take turns already (BEGIN IMMEDIATE)."""
    take_turns(conn, TURNS_TELEMETRY_ROLLUP, [CURSOR])


def _replace_rollup(conn, table, key: str, value, where, cfg, *,
                    only_if_more: bool = False) -> tuple[int, bool]:
    """One job's or one day's rollup rows made anew from the samples `where` selects (a
    rerun replaces, never doubles them): how many rows it wrote, and whether they hold more
    samples than the rows they replaced (samples that came after those were made).
    `only_if_more` (the second pass): only when the samples are more than the rows hold (a
    count first: almost always nothing came late, and reading every sample again and
    rewriting every row, a dead row version each on PostgreSQL, doubled the rollup's cost)."""
    before = conn.execute(select(func.coalesce(func.sum(table.c.sweeps), 0))
                          .where(table.c[key] == value)).scalar()
    if only_if_more:
        # A row's sweeps count the node's samples (those with a metric the rollups hold): no
        # more samples than that, none came late. A sample with none of them counts here
        # only, and costs its job or day a needless (harmless) second rollup.
        have = conn.execute(select(func.count()).select_from(schema.telemetry_samples)
                            .where(where)).scalar()
        if int(have or 0) <= int(before or 0):
            return 0, False
    agg = _aggregate(conn, where, cfg)
    conn.execute(delete(table).where(table.c[key] == value))
    rows = _wide(agg, {key: value})
    if rows:
        _insert(conn, table, rows)
    return len(rows), sum(row["sweeps"] for row in rows) > int(before or 0)


def _days_due(engine: Engine, now: datetime, newest: datetime) -> list[date]:
    """Whole days from the cursor (or the oldest sample) whose end is SETTLE behind now, up to
    the day of the newest sample: a day no sample has reached is not over for the rollup. A
    clock run ahead (a bad NTP answer, an RTC reset) rolled up a year of days that had not
    happened, empty, and moved the cursor past them: once it was right again no day was
    rolled up until the real date caught up, and retention took the samples meanwhile."""
    c, s = schema.ingest_cursors, schema.telemetry_samples
    with engine.connect() as conn:
        saved = conn.execute(select(c.c.value).where(c.c.name == CURSOR)).scalar()
        if saved:
            first = date.fromisoformat(saved)
        else:
            oldest = conn.execute(select(func.min(s.c.time))).scalar()
            if oldest is None:
                return []
            first = (oldest if isinstance(oldest, datetime)
                     else datetime.fromisoformat(str(oldest))).date()
    # the last day whose end has settled
    last = min((now - SETTLE).date() - timedelta(days=1), newest.date())
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def _insert(conn, table, rows: list[dict]) -> None:
    """Rows with every column named (a metric a node lacks: NULL), as one executemany."""
    names = [c.name for c in table.columns]
    conn.execute(table.insert(), [{n: row.get(n) for n in names} for row in rows])


def _save_cursor(conn, day: date) -> None:
    _save(conn, CURSOR, day.isoformat())


def _save(conn, name: str, value: str) -> None:
    c = schema.ingest_cursors
    conn.execute(delete(c).where(c.c.name == name))
    conn.execute(c.insert().values(name=name, value=value))
