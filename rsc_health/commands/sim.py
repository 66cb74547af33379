"""`healthctl sim`: simulate a fleet's history into the files the historian ingests."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click


@click.command()
@click.option("--nodes", type=click.IntRange(min=1), help="Nodes in the fleet ([sim] nodes).")
@click.option("--days", type=click.FloatRange(min=0, min_open=True),
              help="Days of history ([sim] days).")
@click.option("--seed", type=int, help="Random seed ([sim] seed).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for sacct.txt, events.txt, checks.jsonl, exclusions.jsonl, "
                   "tickets.csv and truth.json.")
@click.option("--lemon-share", type=click.FloatRange(0, 1),
              help="Share of lemon nodes ([sim] lemon_share).")
@click.option("--rf", type=click.FloatRange(min=0),
              help="Node failures per 1000 node-days ([sim] rf_per_1000_node_days).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--progress/--no-progress", default=None,
              help="Show progress on stderr (default: when stderr is a terminal).")
@click.pass_obj
def sim(obj, nodes, days, seed, out_dir, lemon_share, rf, as_json, progress):
    """Simulate NODES x 8 GPUs for DAYS: jobs, failures, lemons, in the real formats."""
    import sys

    from rsc_health.sim import SimConfig, simulate

    try:
        cfg = SimConfig.from_config(
            obj.config, nodes=nodes, days=days, seed=seed,
            lemon_share=lemon_share, rf_per_1000_node_days=rf,
        )
    except (TypeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    show = sys.stderr.isatty() if progress is None else progress
    from rsc_health.commands.progress import steps

    with steps(show, log_done=False) as step:
        result = simulate(cfg, out_dir, progress=step)
    summary = {
        "out": str(result.out_dir), "nodes": cfg.nodes, "days": cfg.days, "seed": cfg.seed,
        "jobs": result.jobs, "sacct_rows": result.instances, "failures": result.failures,
        "lemons": len(result.lemons), "rf_true_per_1000_node_days": round(result.rf_true * 1000, 3),
        "wall_s": result.wall_s,
    }
    if as_json:
        click.echo(json.dumps({**summary, "config": asdict(cfg)}, indent=1))
        return
    click.echo(
        f"simulated {cfg.nodes} nodes x {cfg.days:g} days (seed {cfg.seed}) "
        f"in {result.wall_s:.1f} s: "
        f"{result.jobs} jobs ({result.instances} sacct rows), {result.failures} node failures "
        f"(r_f {result.rf_true * 1000:.2f}/1000 node-days), {len(result.lemons)} lemon nodes"
    )
    for name, path in result.files.items():
        click.echo(f"  {name:<17} {path}")
