"""`healthctl drain|resume|status|sweep|prolog|epilog`: the operator's side of the Slurm actions.

All Slurm access goes through rsc_health.slurm; the node-path commands are the same mains the
thin scripts in prolog/, epilog/ and checks/ run.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import click

from rsc_health.hostlist import expand


def _slurm(ctx: click.Context):
    from rsc_health.slurm import from_config

    return from_config(ctx.obj.config)


def _spool_action(ctx: click.Context, action: str, node: str, reason: str) -> None:
    from rsc_health.actions import Action, spool_action
    from rsc_health.config import state_dir

    try:
        spool_action(state_dir(ctx.obj.config, ctx.obj.root), Action(action, node, reason))
    except OSError as exc:
        click.echo(f"warning: could not spool the action: {exc}", err=True)


def _fail(exc: Exception) -> None:
    raise click.ClickException(str(exc)) from exc


@click.command()
@click.argument("nodes")
@click.option("--reason", required=True, help="Why (free text; kept in Slurm's reason).")
@click.option("--code", default="manual", show_default=True, help="Short fault token.")
@click.pass_context
def drain(ctx: click.Context, nodes: str, reason: str, code: str) -> None:
    """Drain NODES (a hostlist) with an rsc_health:manual reason; never auto-resumed."""
    from rsc_health.policy import MAX_REASON_LEN, sanitize
    from rsc_health.slurm import SlurmError

    text = f"rsc_health:manual:{sanitize(code).replace(':', '_')}:{sanitize(reason)}"
    text = text[:MAX_REASON_LEN]
    slurm = _slurm(ctx)
    for node in expand(nodes):
        try:
            slurm.drain(node, text)
        except SlurmError as exc:
            _fail(exc)
        _spool_action(ctx, "drain_after_job", node, text)
        click.echo(f"{node}: drained ({text})")


@click.command()
@click.argument("nodes")
@click.option("--force", is_flag=True, help="Also resume a drain that rsc-health did not set.")
@click.pass_context
def resume(ctx: click.Context, nodes: str, force: bool) -> None:
    """Resume NODES after repair. A person's or Slurm's drain needs --force."""
    from rsc_health.policy import is_ours
    from rsc_health.slurm import SlurmError

    slurm = _slurm(ctx)
    refused = 0
    for node in expand(nodes):
        try:
            info = slurm.node(node)
            if info.drain_set and not is_ours(info.reason) and not force:
                click.echo(f"{node}: not ours ({info.reason!r}); use --force to resume", err=True)
                refused += 1
                continue
            slurm.resume(node)
        except SlurmError as exc:
            _fail(exc)
        _spool_action(ctx, "resume", node, info.reason)
        click.echo(f"{node}: resumed (was: {info.state} {info.reason})")
    if refused:
        sys.exit(1)


def gather_status(slurm, cfg, now) -> dict:
    from rsc_health.actions import guard_states
    from rsc_health.policy import parse_reason

    nodes = slurm.nodes()
    a = cfg.section("actions")
    window = timedelta(minutes=float(a.get("guard_window_min", 15)))
    drained = []
    for n in nodes:
        if not (n.drain_set or n.down):
            continue
        parsed = parse_reason(n.reason)
        age = (now - n.reason_time).total_seconds() if n.reason_time else None
        drained.append({
            "node": n.name, "state": n.state, "reason": n.reason, "ours": parsed is not None,
            "mode": parsed["mode"] if parsed else None, "code": parsed["code"] if parsed else None,
            "since": n.reason_time.isoformat() if n.reason_time else None, "age_s": age,
        })
    partitions = sorted({p for n in nodes for p in n.partitions})
    guards = [
        {"partition": g.partition, "nodes": g.total, "drained_recently": g.recent_ours,
         "limit": g.limit, "tripped": g.tripped}
        for g in guard_states(nodes, partitions, max_share=float(a.get("guard_max_share", 0.1)),
                              window=window, now=now)
    ]
    return {"time": now.isoformat(), "drained": drained, "guard": guards,
            "guard_window_min": window.total_seconds() / 60}


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Drained nodes by reason and age, and the mass-drain guard per partition."""
    from rsc_health.model import utcnow
    from rsc_health.slurm import SlurmError

    try:
        data = gather_status(_slurm(ctx), ctx.obj.config, utcnow())
    except SlurmError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    groups: dict[str, list[dict]] = {}
    for d in data["drained"]:
        key = f"rsc_health {d['mode']}:{d['code']}" if d["ours"] else "others (not ours)"
        groups.setdefault(key, []).append(d)
    if not groups:
        click.echo("no drained or down nodes")
    for key in sorted(groups):
        click.echo(f"{key}: {len(groups[key])}")
        for d in sorted(groups[key], key=lambda d: -(d["age_s"] or 0)):
            click.echo(f"  {d['node']:<16} {_age(d['age_s']):>7}  {d['state']:<18} {d['reason']}")
    for g in data["guard"]:
        flag = "TRIPPED" if g["tripped"] else "ok"
        click.echo(f"guard {g['partition']}: {flag} ({len(g['drained_recently'])}/{g['nodes']} "
                   f"drained by rsc_health in {data['guard_window_min']:g} min, "
                   f"limit {g['limit']})")


def _node_main(ctx: click.Context, name: str) -> None:
    from rsc_health import nodepath

    # The node path reads its settings from the environment, as under slurmd.
    if ctx.obj.config_path:
        os.environ["RSC_HEALTH_CONFIG"] = ctx.obj.config_path
    if ctx.obj.root_arg:
        os.environ["RSC_HEALTH_ROOT"] = ctx.obj.root_arg
    sys.exit(nodepath.MAINS[name]())


@click.command()
@click.pass_context
def sweep(ctx: click.Context) -> None:
    """Run one periodic sweep on this node (what HealthCheckProgram runs)."""
    _node_main(ctx, "sweep")


@click.command()
@click.pass_context
def prolog(ctx: click.Context) -> None:
    """Run the job prolog on this node (exit 1 on a drain verdict)."""
    _node_main(ctx, "prolog")


@click.command()
@click.pass_context
def epilog(ctx: click.Context) -> None:
    """Run the job epilog on this node."""
    _node_main(ctx, "epilog")
