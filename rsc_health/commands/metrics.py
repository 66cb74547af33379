"""`healthctl outcomes | failure-rate | causes | rolling | mttf | ettr | goodput`.

The reliability metrics of the paper's section III, each as a rich table or `--json`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import click

from rsc_health.commands import NAME_FILTER, FiniteFloat
from rsc_health.commands import historian_engine as _engine
from rsc_health.terminal import echo, shown

json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _remember_cluster(ctx: click.Context, _param, value):
    ctx.meta["rsc_health.cluster"] = value
    return value


def window_options(f):
    f = click.option("--cluster", default=None, type=NAME_FILTER, expose_value=False,
                     callback=_remember_cluster,
                     help="Only this Slurm cluster's jobs (several in one historian).")(f)
    f = click.option("--until", type=click.DateTime(), help="Jobs that ended before (UTC).")(f)
    f = click.option("--since", type=click.DateTime(), help="Jobs that ended at/after (UTC).")(f)
    return f


def _window(since: datetime | None, until: datetime | None):
    from rsc_health.historian.metrics._sql import Window

    ctx = click.get_current_context(silent=True)
    cluster = ctx.meta.get("rsc_health.cluster") if ctx is not None else None
    return Window(since, until, cluster)


def _clean(value):
    """JSON-safe scalars: NaN -> null, inf -> "inf", timestamps -> ISO 8601."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalar
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return value


def _records(df) -> list[dict]:
    return [{k: _clean(v) for k, v in row.items()} for row in df.to_dict("records")]


def _json_safe(value):
    """`value` with every float _clean'd however deep: json.dumps writes a bare inf or NaN as
    Infinity / NaN, which is not JSON (an unbounded projection, an MTTF at r_f 0)."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return _clean(value) if isinstance(value, float) else value


def _emit_json(payload) -> None:
    click.echo(json.dumps(_json_safe(payload), indent=2, default=_clean))


def _fmt(value, spec: str = "") -> str:
    value = _clean(value)
    if value is None:
        return "-"
    if isinstance(value, float) and spec:
        return format(value, spec)
    return shown(value)  # a job, user or node name is anyone's text


def _table(title: str, df, columns: list[tuple[str, str, str]]) -> None:
    """columns: (dataframe column, header, format spec)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Title and headers as Text through shown(), like the cells: `rolling` makes a column of
    # each attribution cause (a node's check family, anyone's text), and a str header is read
    # as markup ("[/x]" raised MarkupError) and printed raw (an ESC reached the terminal).
    table = Table(title=Text(shown(title)))
    for _, header, _spec in columns:
        table.add_column(Text(shown(header)), justify="left" if _spec == "s" else "right")
    for row in df.to_dict("records"):
        # Text, never a str: rich reads "[...]" in a str cell as markup, and a job named
        # "[/x]" raised MarkupError ("[link=...]" made a hyperlink).
        table.add_row(*(Text(_fmt(row[c], spec if spec != "s" else ""))
                        for c, _, spec in columns))
    Console().print(table)


def _cfg(ctx, key):
    return ctx.obj.config.get(key)


# -- outcomes ---------------------------------------------------------------------------------


@click.command()
@window_options
@json_option
@click.pass_context
def outcomes(ctx, since, until, as_json):
    """Job outcomes by count and by GPU-hours (paper Fig. 3); (HW) marks infra failures."""
    from rsc_health.historian.metrics.rates import outcomes as compute

    df = compute(_engine(ctx), _window(since, until))
    if as_json:
        return _emit_json(_records(df))
    _table(
        "Job outcomes",
        df,
        [
            ("outcome", "outcome", "s"),
            ("jobs", "jobs", ""),
            ("job_share", "% jobs", ".2%"),
            ("gpu_hours", "GPU-hours", ",.0f"),
            ("gpu_hour_share", "% GPU-hours", ".2%"),
        ],
    )


# -- failure-rate -----------------------------------------------------------------------------


