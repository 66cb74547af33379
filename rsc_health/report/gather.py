"""`gather(engine, as_of)`: run the historian's metrics and lemon verdicts and adapt their
frames to the report's section contract (`ReportData`).

Each section is gathered on its own: one that fails (a metric not ready, a query error) becomes
an empty section with a note saying why, so the nightly page is always written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, select

from rsc_health.config import packaged_default, with_defaults
from rsc_health.historian.db import refresh_statistics
from rsc_health.historian.schema import node_actions
from rsc_health.model import DRAIN_KINDS, ActionKind
from rsc_health.report.data import COLUMNS, ReportData, SectionEmpty, empty_frame
from rsc_health.report.fleet import fold_repeats

log = logging.getLogger(__name__)

# node_actions.action values the report reads: the words the producers write
# (rsc_health.model.ActionKind), plus "drain", which lemon drains wrote before ActionKind.
GUARD_ACTIONS = (ActionKind.GUARD_TRIPPED.value,)
DRAIN_ACTIONS = tuple(sorted(k.value for k in DRAIN_KINDS)) + ("drain",)


@dataclass(frozen=True)
class GatherOptions:
    """The `[report]` and `[lemon]` settings gather needs; each default is the packaged one."""

    # lemon features (Fig. 11) and verdicts
    window_days: float = packaged_default("lemon.window_days")
    # Figs 3-9: about the paper's 11 months
    metrics_days: float = packaged_default("report.metrics_days")
    rolling_days: int = packaged_default("report.rolling_days")  # Fig. 5's rolling average
    actions_hours: float = packaged_default("report.actions_hours")  # drains/resumes shown
    lemon: Mapping[str, Any] | None = None  # the [lemon] section
    ettr: Mapping[str, Any] | None = None  # the [ettr] section: job-run linking, overheads
    # [metrics] large_job_gpus: jobs that define r_f
    large_job_gpus: int = packaged_default("metrics.large_job_gpus")
    skip: frozenset[str] = frozenset()  # sections not gathered (an expensive one, say)
    # [metrics] confidence: the headline r_f's interval
    confidence: float = packaged_default("metrics.confidence")
    # [historian] stale_after_s: a node's checks stopped
    stale_after_s: float = packaged_default("historian.stale_after_s")
    # newest job end older than this: the sacct input is stale
    sacct_stale_hours: float = packaged_default("report.sacct_stale_hours")
    xid_top: int = packaged_default("report.xid_top")  # rows of the XIDs-per-GPU table
    # how far back "days listed" looks (one lemon evaluation a day)
    listed_days_max: int = packaged_default("report.listed_days_max")
    previous: Mapping[str, Any] | None = None  # last night's report.json: days listed carry on
    fleet_rows: int = packaged_default("report.fleet_rows")  # open findings, events per node
    # [xid] catalog_override: the site's application XIDs, left out as `healthctl lemons` does
    xid_catalog_override: str = packaged_default("xid.catalog_override")
    # [actions] guard_max_share and guard_window_min: shadow mode's would-drains are shown
    # with what the live mass-drain guard would have held
    guard_max_share: float = packaged_default("actions.guard_max_share")
    guard_window_min: float = packaged_default("actions.guard_window_min")

    @classmethod
    def from_config(
        cls,
        report: Mapping[str, Any],
        lemon: Mapping[str, Any],
        ettr: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        historian: Mapping[str, Any] | None = None,
        xid: Mapping[str, Any] | None = None,
        actions: Mapping[str, Any] | None = None,
    ) -> GatherOptions:
        report = with_defaults("report", report)
        metrics = with_defaults("metrics", metrics)
        actions = with_defaults("actions", actions)
        return cls(
            window_days=float(with_defaults("lemon", lemon)["window_days"]),
            metrics_days=float(report["metrics_days"]),
            rolling_days=int(report["rolling_days"]),
            actions_hours=float(report["actions_hours"]),
            lemon=dict(lemon),
            ettr=dict(ettr or {}),
            large_job_gpus=int(metrics["large_job_gpus"]),
            skip=_sections(report["skip"]),
            confidence=float(metrics["confidence"]),
            stale_after_s=float(with_defaults("historian", historian)["stale_after_s"]),
            sacct_stale_hours=float(report["sacct_stale_hours"]),
            xid_top=int(report["xid_top"]),
            listed_days_max=int(report["listed_days_max"]),
            fleet_rows=int(report["fleet_rows"]),
            xid_catalog_override=str(with_defaults("xid", xid)["catalog_override"]),
            guard_max_share=float(actions["guard_max_share"]),
            guard_window_min=float(actions["guard_window_min"]),
        )


def _lemon_settings(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """The [lemon] section over the packaged defaults: the report judges candidates exactly as
    `healthctl lemons` does (history, outage rules and all)."""
    from rsc_health.historian.lemons.verdicts import DEFAULTS

    return {**DEFAULTS, **(section or {})}


def _outage_rules(opts: GatherOptions):
    """OutageRules as `healthctl lemons` builds them: the [lemon] keys and the site's XID
    catalog (xid_catalog_problem says why it was not used)."""
    from rsc_health.historian.outages import OutageRules

    return OutageRules.from_config(_lemon_settings(opts.lemon),
                                   xid_catalog_override=opts.xid_catalog_override)


def _sections(names: Any) -> frozenset[str]:
    known = set(COLUMNS) | {"metrics", "pull"}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"[report] skip: unknown section(s) {unknown}; known: {sorted(known)}")
    return frozenset(names)


# --- adapters: one per section, from the producer's frame to the report's columns -------------


def outcomes_section(frame: pd.DataFrame) -> pd.DataFrame:
    # "FAILED (HW)" is the paper's infra-failure marking in Fig. 3; keep it as the label.
    label = frame["outcome"] if "outcome" in frame else frame["state"]
    return pd.DataFrame(
        {"state": label, "jobs": frame["jobs"], "gpu_hours": frame["gpu_hours"]}
    ).reset_index(drop=True)


def causes_section(frame: pd.DataFrame) -> pd.DataFrame:
    rate = frame["per_gpu_hour"] if "per_gpu_hour" in frame else frame["rate_per_gpu_hour"]
    return pd.DataFrame(
        {"cause": frame["cause"], "failures": frame["failures"], "rate_per_gpu_hour": rate}
    ).reset_index(drop=True)


def rolling_section(frame: pd.DataFrame, days: int = 30) -> pd.DataFrame:
    """The metrics' wide frame (date, node_days, total, one column per mode) to long rows.

    The first `days - 1` days average over less than a full window (a single bad day reads as
    a huge rate), so they are dropped when the series is long enough to have full windows."""
    modes = [c for c in frame.columns if c not in ("date", "node_days", "total")]
    if frame.empty or not modes:
        return empty_frame("rolling")
    if len(frame) > 2 * days:
        frame = frame.iloc[days - 1:]
    long = frame.melt(id_vars=["date"], value_vars=modes, var_name="mode",
                      value_name="rate_per_1000_node_days")
    return long.rename(columns={"date": "time"})[["time", "mode", "rate_per_1000_node_days"]]


def deployments_section(engine, window) -> pd.DataFrame:
    from rsc_health.historian.metrics.deployments import check_deployments

    return check_deployments(engine, window)


def mttf_section(frame: pd.DataFrame) -> pd.DataFrame:
    columns = ["gpus", "mttf_hours", "ci_low_hours", "ci_high_hours", "projected_hours"]
    out = frame[columns + [c for c in ("jobs", "failures") if c in frame]].copy()
    # No failures in a bucket: the upper bound is infinite; the figure leaves it open.
    return out.replace([np.inf, -np.inf], np.nan).reset_index(drop=True)


def goodput_section(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        return empty_frame("goodput")
    wide = frame.pivot_table(index="gpus", columns="kind", values="gpu_hours_lost",
                             aggfunc="sum", fill_value=0.0)
    return pd.DataFrame(
        {
            "gpus": wide.index.astype(int),
            "failure_gpu_hours": wide.get("failure", pd.Series(0.0, index=wide.index)).values,
            "preemption_gpu_hours": wide.get("preemption", pd.Series(0.0, index=wide.index)).values,
        }
    )


def ettr_section(runs: pd.DataFrame, confidence: float = 0.9) -> pd.DataFrame:
    """Fig. 9: job runs grouped by size; mean measured ETTR with a t-interval, mean E[ETTR]."""
    if runs.empty:
        return empty_frame("ettr")
    from scipy import stats

    from rsc_health.historian.metrics._sql import bucket_of

    runs = runs.assign(size=[bucket_of(int((g + 7) // 8 * 8)) for g in runs["gpus"]])
    rows = []
    for size, group in runs.groupby("size"):
        measured = pd.to_numeric(group["measured_ettr"], errors="coerce").dropna()
        if measured.empty:
            continue
        mean, n = float(measured.mean()), len(measured)
        half = (
            float(stats.t.ppf(0.5 + confidence / 2, n - 1) * measured.std(ddof=1) / np.sqrt(n))
            if n > 1 else np.nan
        )
        rows.append({
            "run": f"{n} run(s)", "gpus": int(size), "measured": mean, "ci_low": mean - half,
            "ci_high": mean + half,
            "expected": float(pd.to_numeric(group["expected_ettr"], errors="coerce").mean()),
            "runs": n,
        })
    return pd.DataFrame(rows) if rows else empty_frame("ettr")


def features_section(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.reset_index() if "node" not in frame.columns else frame.copy()
    return out


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _failed_jobs_line(rows: list[dict], limit: int) -> str | None:
    """The failed jobs, one entry each with its causes together (a job can have several
    attributions); None without any."""
    failed: dict[str, tuple[str, list[str]]] = {}
    for r in rows:
        state, causes = failed.setdefault(str(r["job_id"]), (str(r["state"]), []))
        if r.get("cause") and r["cause"] not in causes:
            causes.append(str(r["cause"]))
    if not failed:
        return None
    jobs = ", ".join(
        f"{job} {state}" + (f" ({', '.join(causes)})" if causes else "")
        for job, (state, causes) in list(failed.items())[:limit]
    )
    more = f" (+{len(failed) - limit} more)" if len(failed) > limit else ""
    return f"failed jobs: {jobs}{more}"


def lemon_evidence_lines(verdict: Any, limit: int = 5) -> list[str]:
    """Short lines an operator reads: each crossing, then the rows behind the strongest ones."""
    lines = []
    if getattr(verdict, "repeat_offender", False):
        since = verdict.resumed_at.strftime("%Y-%m-%d") if verdict.resumed_at else "repair"
        lines.append(f"repeat offender: failed again after resume on {since}")
    for c in verdict.crossings:
        lines.append(f"{c.feature}={_fmt(c.value)} >= {_fmt(c.threshold)}")
    ev = verdict.evidence or {}
    failed = _failed_jobs_line(ev.get("failed_jobs") or [], limit)
    if failed:
        lines.append(failed)
    xids = ev.get("xid_events") or []
    if xids:
        codes = sorted({str(r.get("code") or "?") for r in xids})
        lines.append(f"XID events: {len(xids)} ({', '.join(codes)})")
    outs = ev.get("out_of_service") or []
    if outs:
        lines.append(
            "out of service: " + "; ".join(f"{r['start']} {r['state']}" for r in outs[:limit])
        )
    tix = ev.get("tickets") or []
    if tix:
        lines.append("tickets: " + "; ".join(f"{r['opened']} {r['reason']}" for r in tix[:limit]))
    return lines


def lemons_section(verdicts: list[Any]) -> pd.DataFrame:
    rows = [
        {
            "node": v.node,
            "rules": (["repeat_offender"] if v.repeat_offender else [])
            + [f"{c.feature}>={_fmt(c.threshold)}" for c in v.crossings],
            "evidence": lemon_evidence_lines(v),
            "summary": v.summary(),
        }
        for v in verdicts
    ]
    columns = ["node", "rules", "evidence", "summary"]
    return pd.DataFrame(rows, columns=columns) if rows else empty_frame("lemons")


def reliability_section(engine: Engine, as_of: datetime, opts: GatherOptions) -> pd.DataFrame:
    """Event-based reliability per month and group over the metrics window; attrs keep what
    the maintenance and fleet-event filters left out."""
    from rsc_health.historian.metrics.reliability import reliability

    rules = _outage_rules(opts)
    frame = reliability(engine, as_of - timedelta(days=opts.metrics_days), as_of,
                        period="month", rules=rules)
    if frame.empty:
        raise SectionEmpty(f"no node failure (node events, XIDs) in the last "
                           f"{opts.metrics_days:g} days")
    return frame


TRIAGE_NODES = 10  # nodes named per label


def triage_section(engine: Engine, as_of: datetime, opts: GatherOptions) -> pd.DataFrame:
    """Failed jobs of the lemon window per triage label, with the nodes the host ones blame."""
    from rsc_health.historian.triage import LABELS, host_failed_jobs, triage

    jobs = triage(engine, as_of - timedelta(days=opts.window_days), as_of,
                  rules=_outage_rules(opts))
    if jobs.empty:
        raise SectionEmpty(f"no failed job ended in the last {opts.window_days:g} days")
    blamed = host_failed_jobs(jobs).sort_values(ascending=False, kind="stable")
    counts = jobs["label"].value_counts()
    rows = [{"label": label, "jobs": int(counts.get(label, 0)),
             "nodes": [f"{n} ({int(k)})" for n, k in blamed.head(TRIAGE_NODES).items()]
             if label == LABELS[0] else []} for label in LABELS]
    frame = pd.DataFrame(rows, columns=["label", "jobs", "nodes"])
    frame.attrs["blamed_nodes"] = len(blamed)
    frame.attrs["host_failed_jobs"] = blamed  # the lemon features' input, read once
    return frame


def recent_actions(engine: Engine, as_of: datetime, hours: float) -> pd.DataFrame:
    t = node_actions
    q = (
        select(t.c.time, t.c.node, t.c.action, t.c.reason, t.c.job_id)
        .where(t.c.time >= as_of - timedelta(hours=hours), t.c.time < as_of)
        .order_by(t.c.time, t.c.node)
    )
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    return pd.DataFrame(rows, columns=["time", "node", "action", "reason", "job_id"])


def guard_state(actions: pd.DataFrame, hours: float) -> dict[str, Any]:
    """What the mass-drain guard did in the period, read from the actions it recorded; with
    shadow mode's would-drains (folded, after shadow_guard), what it would have held too."""
    held = actions[actions["action"].isin(GUARD_ACTIONS)] if not actions.empty else actions
    drains = int(actions["action"].isin(DRAIN_ACTIONS).sum()) if not actions.empty else 0
    shadow = _shadow_line(actions)
    if held.empty:
        return {"state": "not triggered",
                "detail": f"{drains} drain(s) went through in the last {hours:g} h" + shadow,
                "held": 0, **_shadow_counts(actions)}
    nodes = sorted(set(held["node"]))
    return {"state": "triggered",
            "detail": f"held {len(nodes)} node(s): {', '.join(nodes[:10])}"
                      + (" ..." if len(nodes) > 10 else "") + shadow,
            "held": len(nodes), **_shadow_counts(actions)}


