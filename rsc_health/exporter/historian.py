"""Fleet reliability from the historian as Prometheus metrics, for node_exporter's textfile
collector on the management host (or any scrape of the written file).

Built with prometheus-client on a private registry, so the exposition format is the library's,
not ours. Names carry their unit; gauges only (every value is a state of the fleet as of the
export, recomputed each time). The node path writes its own per-node file
(rsc_health.nodepath, `rsc_health_verdict_level` and friends); these are fleet-wide.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from sqlalchemy import Engine, func, select

from rsc_health.historian import schema
from rsc_health.historian.outages import OutageRules
from rsc_health.model import DRAIN_KINDS, ActionKind, Status


def build(engine: Engine, cfg, now: datetime, *, window_days: float = 30.0) -> CollectorRegistry:
    """Compute every metric as of `now` (naive UTC) into a new registry."""
    from rsc_health.historian.freshness import node_freshness, stale_after_s
    from rsc_health.historian.metrics._sql import Window
    from rsc_health.historian.metrics.mttf import mttf_by_size
    from rsc_health.historian.metrics.rates import failure_rate

    reg = CollectorRegistry()
    _up(reg, 1)
    window = Window(since=now - timedelta(days=window_days), until=now)
    large = int(cfg.get("metrics.large_job_gpus"))
    confidence = float(cfg.get("metrics.confidence"))

    fr = failure_rate(engine, window, large, confidence)
    rf = Gauge("rsc_health_failure_rate_per_1000_node_days",
               f"Cluster failure rate r_f of jobs over {large} GPUs in the last {window_days:g} "
               f"days; bound=estimate|lower|upper ({confidence:.0%} interval)",
               ["bound"], registry=reg)
    for bound, value in (("estimate", fr.r_f), ("lower", fr.ci_low), ("upper", fr.ci_high)):
        if not math.isnan(value):
            rf.labels(bound).set(value * 1000)
    Gauge("rsc_health_failure_rate_jobs", "Large jobs behind r_f in the window",
          registry=reg).set(fr.jobs)

    mttf = Gauge("rsc_health_mttf_hours",
                 "Measured mean time to failure by job size (GPUs), last window",
                 ["size"], registry=reg)
    frame = mttf_by_size(engine, window, fr.r_f if fr.node_days else None,
                         confidence=confidence)
    for _, row in frame.iterrows():
        if row["mttf_hours"] == row["mttf_hours"]:  # not NaN: the bucket had failures
            mttf.labels(str(row["size"])).set(float(row["mttf_hours"]))

    fresh = node_freshness(engine, now, stale_after_s(cfg))
    stale = Gauge("rsc_health_node_stale",
                  "1 for a node whose node-path runs stopped arriving", ["node"], registry=reg)
    broken = Gauge("rsc_health_node_checker_broken",
                   "1 for a node whose latest run could not look (checker errors) or whose "
                   "clock is wrong (its records are quarantined)",
                   ["node"], registry=reg)
    for f in fresh:
        if f.stale:
            stale.labels(f.node).set(1)
        if f.broken:
            broken.labels(f.node).set(1)
    Gauge("rsc_health_nodes_stale", "Nodes whose checks stopped", registry=reg).set(
        sum(f.stale for f in fresh))
    Gauge("rsc_health_nodes_reporting", "Nodes the historian has heard from",
          registry=reg).set(len(fresh))

    c, a, j = schema.check_results, schema.node_actions, schema.jobs
    with engine.connect() as conn:
        open_bad = conn.execute(
            select(c.c.severity, func.count())
            .where(schema.open_interval(), c.c.status != Status.OK)
            .group_by(c.c.severity)).all()
        trips = conn.execute(select(func.count()).where(
            a.c.action == ActionKind.GUARD_TRIPPED, a.c.time >= now - timedelta(hours=24))).scalar()
        drains = conn.execute(select(func.count()).where(
            a.c.action.in_(sorted(DRAIN_KINDS)),
            a.c.time >= now - timedelta(hours=24))).scalar()
        # The newest up to now: one End or run stamped ahead by a wrong clock (slurmctld's,
        # a node's) would otherwise make the feed look fresh (age 0) for as long as it stays.
        last_job = conn.execute(select(func.max(j.c.end)).where(j.c.end <= now)).scalar()
        r = schema.node_runs
        last_run = conn.execute(select(func.max(r.c.last_seen))
                                .where(r.c.last_seen <= now)).scalar()
    findings = Gauge("rsc_health_open_findings", "Open non-ok check states by severity",
                     ["severity"], registry=reg)
    for sev, n in open_bad:
        findings.labels(sev).set(n)
    Gauge("rsc_health_guard_trips_24h", "Drains the mass-drain guard held back, last 24 h",
          registry=reg).set(trips or 0)
    Gauge("rsc_health_drains_24h", "Drains by rsc-health (node path, lemons, manual), last 24 h",
          registry=reg).set(drains or 0)
    age = Gauge("rsc_health_data_age_seconds",
                "Age of the newest data: source=sacct (job ends), spool (node runs)",
                ["source"], registry=reg)
    for source, newest in (("sacct", last_job), ("spool", last_run)):
        if newest is not None:
            age.labels(source).set(max(0.0, (now - newest).total_seconds()))
    # The site's application XIDs, read once per export. An [xid] catalog_override this host
    # cannot use is a metric (the RscHealthXidCatalogUnusable alert), not a warning in the
    # journal every 5 minutes: `healthctl lemons` and the report still say it in words.
    rules = OutageRules.from_config(cfg.section("lemon"),
                                    xid_catalog_override=cfg.get("xid.catalog_override"))
    Gauge("rsc_health_xid_catalog_override_unusable",
          "1 when the site's [xid] catalog_override cannot be used on the historian host "
          "(missing, unreadable, not root's, invalid): the XIDs it marks as the "
          "application's own count against the nodes; `healthctl lemons` says why",
          registry=reg).set(1 if rules.xid_catalog_problem else 0)
    _lemons(engine, cfg, now, reg, rules)
    _reliability(engine, cfg, now, window_days, reg, rules)
    _qualify(engine, now, reg)
    _suspects(engine, now, reg)
    _telemetry(engine, cfg, now, reg)
    return reg


# The fleet's spread of each telemetry metric: stat label -> quantile of the nodes' values.
SPREAD = (("min", 0.0), ("p01", 0.01), ("p50", 0.5), ("p99", 0.99), ("max", 1.0))


def _telemetry(engine: Engine, cfg, now: datetime, reg: CollectorRegistry) -> None:
    """Fleet telemetry from each node's newest sample of the last two sweep slots ([failslow]
    slot_s): per metric, how many nodes reported it, how many are past its warn line
    ([telemetry] warn_above / warn_below) and the fleet's spread. Labelled by metric and
    stat only, so 16,000 nodes export as many series as 16; per-node series are the
    suspects' alone (_suspects)."""
    import numpy as np
    import pandas as pd

    from rsc_health.historian.telemetry import warn_limit
    from rsc_health.model import LOWER_IS_WORSE, Metric

    s = schema.telemetry_samples
    since = now - timedelta(seconds=2 * float(cfg.get("failslow.slot_s")))
    names = ["node", "time", *(m.value for m in Metric)]
    with engine.connect() as conn:
        rows = conn.execute(select(s.c.node, s.c.time, *(s.c[m.value] for m in Metric))
                            .where(s.c.time >= since, s.c.time <= now)).all()
    frame = pd.DataFrame(rows, columns=names).sort_values("time", kind="stable")
    reporting = Gauge("rsc_health_telemetry_nodes",
                      "Nodes with a telemetry sample of the metric in the last two sweep slots",
                      ["metric"], registry=reg)
    past = Gauge("rsc_health_telemetry_nodes_past_warn",
                 "Nodes whose newest sample of the metric is past its [telemetry] warn line "
                 "(under it for sm_clock_ratio, pcie_link_ratio, ib_link_ratio; over it for "
                 "the rest)", ["metric"], registry=reg)
    spread = Gauge("rsc_health_telemetry_fleet",
                   "The fleet's spread of each node's newest sample of the metric: stat=min, "
                   "p01, p50, p99, max", ["metric", "stat"], registry=reg)
    for m in Metric:
        col = frame[["node", m.value]].dropna()
        values = col.groupby("node", sort=False)[m.value].last().astype(float)
        values = values[np.isfinite(values)]
        reporting.labels(m.value).set(len(values))
        limit = warn_limit(cfg, m)
        if limit is None:
            past.labels(m.value).set(0)
        else:
            over = values < limit if m in LOWER_IS_WORSE else values > limit
            past.labels(m.value).set(int(over.sum()))
        if len(values):
            for stat, q in SPREAD:
                spread.labels(m.value, stat).set(float(values.quantile(q)))