@click.command("failure-rate")
@window_options
@click.option("--large-job-gpus", type=int, help="Count jobs with more GPUs than this.")
@json_option
@click.pass_context
def failure_rate(ctx, since, until, large_job_gpus, as_json):
    """Cluster failure rate r_f per node-day (NODE_FAIL + attributed FAILED, large jobs)."""
    from rsc_health.historian.metrics.rates import failure_rate as compute

    threshold = (
        large_job_gpus if large_job_gpus is not None else _cfg(ctx, "metrics.large_job_gpus")
    )
    fr = compute(
        _engine(ctx), _window(since, until), threshold, _cfg(ctx, "metrics.confidence")
    )
    per = fr.per_1000()
    if as_json:
        # The same unit as the table: failures per 1000 node-days, named in the keys.
        return _emit_json({
            "r_f_per_1000_node_days": _clean(per["r_f"]),
            "ci_low_per_1000_node_days": _clean(per["ci_low"]),
            "ci_high_per_1000_node_days": _clean(per["ci_high"]),
            "confidence": fr.confidence, "failures": fr.failures, "node_days": fr.node_days,
            "jobs": fr.jobs, "large_job_gpus": fr.large_job_gpus,
        })
    if fr.jobs == 0 or fr.node_days <= 0:
        click.echo(f"r_f: no job with more than {fr.large_job_gpus} GPUs ended in the window; "
                   "nothing to measure yet")
        return
    click.echo(
        f"r_f = {_fmt(per['r_f'], '.2f')} failures per 1000 node-days "
        f"({fr.confidence:.0%} CI {_fmt(per['ci_low'], '.2f')}-{_fmt(per['ci_high'], '.2f')}): "
        f"{fr.failures} failures over {fr.node_days:,.1f} node-days of {fr.jobs} jobs "
        f"with > {fr.large_job_gpus} GPUs"
    )


# -- causes -----------------------------------------------------------------------------------


@click.command()
@window_options
@json_option
@click.pass_context
def causes(ctx, since, until, as_json):
    """Infra failures per GPU-hour by attributed cause, with co-occurrence (paper Fig. 4)."""
    from rsc_health.historian.metrics.rates import causes as compute
    from rsc_health.historian.metrics.rates import cooccurrence

    engine, window = _engine(ctx), _window(since, until)
    df, pairs = compute(engine, window), cooccurrence(engine, window)
    if as_json:
        return _emit_json({"causes": _records(df), "cooccurrence": _records(pairs)})
    _table(
        "Failures by attributed cause",
        df,
        [
            ("cause", "cause", "s"),
            ("failures", "failures", ""),
            ("per_gpu_hour", "per GPU-hour", ".3e"),
            ("share", "% failures", ".1%"),
            ("cooccurring", "with another cause", ""),
        ],
    )
    if not pairs.empty:
        _table(
            "Co-occurring causes",
            pairs,
            [
                ("cause_a", "cause", "s"),
                ("cause_b", "with", "s"),
                ("failures", "failures", ""),
            ],
        )


# -- rolling ----------------------------------------------------------------------------------


@click.command()
@window_options
@click.option("--days", type=int, help="Rolling window in days (default [metrics] rolling_days).")
@click.option("--every", type=int, default=7, show_default=True, help="Show every Nth day.")
@json_option
@click.pass_context
def rolling(ctx, since, until, days, every, as_json):
    """Rolling failure rate per 1000 node-days by failure mode (paper Fig. 5)."""
    from rsc_health.historian.metrics.rates import rolling as compute

    df = compute(
        _engine(ctx),
        _window(since, until),
        days or _cfg(ctx, "metrics.rolling_days"),
        _cfg(ctx, "metrics.large_job_gpus"),
    )
    if as_json:
        return _emit_json(_records(df))
    if df.empty:
        return click.echo("no large jobs in the window")
    kept = df.iloc[::-1].iloc[:: max(every, 1)].iloc[::-1]  # always keep the latest day
    modes = [c for c in df.columns if c not in ("date", "node_days", "total")]
    _table(
        f"{days or _cfg(ctx, 'metrics.rolling_days')}-day rolling failures per 1000 node-days",
        kept.assign(date=kept["date"].dt.date),
        [
            ("date", "date", "s"),
            ("node_days", "node-days", ",.0f"),
            ("total", "total", ".2f"),
            *[(m, m, ".2f") for m in modes],
        ],
    )