# A would_drain (shadow mode) the live mass-drain guard would have held: the report's word.
WOULD_BE_HELD = "would_be_held"


def _shadow_counts(actions: pd.DataFrame) -> dict[str, int]:
    if actions.empty or not actions["action"].isin((ActionKind.WOULD_DRAIN.value,
                                                    WOULD_BE_HELD)).any():
        return {}
    return {"shadow_would_drain": int((actions["action"] == ActionKind.WOULD_DRAIN).sum()),
            "shadow_held": int((actions["action"] == WOULD_BE_HELD).sum())}


def _shadow_line(actions: pd.DataFrame) -> str:
    got = _shadow_counts(actions)
    if not got:
        return ""
    return (f"; shadow mode: {got['shadow_would_drain'] + got['shadow_held']} would-drain(s), "
            f"of which the live guard would have held {got['shadow_held']} at first")


def fleet_partitions(engine: Engine, as_of: datetime) -> dict[str, list[str]]:
    """Each node's partitions as of `as_of`, from the node inventory; without one, every node
    whose checks ran (node_runs) in one partition, "*" (the nodes seen stand in for the fleet,
    as exposure does)."""
    from rsc_health.historian.schema import node_inventory as inv
    from rsc_health.historian.schema import node_runs

    out: dict[str, list[str]] = {}
    with engine.connect() as conn:
        rows = conn.execute(select(inv.c.node, inv.c.partition).where(
            inv.c.start <= as_of, (inv.c.end.is_(None)) | (inv.c.end > as_of))).all()
        for node, part in rows:
            parts = out.setdefault(node, [])
            if part not in parts:
                parts.append(part)
        if not out:
            for node in conn.execute(select(node_runs.c.node).distinct()).scalars():
                out[node] = ["*"]
    return out