def _suspects(engine: Engine, now: datetime, reg: CollectorRegistry) -> None:
    """Open suspect episodes (rsc_health/suspects.py): how many, by the metric and source of
    their evidence, and a flag per node (the only per-node telemetry series) with the metric
    that made it one and whether the tier holds it in Slurm; and how episodes ended in the
    last 24 h."""
    from rsc_health.historian.suspects import active, recent
    from rsc_health.model import SuspectState

    open_eps = active(engine)
    Gauge("rsc_health_suspect_nodes", "Nodes suspect now (slow against their jobs' peers; "
          "kept from big jobs, never drained by it)", registry=reg).set(len(open_eps))
    per = Gauge("rsc_health_node_suspect", "1 for a suspect node; tier: applied (kept from big "
                "jobs in Slurm), shadow, held (guard), person (a person's state), '' (not yet)",
                ["node", "metric", "tier"], registry=reg)
    for e in open_eps:
        per.labels(e.node, e.metric, e.tier).set(1)
    by = Gauge("rsc_health_suspect_nodes_by_metric", "Suspect nodes now by the metric and "
               "source (telemetry, steps) of their evidence", ["metric", "source"],
               registry=reg)
    counted: dict[tuple[str, str], int] = {}
    for e in open_eps:
        key = (str(e.metric)[:64], str(e.source)[:16])
        counted[key] = counted.get(key, 0) + 1
    for (metric, source), n in counted.items():
        by.labels(metric, source).set(n)
    ended = Gauge("rsc_health_suspect_episodes_ended_24h", "Suspect episodes that ended in the "
                  "last 24 h: state=confirmed (qualification failed: drained), cleared (a pass "
                  "or a person), expired (no evidence renewed it)", ["state"], registry=reg)
    done = [e for e in recent(engine, now - timedelta(hours=24))
            if e.state is not SuspectState.SUSPECT and e.changed is not None
            and e.changed <= now]
    for state in (SuspectState.CONFIRMED, SuspectState.CLEARED, SuspectState.EXPIRED):
        ended.labels(state.value).set(sum(e.state is state for e in done))