# -- mttf -------------------------------------------------------------------------------------


@click.command()
@window_options
@click.option(
    "--rf", type=FiniteFloat(min=0),
    help="r_f per 1000 node-days for the projection (default: measured)."
)
@click.option(
    "--project",
    "project",
    multiple=True,
    type=click.IntRange(min=1),
    metavar="GPUS",
    help="Also project MTTF for this job size (repeatable).",
)
@json_option
@click.pass_context
def mttf(ctx, since, until, rf, project, as_json):
    """MTTF by job size with a 90% Gamma CI, next to (N_nodes r_f)^-1 (paper Fig. 7)."""
    from rsc_health.historian.metrics.mttf import mttf_by_size, projected_mttf_hours
    from rsc_health.historian.metrics.rates import failure_rate as measure

    engine, window = _engine(ctx), _window(since, until)
    conf = _cfg(ctx, "metrics.confidence")
    r_f = (
        rf / 1000
        if rf is not None
        else measure(engine, window, _cfg(ctx, "metrics.large_job_gpus"), conf).r_f
    )
    gpn = _cfg(ctx, "metrics.gpus_per_node")
    df = mttf_by_size(
        engine,
        window,
        r_f if r_f == r_f else None,
        _cfg(ctx, "metrics.size_buckets"),
        gpn,
        conf,
    )
    proj = [{"gpus": g, "projected_hours": projected_mttf_hours(g, r_f, gpn)} for g in project]
    if as_json:
        return _emit_json({"r_f": _clean(r_f), "sizes": _records(df), "projections": proj})
    _table(
        f"MTTF by job size (r_f = {_fmt(r_f * 1000, '.2f')} per 1000 node-days)",
        df,
        [
            ("size", "GPUs", "s"),
            ("jobs", "jobs", ""),
            ("runtime_hours", "runtime h", ",.0f"),
            ("failures", "failures", ""),
            ("mttf_hours", "MTTF h", ",.1f"),
            ("ci_low_hours", f"{conf:.0%} CI low", ",.1f"),
            ("ci_high_hours", f"{conf:.0%} CI high", ",.1f"),
            ("projected_hours", "projected h", ",.2f"),
        ],
    )
    for p in proj:
        hours = p["projected_hours"]
        if math.isnan(hours):
            said = "not projected: r_f is not measured (no large job ended in the window)"
        elif math.isinf(hours):
            said = "unbounded: r_f is 0 (no failure in the window)"
        else:
            said = f"{hours:.2f} h"
        click.echo(f"projected MTTF at {p['gpus']:,} GPUs: {said}")


# -- goodput ----------------------------------------------------------------------------------


@click.command()
@window_options
@json_option
@click.pass_context
def goodput(ctx, since, until, as_json):
    """GPU-hours lost to infra failures and the preemptions their requeues cause (Fig. 8)."""
    from rsc_health.historian.metrics.goodput import goodput_lost

    df = goodput_lost(
        _engine(ctx),
        _window(since, until),
        _cfg(ctx, "metrics.size_buckets"),
        float(_cfg(ctx, "metrics.preempt_window_s")),
    )
    if as_json:
        return _emit_json(_records(df))
    _table(
        "Goodput lost: min(runtime, 30 min) x GPUs",
        df,
        [
            ("size", "GPUs", "s"),
            ("kind", "lost to", "s"),
            ("jobs", "jobs", ""),
            ("gpu_hours_lost", "GPU-hours lost", ",.1f"),
        ],
    )
    if not df.empty:
        pre = df.loc[df["kind"] == "preemption", "gpu_hours_lost"].sum()
        total = df["gpu_hours_lost"].sum()
        share = f"{pre / total:.1%}" if total > 0 else "none"  # jobs that never started
        click.echo(f"total {total:,.1f} GPU-hours; {share} from second-order preemptions")


