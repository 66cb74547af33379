"""`healthctl lemons`: candidates with evidence; --apply drains them. (`healthctl
tune-lemons`, which tunes the [lemon] thresholds on the simulator, is a lab command:
rsc_health/commands/lab.py.)"""

from __future__ import annotations

import json
import re
from contextlib import nullcontext
from datetime import UTC, datetime

import click

from rsc_health.commands import NAME_FILTER
from rsc_health.commands import historian_engine as _engine
from rsc_health.commands import slurm_handle as _slurm
from rsc_health.terminal import echo

WINDOW_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhw]?)\s*$")
UNIT_DAYS = {"": 1.0, "d": 1.0, "w": 7.0, "h": 1 / 24}


def parse_window(text: str) -> float:
    """`28d`, `4w`, `36h` or a bare number of days -> days."""
    m = WINDOW_RE.match(text)
    if not m:
        raise click.BadParameter(f"{text!r}: expected e.g. 28d, 4w or 36h")
    return float(m[1]) * UNIT_DAYS[m[2]]


@click.command("lemons")
@click.option("--window", default=None, metavar="SPAN", help="Feature window, e.g. 28d (config).")
@click.option(
    "--as-of",
    type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    default=None,
    help="End of the window (UTC); default now.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--apply", "do_apply", is_flag=True, help="Drain the candidates and open tickets.")
@click.option("--cluster", default=None, type=NAME_FILTER, help="Only this Slurm cluster's nodes.")
@click.pass_context
def lemons(
    ctx: click.Context, window: str | None, as_of: datetime | None, as_json: bool, do_apply: bool,
    cluster: str | None,
) -> None:
    """Lemon-node candidates with their evidence; a dry run unless --apply."""
    from rsc_health.historian.db import (
        ALONE_LEMONS_APPLY,
        LEMONS_APPLY,
        HistorianError,
        run_alone,
    )
    from rsc_health.historian.lemons.apply import PartitionGuard, apply_verdicts
    from rsc_health.historian.lemons.features import OutageRules, lemon_features
    from rsc_health.historian.lemons.verdicts import DEFAULTS, LemonRules, lemon_verdicts
    from rsc_health.slurm import SlurmError

    section = {**DEFAULTS, **ctx.obj.config.section("lemon")}
    # Shadow mode ([actions] enabled = false) holds for lemons too: --apply records what it
    # would have drained and ticketed, and changes nothing.
    shadow = not ctx.obj.config.get("actions.enabled")
    window_days = parse_window(window) if window else float(section["window_days"])
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    as_of = as_of or now
    outages = OutageRules.of_site(ctx.obj.config)
    if outages.xid_catalog_problem and do_apply:
        # The site marked XIDs as its users' own so that their storms drain nothing: judged
        # by the packaged catalog instead, --apply would drain nodes for them. The dry run
        # lists the candidates with the warning; --apply waits for the file.
        raise click.ClickException(
            f"{outages.xid_catalog_problem}. Nothing drained: put the site's catalog on this "
            "host (root's, writable by no one else), or set [xid] catalog_override = \"\" in "
            "this host's config to judge by the packaged catalog")
    engine = _engine(ctx)
    try:
        features = lemon_features(
            engine,
            as_of,
            window_days,
            early_fail_minutes=float(section["early_fail_minutes"]),
            history_days=float(section["history_days"]),
            outages=outages,
            cluster=cluster,
        )
        rules = LemonRules.from_config(section)
        verdicts = lemon_verdicts(
            engine,
            features,
            as_of,
            rules,
            window_days=window_days,
            max_evidence=int(section["max_evidence"]),
            history_days=float(section["history_days"]),
        )
        actions = []
        slurm = _slurm(ctx)
        try:
            # Two --apply runs at once (the timer's and an operator's, other windows) would each
            # read the fleet before the other drained and each use the guard's whole budget:
            # one at a time, the second refused, and the guard reads Slurm under the lock.
            with (run_alone(engine, ALONE_LEMONS_APPLY, LEMONS_APPLY) if do_apply
                  else nullcontext()):
                guard = getattr(ctx.obj, "lemon_guard", None) or PartitionGuard.from_slurm(
                    slurm, ctx.obj.config, now
                )
                cfg = ctx.obj.config
                actions = apply_verdicts(engine, verdicts, slurm, guard, now=now,
                                         apply=do_apply, shadow=shadow,
                                         shadow_node=lambda n: not cfg.actions_enabled(n))
        except HistorianError as exc:
            raise click.ClickException(str(exc)) from exc
        except SlurmError as exc:
            if do_apply:
                raise click.ClickException(f"cannot drain: {exc}") from exc
            slurm = None  # a dry run still lists the candidates without Slurm
    finally:
        engine.dispose()
    by_node = {a.node: a for a in actions}
    if as_json:
        doc = {
            "as_of": as_of.isoformat(),
            "window_days": window_days,
            "nodes": len(features),
            "applied": do_apply and not shadow,
            "shadow": shadow,
            "warnings": [outages.xid_catalog_problem] if outages.xid_catalog_problem else [],
            "verdicts": [
                {**v.to_dict(), "action": by_node[v.node].to_dict() if v.node in by_node else None}
                for v in verdicts
            ],
        }
        click.echo(json.dumps(doc, indent=1, default=str))
        return
    click.echo(
        f"lemon candidates as of {as_of:%Y-%m-%d %H:%M} over {window_days:g} days: "
        f"{len(verdicts)} of {len(features)} nodes"
        + ("" if not do_apply else " (shadow mode: [actions] enabled = false; nothing drained, "
           "no ticket opened, would-have drains recorded)" if shadow else "")
        + ("" if do_apply else " (dry run)")
    )
    if outages.xid_catalog_problem:
        click.echo(f"  WARNING: {outages.xid_catalog_problem}")
    if slurm is None:
        click.echo("  (Slurm not consulted: node states and human drains unknown)")
    for v in verdicts:
        _echo_verdict(v, by_node.get(v.node))


def _echo_verdict(v, a) -> None:
    """One candidate: its summary, the action taken on it, the first rows of each evidence."""
    echo(f"{v.node}: {v.summary()}")
    if a is not None:
        echo(f"  action: {a.action}: {a.reason or a.why}")
    for kind, rows in v.evidence.items():
        if rows:
            echo(f"  {kind}: " + "; ".join(_evidence_line(kind, r) for r in rows[:5]))
        if len(rows) > 5:
            click.echo(f"    ... {len(rows) - 5} more")


def _evidence_line(kind: str, r: dict) -> str:
    if kind == "failed_jobs":
        cause = f" {r['cause']}" if r.get("cause") else ""
        return f"job {r['job_id']} {r['state']} {r['end']}{cause}"
    if kind == "xid_events":
        return f"{r['time']} {r['component']} {r['code']}"
    if kind == "out_of_service":
        return f"{r['start']} {r['state']} {r['reason']}"
    if kind == "tickets":
        return f"{r['opened']} ({r['source']}) {r['reason']}"
    return f"job {r['job_id']} {r['time']}"