def _qualify(engine: Engine, now: datetime, reg: CollectorRegistry) -> None:
    """Qualification runs of the last day by verdict, and each node's latest verdict."""
    from sqlalchemy import func, select

    from rsc_health.historian.schema import qualify_runs as r
    from rsc_health.qualify.judge import FAIL, INCONCLUSIVE, PASS

    with engine.connect() as conn:
        counts = dict(conn.execute(select(r.c.verdict, func.count()).where(
            r.c.ended > now - timedelta(hours=24), r.c.ended <= now).group_by(r.c.verdict)).all())
        newest = select(r.c.node, r.c.verdict, func.row_number().over(
            partition_by=r.c.node, order_by=r.c.ended.desc()).label("n")).where(
            r.c.ended <= now).subquery()
        latest = conn.execute(select(newest.c.node, newest.c.verdict)
                              .where(newest.c.n == 1)).all()
    runs = Gauge("rsc_health_qualify_runs_24h", "Qualification runs in the last 24 h by verdict",
                 ["verdict"], registry=reg)
    for verdict in (PASS, FAIL, INCONCLUSIVE):
        runs.labels(verdict).set(counts.get(verdict, 0))
    last = Gauge("rsc_health_node_qualify_passed",
                 "1 when a node's latest qualification run passed, 0 when it did not",
                 ["node"], registry=reg)
    for node, verdict in latest:
        last.labels(node).set(1 if verdict == PASS else 0)