# -- ettr -------------------------------------------------------------------------------------

_WHAT_IF = re.compile(r"^(rf|wcp)=([0-9.]+)(x|s|m|h)?$")


def parse_what_if(text: str) -> tuple[str, float, bool]:
    """'rf=0.5x' -> ('rf', 0.5, True); 'rf=2.34' -> absolute per 1000 node-days;
    'wcp=2m' / 'wcp=10s' / 'wcp=1h' -> ('wcp', days, False)."""
    m = _WHAT_IF.match(text.strip().replace(" ", ""))
    if not m:
        raise click.BadParameter(f"{text!r}: expected rf=0.5x, rf=2.34 or wcp=2m / 10s / 1h")
    what, number, unit = m.group(1), float(m.group(2)), m.group(3)
    if what == "rf":
        if unit not in (None, "x"):
            raise click.BadParameter(f"{text!r}: rf takes a factor (0.5x) or a rate per 1000")
        return what, number if unit == "x" else number / 1000, unit == "x"
    if number <= 0:
        # The model checkpoints every Daly-Young interval sqrt(2 w_cp / (N r_f)): free writes
        # make it 0 and its closed forms and Monte Carlo divide by it. Refused, named.
        raise click.BadParameter(f"{text!r}: wcp must be more than 0 (a checkpoint write "
                                 "takes time; the Daly-Young interval is 0 at 0)")
    scale = {"s": 1 / 86400, "m": 1 / 1440, "h": 1 / 24, None: 1 / 1440}[unit]
    return what, number * scale, False


def _apply_what_if(model, spec):
    what, value, relative = spec
    if what == "rf":
        if not relative and model.r_f <= 0:  # a rate from none: set it, nothing to scale
            return replace(model, r_f=value)
        return model.what_if(rf_scale=value if relative else value / model.r_f)
    return model.what_if(w_cp=value)


def _ettr_projection(ctx, base, nodes: int, what_ifs: list, runtime_days: float,
                     as_json: bool):
    """`ettr --nodes N`: the modelled run (Eq. 1, Eq. 2, Monte Carlo), then each what-if."""
    from rsc_health.historian.metrics.ettr import monte_carlo

    rows = []
    for label, model in [("baseline", base)] + [(w, _apply_what_if(base, s)) for w, s in what_ifs]:
        mc = monte_carlo(model, runs=int(_cfg(ctx, "ettr.monte_carlo_runs")))
        rows.append(
            {
                "scenario": label,
                "nodes": nodes,
                "r_f_per_1000": model.r_f * 1000,
                "w_cp_min": model.w_cp * 1440,
                "checkpoint_interval_min": model.interval * 1440,
                "mttf_hours": model.mttf * 24,
                "eq1_expected": model.expected(),
                "eq2_long_run": model.expected_long_run(),
                "monte_carlo": mc.mean,
                "monte_carlo_unfinished": mc.unfinished,
                "closed_form_holds": model.closed_form_holds(),
            }
        )
    if as_json:
        return _emit_json(rows)
    for row in rows:
        if not row["closed_form_holds"]:
            echo(f"note: {row['scenario']}: Eq. 1 and Eq. 2 do not hold at this size and rate "
                 "(a restart plus half a checkpoint interval is not shorter than the MTTF: "
                 "lam (u0 + dt_cp/2) >= 1), shown held to 0..1; the Monte Carlo is the answer")
        if row["monte_carlo_unfinished"]:
            echo(f"note: {row['scenario']}: {row['monte_carlo_unfinished']} of the Monte Carlo "
                 "runs were still requeueing after their bound of requeues (failures come "
                 "faster than checkpoints): scored by the progress they made")
    import pandas as pd

    _table(
        f"Expected ETTR, {nodes} nodes, R = {runtime_days:g} days",
        pd.DataFrame(rows),
        [
            ("scenario", "scenario", "s"),
            ("r_f_per_1000", "r_f/1000", ".2f"),
            ("w_cp_min", "w_cp min", ".2f"),
            ("checkpoint_interval_min", "dt_cp min", ".1f"),
            ("mttf_hours", "MTTF h", ".2f"),
            ("eq1_expected", "Eq.1", ".3f"),
            ("eq2_long_run", "Eq.2", ".3f"),
            ("monte_carlo", "Monte Carlo", ".3f"),
        ],
    )