def shadow_guard(engine: Engine, folded: pd.DataFrame, as_of: datetime,
                 opts: GatherOptions) -> pd.DataFrame:
    """Shadow mode records would_drain on every node and never asks Slurm, so the guard was
    never applied: a fabric event reads as a fleet-wide drain the live product caps. The
    guard's arithmetic (rsc_health.actions.shadow_guard_held) over each would_drain
    interval's first sweep, the drains done beside it counted: an interval the live guard
    would have held is relabelled WOULD_BE_HELD (live, it is retried after a back-off and may
    drain once the window has room: "held at first")."""
    if folded.empty or not (folded["action"] == ActionKind.WOULD_DRAIN).any():
        return folded
    from rsc_health.actions import shadow_guard_held

    partitions = fleet_partitions(engine, as_of)
    if all(parts == ["*"] for parts in partitions.values()):
        for node in folded["node"]:  # no inventory: every node seen is of the fleet
            partitions.setdefault(str(node), ["*"])
    done = {ActionKind.DRAIN_NOW.value, ActionKind.DRAIN_AFTER_JOB.value,
            ActionKind.LEMON_DRAIN.value}
    rows = [i for i, a in enumerate(folded["action"])
            if a == ActionKind.WOULD_DRAIN or a in done]
    attempts = [(pd.Timestamp(folded["time"].iloc[i]).to_pydatetime(),
                 str(folded["node"].iloc[i]), folded["action"].iloc[i] in done) for i in rows]
    held = shadow_guard_held(attempts, partitions, max_share=opts.guard_max_share,
                             window=timedelta(minutes=opts.guard_window_min))
    out = folded.copy()
    for k in held:
        out.iloc[rows[k], out.columns.get_loc("action")] = WOULD_BE_HELD
    return out


