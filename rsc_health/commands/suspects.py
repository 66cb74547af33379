"""`healthctl suspects`: nodes slow against their own jobs' peers, kept from big jobs.

    healthctl suspects [--all] [--json]            # open episodes and their evidence
    healthctl suspects clear NODE --reason TEXT    # a person clears one (trusted again at once)
    healthctl suspects apply [--json]              # the manager pass (rsc-health-suspects.timer)
    healthctl suspects rates [--json]              # the fleet's own rate the detector judges by
    healthctl suspects job JOB [--hours H] [--json]  # why a job's nodes were, or were not, flagged
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import click

from rsc_health.commands import NAME_FILTER, FiniteFloat, invoking_person
from rsc_health.commands import historian_engine as _engine
from rsc_health.commands import slurm_handle as _slurm
from rsc_health.terminal import echo

if TYPE_CHECKING:
    from rsc_health.historian.failslow.recurring import Across

# How far past the newest row the historian holds the manager pass believes its clock.
SUSPECTS_CLOCK_LEAD = timedelta(hours=1)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def describe(ep) -> str:
    """One line of evidence: the metric, how far from its peers, since when, in which jobs."""
    def num(x):
        return "?" if x is None else f"{x:.4g}"

    jobs = ", ".join(ep.job_ids[:6]) + (f" (+{len(ep.job_ids) - 6})" if len(ep.job_ids) > 6
                                        else "")
    return (f"{ep.metric} {num(ep.value)} vs peers {num(ep.peer_median)} "
            f"(deviation {num(ep.deviation)}, {ep.source}) since {ep.since:%Y-%m-%d %H:%M}, "
            f"last {ep.last_evidence:%Y-%m-%d %H:%M}, expires {ep.expires:%Y-%m-%d %H:%M}; "
            f"jobs {jobs or '-'}")


@click.group("suspects", invoke_without_command=True)
@click.option("--all", "show_all", is_flag=True,
              help="Also the episodes that ended in the last 7 days (cleared, confirmed, expired).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def suspects(ctx, show_all, as_json) -> None:
    """Suspect nodes (slow against their jobs' peers) and the evidence behind each."""
    if ctx.invoked_subcommand is not None:
        return
    from rsc_health.historian import suspects as hs
    from rsc_health.model import SuspectState

    engine = _engine(ctx)
    try:
        eps = (hs.recent(engine, _now() - timedelta(days=7)) if show_all
               else hs.active(engine))
        judged, across = _across(engine, ctx.obj.config)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps({"schema": "rsc_health.suspects/1",
                               "suspects": [e.as_dict() for e in eps],
                               "across_jobs_judged": judged and judged.isoformat()},
                              indent=1))
        return
    if isinstance(across, str):
        echo(f"across jobs: {across}")
    elif across is not None and across.days <= 0:
        echo("across jobs: off ([failslow] recurring_days = 0)")
    elif across is not None:
        when = (f"last judged {judged:%Y-%m-%d %H:%M} UTC" if judged else "not judged yet")
        every = across.every.total_seconds() / 60
        echo(f"across jobs: {when} (every {every:g} min by `suspects apply`; [failslow] "
             f"recurring_every_min)")
    if not eps:
        echo("no suspect node" + (" in the last 7 days" if show_all else ""))
        return
    for ep in eps:
        tier = f" [{ep.tier}]" if ep.tier else ""
        end = (f" ({ep.changed_by}: {ep.change_reason})"
               if ep.state is not SuspectState.SUSPECT else "")
        echo(f"{ep.node}: {ep.state.value}{tier}{end}: {describe(ep)}")
        if ep.detail:
            echo(f"    {ep.detail[:300]}")


def _across(engine, cfg) -> tuple[datetime | None, Across | str | None]:
    """When the fail-slow detector last judged across jobs (None: never), and its cadence as
    the detector itself reads it (recurring.Across: the interval capped by the expiry); the
    config's complaint instead where it refuses the settings, (None, None) where this install
    has no detector."""
    try:
        from rsc_health.historian.failslow import across_judged
        from rsc_health.historian.failslow.recurring import Across
    except ImportError:
        return None, None
    try:
        across: Across | str = Across.from_config(cfg)
    except ValueError as exc:
        across = str(exc)
    return across_judged(engine), across