@click.command()
@window_options
@click.option(
    "--what-if",
    "what_ifs",
    multiple=True,
    metavar="rf=0.5x|wcp=2m",
    help="Re-evaluate expected ETTR with a scaled failure rate or checkpoint write.",
)
@click.option("--top", type=int, default=10, show_default=True, help="Longest runs to list.")
@click.option("--nodes", type=click.IntRange(min=1),
              help="Model a hypothetical run of N nodes instead.")
@click.option(
    "--runtime-days",
    type=FiniteFloat(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Productive runtime R of the hypothetical run.",
)
@click.option(
    "--queue-hours",
    type=FiniteFloat(min=0),
    default=0.0,
    show_default=True,
    help="Queue time q per (re)submission of the hypothetical run.",
)
@click.option("--rf", type=FiniteFloat(min=0), help="r_f per 1000 node-days (default: measured).")
@json_option
@click.pass_context
def ettr(ctx, since, until, what_ifs, top, nodes, runtime_days, queue_hours, rf, as_json):
    """ETTR: measured per job run next to expected (Eq. 1), or a modelled run (--nodes)."""
    import numpy as np

    from rsc_health.historian.metrics.ettr import EttrModel, minutes
    from rsc_health.historian.metrics.runs import RunOptions, job_runs

    specs = [parse_what_if(w) for w in what_ifs]
    u0 = minutes(float(_cfg(ctx, "ettr.u0_min")))
    w_cp = minutes(float(_cfg(ctx, "ettr.w_cp_min")))
    if w_cp <= 0:  # as wcp=0s above: the Daly-Young interval would be 0
        raise click.ClickException(
            f"[ettr] w_cp_min = {_cfg(ctx, 'ettr.w_cp_min')}: must be more than 0 (a "
            "checkpoint write takes time; the Daly-Young interval is 0 at 0)")
    dt_min = float(_cfg(ctx, "ettr.checkpoint_interval_min"))
    dt_cp = minutes(dt_min) if dt_min > 0 else None
    engine = None
    if rf is not None:
        r_f = rf / 1000
    else:
        from rsc_health.historian.metrics.rates import failure_rate as measure

        engine = _engine(ctx)
        large = _cfg(ctx, "metrics.large_job_gpus")
        r_f = measure(engine, _window(since, until), large).r_f
        if not r_f == r_f:
            if nodes:
                raise click.ClickException(
                    f"no job over {large} GPUs has ended yet, so r_f cannot be measured; "
                    "pass --rf (failures per 1000 node-days) for the projection")
            # A young cluster: nothing is wrong, there is just nothing to report yet.
            message = (f"no ETTR yet: no job over {large} GPUs has ended in the window, so r_f "
                       "(and the expected ETTR) cannot be measured")
            if as_json:
                return _emit_json({"runs": [], "note": message})
            click.echo(message)
            return

    if nodes:
        return _ettr_projection(ctx, EttrModel(nodes, r_f, runtime=runtime_days, u0=u0,
                                               w_cp=w_cp, dt_cp=dt_cp, queue=queue_hours / 24),
                                nodes, list(zip(what_ifs, specs, strict=True)), runtime_days,
                                as_json)

    opts = RunOptions(
        link_by=_cfg(ctx, "ettr.link_by"),
        tag_regex=_cfg(ctx, "ettr.tag_regex"),
        gap_s=float(_cfg(ctx, "ettr.link_gap_hours")) * 3600,
        u0=u0,
        w_cp=w_cp,
        dt_cp=dt_cp,
        min_run_hours=float(_cfg(ctx, "ettr.min_run_hours")),
        min_gpus=int(_cfg(ctx, "ettr.min_gpus")),
    )
    runs = job_runs(engine or _engine(ctx), r_f, _window(since, until), opts)
    cols = []
    for w, spec in zip(what_ifs, specs, strict=True):
        from rsc_health.historian.metrics.ettr import expected_ettr

        what, value, relative = spec
        rate = r_f * value if what == "rf" and relative else value if what == "rf" else r_f
        wcp = value if what == "wcp" else w_cp
        queue = runs["queue_hours"].to_numpy() / 24 / runs["instances"].to_numpy(dtype=float)
        runs[f"expected {w}"] = expected_ettr(
            runs["nodes"].to_numpy(dtype=float),
            rate,
            np.maximum(runs["productive_hours"].to_numpy(dtype=float) / 24, 1e-9),
            u0=u0,
            w_cp=wcp,
            dt_cp=None if dt_cp is None else np.full(len(runs), dt_cp),
            queue=queue,
        )
        cols.append((f"expected {w}", f"E[ETTR] {w}", ".3f"))
    top_runs = runs.head(top)
    if as_json:
        return _emit_json(
            {
                "r_f": r_f,
                "runs": len(runs),
                "mean_measured_ettr": _clean(runs["measured_ettr"].mean()) if len(runs) else None,
                "mean_expected_ettr": _clean(runs["expected_ettr"].mean()) if len(runs) else None,
                "top": _records(top_runs),
            }
        )
    click.echo(
        f"r_f = {r_f * 1000:.2f} per 1000 node-days; {len(runs)} job runs with >= "
        f"{opts.min_run_hours:g} h runtime (linked by {opts.link_by})"
    )
    if len(runs):
        click.echo(
            f"mean measured ETTR {runs['measured_ettr'].mean():.3f}, "
            f"mean expected ETTR {runs['expected_ettr'].mean():.3f}"
        )
    _table(
        f"Longest {len(top_runs)} job runs",
        top_runs,
        [
            ("name", "name", "s"),
            ("user", "user", "s"),
            ("gpus", "GPUs", ""),
            ("instances", "jobs", ""),
            ("interruptions", "interrupts", ""),
            ("runtime_hours", "runtime h", ",.1f"),
            ("wallclock_hours", "wall h", ",.1f"),
            ("measured_ettr", "ETTR", ".3f"),
            ("expected_ettr", "E[ETTR]", ".3f"),
            *cols,
        ],
    )


# -- reliability (events) ---------------------------------------------------------------------


@click.command()
@click.option("--since", type=click.DateTime(), help="Failures at/after (UTC; default: all).")
@click.option("--until", type=click.DateTime(), help="Failures before (UTC; default: now).")
@click.option("--period", type=click.Choice(["month", "quarter", "year"]), default="quarter",
              show_default=True)
@click.option("--cluster", default=None, type=NAME_FILTER, help="Only this cluster's nodes.")
@json_option
@click.pass_context
def reliability(ctx, since, until, period, cluster, as_json):
    """Event-based reliability per period and peer group: failures, episodes, system and node
    MTBF, repair time (p50/p90/mean), reason mix. From node events and XIDs alone, beside the
    job-based r_f and MTTF; node-days come from `healthctl ingest inventory`."""
    from rsc_health.historian.lemons.features import OutageRules
    from rsc_health.historian.metrics.reliability import reliability as compute
    from rsc_health.historian.outages import describe_removed

    rules = OutageRules.of_site(ctx.obj.config)
    lo = since or datetime(1970, 1, 1)
    hi = until or datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    engine = _engine(ctx)
    try:
        df = compute(engine, lo, hi, period=period, rules=rules, cluster=cluster)
    finally:
        engine.dispose()
    if as_json:
        _emit_json({"since": lo, "until": hi, "period": period, "rows": _records(df),
                    "left_out": df.attrs["left_out"]})
        return
    if df.empty:
        click.echo("no failures in the window")
        click.echo(describe_removed(df.attrs["left_out"]))
        return
    _table("event-based reliability", df, [
        ("period", "period", "s"), ("group", "group", "s"), ("failures", "failures", ""),
        ("episodes", "episodes", ""), ("node_days", "node-days", ".0f"),
        ("system_mtbf_h", "system MTBF h", ".2f"), ("node_mtbf_h", "node MTBF h", ".0f"),
        ("repair_p50_h", "repair p50 h", ".1f"), ("repair_p90_h", "repair p90 h", ".1f"),
    ])
    click.echo(describe_removed(df.attrs["left_out"]))


# -- failed-job triage ------------------------------------------------------------------------


@click.command()
@click.option("--since", type=click.DateTime(), help="Jobs that ended at/after (UTC; default: "
              "[lemon] window_days before --until).")
@click.option("--until", type=click.DateTime(), help="Jobs that ended before (UTC; default: now).")
@click.option("--node", default=None, type=NAME_FILTER, help="Only the jobs that ran on this node.")
@click.option("--label", type=click.Choice(["host", "user", "unknown"]), default=None,
              help="Only jobs with this label.")
@json_option
@click.pass_context
def triage(ctx, since, until, node, label, as_json):
    """Every failed job (FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, TIMEOUT, DEADLINE,
    CANCELLED, REQUEUED) labelled host, user or unknown, with its evidence: failing checks
    and rsc-health drains in the attribution window, node DOWN events, Slurm's NODE_FAIL,
    application-class XIDs (the job's own), exit codes and signals."""
    from rsc_health.historian.attribute import Window
    from rsc_health.historian.lemons.features import OutageRules
    from rsc_health.historian.lemons.verdicts import DEFAULTS
    from rsc_health.historian.triage import summary
    from rsc_health.historian.triage import triage as compute

    section = {**DEFAULTS, **ctx.obj.config.section("lemon")}
    hi = until or datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    lo = since or hi - timedelta(days=float(section["window_days"]))
    engine = _engine(ctx)
    try:
        df = compute(engine, lo, hi, window=Window.from_config(ctx.obj.config),
                     rules=OutageRules.of_site(ctx.obj.config), node=node)
    finally:
        engine.dispose()
    counts = summary(df)
    if label is not None:
        df = df[df["label"] == label]
    if as_json:
        _emit_json({"since": lo, "until": hi, "node": node, "labels": counts,
                    "jobs": _records(df)})
        return
    click.echo(f"{sum(counts.values())} failed job(s) {lo:%Y-%m-%d %H:%M} to "
               f"{hi:%Y-%m-%d %H:%M}: " + ", ".join(f"{k} {n}" for k, n in counts.items()))
    for row in df.itertuples():
        blamed = f" [{', '.join(row.nodes)}]" if row.nodes else ""
        echo(f"  {row.job_id:<12} {row.end:%Y-%m-%d %H:%M}  {row.state:<13} {row.label:<7}"
             f"{blamed}  {'; '.join(row.evidence)}")


# -- GPUs that failed in more than one node ---------------------------------------------------


@click.command()
@click.option("--until", type=click.DateTime(), help="Failures before (UTC; default: now).")
@json_option
@click.pass_context
def gpus(ctx, until, as_json):
    """GPUs (by serial, `healthctl ingest gpus`) that failed in two or more nodes: the fault
    moved with the GPU, and the nodes it left are not blamed for it in the lemon verdicts."""
    from rsc_health.historian.gpus import attribute, gpu_intervals, repeat_gpus
    from rsc_health.historian.lemons.features import OutageRules
    from rsc_health.historian.metrics.reliability import failures

    rules = OutageRules.of_site(ctx.obj.config)
    hi = until or datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    engine = _engine(ctx)
    try:
        found = failures(engine, datetime(1970, 1, 1), hi, rules)
        df = repeat_gpus(attribute(found[["node", "time"]], gpu_intervals(engine)))
    finally:
        engine.dispose()
    if as_json:
        _emit_json({"until": hi, "gpus": _records(df)})
        return
    if df.empty:
        click.echo("no GPU failed in more than one node")
        return
    click.echo(f"{len(df)} GPUs failed in more than one node")
    for row in df.itertuples():
        echo(f"  {row.serial}: {row.failures} failures in {', '.join(row.nodes)}")