# --- the gathering itself ---------------------------------------------------------------------


def gather(
    engine: Engine,
    as_of: datetime,
    options: GatherOptions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> ReportData:
    """Everything the report shows, as of `as_of` (naive UTC)."""
    opts = options or GatherOptions()
    data = ReportData(as_of=as_of, window_days=int(opts.window_days))
    from rsc_health.historian.metrics._sql import Window  # lazy: pulls in scipy

    window = Window(since=as_of - timedelta(days=opts.metrics_days), until=as_of)

    if progress:
        progress("planner statistics")
    started = time.perf_counter()
    refresh_statistics(engine)  # the historian grows every night: plan for today's sizes
    data.timings["planner statistics"] = round(time.perf_counter() - started, 3)

    def step(section: str, label: str, produce: Callable[[], Any]) -> Any:
        if section in opts.skip:
            data.notes[section] = "skipped by [report] skip"
            return None
        if progress:
            progress(label)
        started = time.perf_counter()
        try:
            return produce()
        except SectionEmpty as why:  # nothing to show yet, for a reason the reader should see
            data.notes[section] = str(why)
            return None
        except Exception as exc:  # one broken section must not lose the whole report
            log.warning("report section %s failed: %s", section, exc, exc_info=True)
            data.notes[section] = f"{label} unavailable: {type(exc).__name__}: {exc}"
            data.failed.append(section)
            return None
        finally:
            # Kept in report.json: the first place to look when the nightly run gets slow.
            data.timings[label] = round(time.perf_counter() - started, 3)

    def put(attr: str, section: str, label: str, produce: Callable[[], Any]) -> None:
        """step(), its result kept as data.<attr> unless the section gave none."""
        got = step(section, label, produce)
        if got is not None:
            setattr(data, attr, got)

    def metrics():
        from rsc_health.historian.metrics import goodput, mttf, rates

        return rates, mttf, goodput

    from rsc_health.report import morning

    put("freshness", "freshness", "data freshness", lambda: morning.freshness(
        engine, as_of, opts.stale_after_s, opts.sacct_stale_hours))

    modules = step("metrics", "metrics", metrics)
    if modules is None:
        why = data.notes.pop("metrics")
        for section in ("rates", "outcomes", "causes", "rolling", "mttf", "goodput", "ettr"):
            data.notes.setdefault(section, why)
    else:
        rates, mttf, goodput = modules
        put("rates", "rates", "headline r_f", lambda: morning.weekly_rates(
            engine, as_of, rates.failure_rate, large_job_gpus=opts.large_job_gpus,
            long_days=opts.metrics_days, confidence=opts.confidence))
        put("outcomes", "outcomes", "job outcomes", lambda: outcomes_section(rates.outcomes(
            engine, window)))
        put("causes", "causes", "failure causes",
                   lambda: causes_section(rates.causes(engine, window)))
        put("rolling", "rolling", "rolling failure rate", lambda: rolling_section(
            rates.rolling(engine, window, days=opts.rolling_days,
                          large_job_gpus=opts.large_job_gpus), opts.rolling_days))
        put("deployments", "deployments", "check deployments",
            lambda: deployments_section(engine, window))

        # r_f (large jobs, per node-day) drives both the MTTF projection and E[ETTR]: the
        # headline's metrics-window row when it was gathered, else one query.
        def cluster_rf() -> float:
            if not data.rates.empty:
                return float(data.rates.iloc[2]["r_f"]) / 1000
            return rates.failure_rate(engine, window, opts.large_job_gpus).r_f

        measured = step("r_f", "cluster failure rate r_f", cluster_rf)
        r_f = measured if measured is not None and measured == measured and measured > 0 else None

        def mttf_frame() -> pd.DataFrame:
            return mttf_section(mttf.mttf_by_size(engine, window, r_f=r_f))

        put("mttf", "mttf", "MTTF by job size", mttf_frame)
        put("goodput", "goodput", "goodput lost",
                   lambda: goodput_section(goodput.goodput_lost(engine, window)))

        def ettr_frame() -> pd.DataFrame:
            from rsc_health.historian.metrics.ettr import minutes
            from rsc_health.historian.metrics.runs import RunOptions, job_runs

            cfg = with_defaults("ettr", opts.ettr)
            if r_f is None:  # no large-job runtime or failures: nothing to expect against
                raise SectionEmpty(
                    "no ETTR yet: no job over the large-job threshold has ended in the window, "
                    "so r_f (and the expected ETTR) cannot be measured")
            dt_min = float(cfg["checkpoint_interval_min"])
            run_opts = RunOptions(
                link_by=str(cfg["link_by"]),
                tag_regex=str(cfg["tag_regex"]),
                gap_s=float(cfg["link_gap_hours"]) * 3600,
                u0=minutes(float(cfg["u0_min"])),
                w_cp=minutes(float(cfg["w_cp_min"])),
                dt_cp=minutes(dt_min) if dt_min > 0 else None,
                min_run_hours=float(cfg["min_run_hours"]),
                min_gpus=int(cfg["min_gpus"]),
            )
            return ettr_section(job_runs(engine, r_f, window, run_opts))

        put("ettr", "ettr", "ETTR of job runs", ettr_frame)

    put("out_of_service", "out_of_service", "nodes out of service",
               lambda: morning.out_of_service(engine, as_of))
    put("stale", "stale", "nodes whose checks stopped",
               lambda: morning.stale_checks(engine, as_of, opts.stale_after_s))
    put("qualified", "qualified", "qualification runs",
               lambda: morning.qualified(engine, as_of, opts.actions_hours))
    put("suspects", "suspects", "suspect nodes",
               lambda: morning.suspects(engine, as_of, opts.actions_hours))
    put("xids", "xids", "XIDs per GPU",
               lambda: morning.xids_per_gpu(engine, as_of, opts.window_days, opts.xid_top))

    young_fleet(engine, as_of, opts, step, data)

    lemon_cfg = _lemon_settings(opts.lemon)
    outages = _outage_rules(opts)
    if outages.xid_catalog_problem:
        # every section that leaves application XIDs out judged by the packaged catalog
        log.warning("%s", outages.xid_catalog_problem)
        data.notes["xid_catalog"] = outages.xid_catalog_problem

    def features(when: datetime = as_of):
        from rsc_health.historian.lemons.features import lemon_features

        # host_failed_jobs (triage) only for tonight's features, from the triage section
        # when it was gathered: no rule reads it, and the days-listed walk back asks for a
        # verdict per earlier day.
        host = data.triage.attrs.get("host_failed_jobs")
        return lemon_features(
            engine, when, opts.window_days,
            early_fail_minutes=float(lemon_cfg["early_fail_minutes"]),
            history_days=float(lemon_cfg["history_days"]),
            outages=outages,
            host_jobs=(host if host is not None else True) if when == as_of else False)

    def verdicts_of(feats: pd.DataFrame, when: datetime, with_evidence: bool = True):
        from rsc_health.historian.lemons.verdicts import LemonRules, lemon_verdicts

        return lemon_verdicts(engine, feats, when, LemonRules.from_config(lemon_cfg),
                              window_days=opts.window_days, with_evidence=with_evidence,
                              max_evidence=int(lemon_cfg["max_evidence"]),
                              history_days=float(lemon_cfg["history_days"]))

    feats = step("features", "lemon features", features)
    if feats is not None:
        data.features = features_section(feats)

        def verdicts():
            return lemons_section(verdicts_of(feats, as_of))

        put("lemons", "lemons", "lemon verdicts", verdicts)

        def pull() -> pd.DataFrame:
            nodes = [str(n) for n in data.lemons["node"]]
            if not nodes:
                return data.lemons

            def listed_on(when: datetime) -> set[str]:
                return {v.node for v in verdicts_of(features(when), when, with_evidence=False)}

            streak = morning.streak_from_previous(nodes, opts.previous, as_of,
                                                  opts.listed_days_max)
            if streak is None:
                streak = morning.days_listed(nodes, listed_on, as_of, opts.listed_days_max)
            return morning.pull_columns(
                data.lemons, streak, opts.listed_days_max, data.out_of_service,
                morning.tickets_for(engine, nodes), morning.last_actions(engine, nodes, as_of))

        if "lemons" not in data.notes:
            # Days listed, Slurm state and ticket: a failure here keeps the candidates shown.
            put("lemons", "pull", "days listed, state and tickets of the candidates", pull)
    else:
        data.notes["lemons"] = data.notes["features"]

    got = step("actions", "recent actions",
               lambda: recent_actions(engine, as_of, opts.actions_hours))
    if got is not None:
        # Every sweep's "would drain": one interval; the live guard's arithmetic applied.
        folded = fold_repeats(got)
        shown = step("actions", "the guard over shadow mode's would-drains",
                     lambda: shadow_guard(engine, folded, as_of, opts))
        data.actions = folded if shown is None else shown
        data.guard = guard_state(got if shown is None else shown, opts.actions_hours)
    return data


def young_fleet(engine: Engine, as_of: datetime, opts: GatherOptions, step: Callable,
                data: ReportData) -> None:
    """What needs no finished job: the findings open now and the node events per node, so a
    cluster with no job over the large-job size yet has more to read than "-"."""
    from rsc_health.report import fleet

    got = step("open_findings", "findings open now",
               lambda: fleet.open_findings(engine, as_of, opts.fleet_rows))
    if got is not None:
        data.open_findings = got
    got = step("node_events", "node events per node",
               lambda: fleet.events_per_node(engine, as_of, opts.window_days, opts.fleet_rows))
    if got is not None:
        data.node_events = got
    got = step("reliability", "event-based reliability",
               lambda: reliability_section(engine, as_of, opts))
    if got is not None:
        data.reliability = got
    got = step("triage", "failed-job triage", lambda: triage_section(engine, as_of, opts))
    if got is not None:
        data.triage = got