@suspects.command("clear")
@click.argument("node")
@click.option("--reason", required=True, help="Why (kept with your name in the historian).")
@click.pass_context
def clear(ctx, node, reason) -> None:
    """A person clears NODE's suspicion: the trusted feature and its weight come back now."""
    from rsc_health.historian import suspects as hs
    from rsc_health.hostlist import is_one_node
    from rsc_health.suspects import apply

    if not is_one_node(node):
        raise click.ClickException(f"{node!r}: one node name, please")
    if not reason.strip():
        raise click.ClickException("--reason must say why")
    from rsc_health.historian.freshness import believed_now

    who = invoking_person()
    engine = _engine(ctx)
    try:
        # The pass's clock, not the host's raw one: a clear stamped a year ahead made every
        # later evidence "not newer than its cleared episode" for that year.
        now, note = believed_now(engine, _now(), SUSPECTS_CLOCK_LEAD)
        if note:
            echo(f"note: {note}")
        ep = hs.clear(engine, node, now, who=who, why=reason.strip())
        if ep is None:
            raise click.ClickException(f"{node} has no open suspect episode")
        echo(f"{node}: cleared by {who} ({reason.strip()})")
        changes, errors = apply(engine, _slurm(ctx), ctx.obj.config, now, log=echo)
        if not ctx.obj.config.actions_enabled(node):
            echo(f"note: shadow mode ([actions] enabled = false): nothing is written to Slurm; "
                 f"{node} keeps the features and weight Slurm has for it now")
    finally:
        engine.dispose()
    for err in errors:
        echo(f"Slurm: {err} (the next `healthctl suspects apply` tries again)", err=True)
    if errors:
        ctx.exit(1)


@suspects.command("apply")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def apply_cmd(ctx, as_json) -> None:
    """The manager pass: new fail-slow evidence, qualification results and expiry into the
    historian, then Slurm in line with it (a change Slurm lost at a reconfigure or restart
    is re-applied). Exit 1 when a Slurm call or the detector failed."""
    from rsc_health.historian.freshness import believed_now
    from rsc_health.suspects import manager_pass

    engine = _engine(ctx)
    try:
        # Expiry is elapsed time: a clock jumped ahead must not end every episode at once.
        now, note = believed_now(engine, _now(), SUSPECTS_CLOCK_LEAD)
        if note and not as_json:
            echo(f"note: {note}")
        res = manager_pass(engine, _slurm(ctx), ctx.obj.config, now,
                           log=(lambda m: None) if as_json else echo)
        if note:
            res.notes.append(note)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps(res.as_dict(), indent=1))
    else:
        for node, what in sorted(res.recorded.items()):
            echo(f"{node}: evidence {what}")
        for node, state, why in res.settled:
            echo(f"{node}: {state.value} ({why})")
        for node in res.expired:
            echo(f"{node}: expired")
        if not (res.recorded or res.settled or res.expired or res.changes):
            echo("suspect tier: nothing to change")
    if res.detector_error:
        echo(res.detector_error, err=True)
    for err in res.errors:
        echo(f"Slurm: {err}", err=True)
    ctx.exit(1 if res.failed else 0)