def _lemons(engine: Engine, cfg, now: datetime, reg: CollectorRegistry,
            rules: OutageRules) -> None:
    from rsc_health.historian.lemons.features import lemon_features
    from rsc_health.historian.lemons.verdicts import DEFAULTS, LemonRules, lemon_verdicts

    section = {**DEFAULTS, **cfg.section("lemon")}
    window = float(section["window_days"])
    features = lemon_features(engine, now, window,
                              early_fail_minutes=float(section["early_fail_minutes"]),
                              history_days=float(section["history_days"]),
                              outages=rules,
                              host_jobs=False)  # verdicts only; _reliability triages once
    verdicts = lemon_verdicts(engine, features, now, LemonRules.from_config(section),
                              window_days=window, with_evidence=False,
                              history_days=float(section["history_days"]))
    Gauge("rsc_health_lemon_candidates", "Lemon-node candidates as of the export",
          registry=reg).set(len(verdicts))
    per = Gauge("rsc_health_lemon_candidate", "1 for a lemon-node candidate", ["node"],
                registry=reg)
    for v in verdicts:
        per.labels(v.node).set(1)


def _reliability(engine: Engine, cfg, now: datetime, window_days: float,
                 reg: CollectorRegistry, rules: OutageRules) -> None:
    """Event-based reliability over the export window per peer group (the report's section),
    what its filters left out, and the failed jobs of the lemon window by triage label."""
    from rsc_health.historian.lemons.verdicts import DEFAULTS
    from rsc_health.historian.metrics.reliability import WHOLE, reliability
    from rsc_health.historian.triage import summary, triage

    section = {**DEFAULTS, **cfg.section("lemon")}
    frame = reliability(engine, now - timedelta(days=window_days), now, period=WHOLE,
                        rules=rules)
    span = f"in the last {window_days:g} days"
    fails = Gauge("rsc_health_node_failures", f"Node failures (own outages and XIDs not of "
                  f"the application class) {span}, by peer group", ["group"], registry=reg)
    episodes = Gauge("rsc_health_node_failure_episodes", f"The same chained into episodes "
                     f"{span}, by peer group", ["group"], registry=reg)
    mtbf = Gauge("rsc_health_system_mtbf_hours", f"Mean hours between a peer group's "
                 f"consecutive failures {span}", ["group"], registry=reg)
    repair = Gauge("rsc_health_repair_hours", f"Hours from an outage's start to its end {span}, "
                   "by peer group and quantile", ["group", "quantile"], registry=reg)
    for row in frame.itertuples():
        fails.labels(row.group).set(row.failures)
        episodes.labels(row.group).set(row.episodes)
        if row.system_mtbf_h is not None and row.system_mtbf_h == row.system_mtbf_h:
            mtbf.labels(row.group).set(row.system_mtbf_h)
        for q, value in (("0.5", row.repair_p50_h), ("0.9", row.repair_p90_h)):
            if value is not None and value == value:
                repair.labels(row.group, q).set(value)
    left = Gauge("rsc_health_node_outages_left_out", f"Outages {span} the reliability figures "
                 "leave out: kind=maintenance|fleet, cause=the pattern or reservation",
                 ["kind", "cause"], registry=reg)
    for kind in ("maintenance", "fleet"):
        for cause, n in frame.attrs["left_out"].get(kind, {}).items():
            left.labels(kind, cause).set(n)
    jobs = triage(engine, now - timedelta(days=float(section["window_days"])), now,
                  rules=rules)
    per = Gauge("rsc_health_failed_jobs", "Failed jobs in the lemon window by triage label "
                "(host: the nodes failed; user: the job's own error; unknown)", ["label"],
                registry=reg)
    for label, n in summary(jobs).items():
        per.labels(label).set(n)


def _up(reg: CollectorRegistry, value: int) -> None:
    Gauge("rsc_health_historian_up",
          "1 when this export could read the historian, 0 when it could not (the fleet "
          "metrics are then absent, not the last good values)", registry=reg).set(value)


def unreachable() -> CollectorRegistry:
    """What an export says when the historian could not be read: up 0 and nothing else, so
    a dashboard shows "no data" rather than the last good numbers as if they were current."""
    reg = CollectorRegistry()
    _up(reg, 0)
    return reg


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