@suspects.command("rates")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def rates_cmd(ctx, as_json) -> None:
    """The fleet's own rate, per judged metric, in the window the detector reads now: its
    one-sweep excursions (a node past its line alone, neither sweep beside it) among the
    judged node-sweeps, their size, and whether two of the median size in a row on one
    component would wait a sweep more (`fleet_chance`, [failslow] fleet_chance_per_node_day;
    docs/failslow.md). Exit 1 when the historian cannot be read."""
    from rsc_health.historian.db import HistorianError
    from rsc_health.historian.failslow import fleet_rates

    cfg, now = ctx.obj.config, _now()
    engine = _engine(ctx)
    try:
        found = fleet_rates(engine, now, cfg)
    except HistorianError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        engine.dispose()
    lookback = float(cfg.get("failslow.lookback_min"))
    if as_json:
        click.echo(json.dumps({"schema": "rsc_health.fleet_rates/1", "now": now.isoformat(),
                               "lookback_min": lookback,
                               "metrics": [r.as_dict() for r in found]}, indent=1))
        return
    echo(f"the last {lookback:g} min to {now:%Y-%m-%d %H:%M} UTC ([failslow] lookback_min): "
         "one-sweep excursions of the judged node-sweeps")
    if not any(r.judged for r in found):
        echo("no judged node-sweeps (no multi-node job with telemetry in the window)")
        return
    for r in found:
        rule = "on" if r.fleet_chance else "off"
        line = (f"{r.metric} (fleet_chance {rule}): {r.excursions} in {r.judged} "
                f"({100 * r.rate:.2f}%)")
        if r.excursions:
            verdict = ("is confirmed at persist_sweeps" if not r.pair_over_budget else
                       "waits a sweep more" if r.fleet_chance else
                       "would wait a sweep more with the rule on")
            line += (f"; median {r.median_lines:.1f} lines past, 90% under "
                     f"{r.p90_lines:.1f}; two of the median size in a row: "
                     f"{r.pair_per_node_day:.1e} a node-day against "
                     f"{r.budget_per_node_day:.1e}: such a pair {verdict}")
        echo(line)


@suspects.command("job")
@click.argument("job_id", type=NAME_FILTER)
@click.option("--hours", type=FiniteFloat(min=0.25, max=24 * 7), default=24.0, show_default=True,
              help="Judge at most the job's last this many hours (to its end, or now).")
@click.option("--all", "show_all", is_flag=True,
              help="Every node and metric, not only those off their peers or not judged.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def job_cmd(ctx, job_id, hours, show_all, as_json) -> None:
    """Why JOB's nodes were, or were not, flagged: each node and metric judged over the job's
    run as a pass judges its window (its peer group and size, the sweeps it was off its peers,
    those the job moved with it, its longest run against persist_sweeps), and the suspect
    episodes recorded with the job. Exit 1 when the historian cannot be read."""
    from rsc_health.historian import suspects as hs
    from rsc_health.historian.db import HistorianError
    from rsc_health.historian.failslow.explain import explain_job
    from rsc_health.historian.freshness import believed_now

    if not job_id.strip() or len(job_id) > 64:
        raise click.ClickException(f"{job_id[:64]!r}: not a job id")
    engine = _engine(ctx)
    try:
        now, _ = believed_now(engine, _now(), SUSPECTS_CLOCK_LEAD)
        got = explain_job(engine, job_id, now, ctx.obj.config, hours=hours)
        since = (got.since or now) - timedelta(days=7)
        plain = got.job_id.partition("@")[0]
        recorded = [e for e in hs.recent(engine, since)
                    if got.job_id in e.job_ids or (got.job_id == plain and any(
                        j.startswith(f"{plain}@") for j in e.job_ids))]
    except HistorianError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps({"schema": "rsc_health.suspects_job/1", **got.as_dict(),
                               "recorded": [e.as_dict() for e in recorded]}, indent=1))
        return
    span = (f" {got.since:%Y-%m-%d %H:%M} to {got.until:%Y-%m-%d %H:%M} UTC"
            if got.since and got.until else "")
    echo(f"job {got.job_id}: {len(got.nodes)} node(s){span}")
    for note in got.notes:
        echo(f"  {note}")
    shown = [r for r in got.rows if show_all or r.suspect or r.outlying or r.job_wide
             or not r.judged]
    quiet = len(got.rows) - len(shown)
    for r in shown:
        echo(f"  {r.node} {r.metric}: {r.why} [judged {r.judged}/{r.sampled} sweeps, "
             f"{r.peers} peers]")
    if quiet:
        echo(f"  {quiet} more node-metric(s) in line with their peers in every judged sweep"
             " (--all lists them)")
    if got.rows and not any(r.suspect for r in got.rows):
        echo("  no node of the job was off its peers long enough to be a suspect")
    for e in recorded:
        echo(f"  recorded: {e.node} {e.state.value}: {describe(e)}")
