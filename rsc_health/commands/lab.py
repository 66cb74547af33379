"""The lab's commands: `healthctl sim`, `healthctl demo` and `healthctl tune-lemons`.

The lab (the fleet simulator, the demo's data, the lemon tuning: the package rsc_health.sim) is
apart from the product: no product module imports it (tests/unit/test_lab_apart.py). These
three commands are explicitly lab commands (rsc_health.cli.LAB_COMMANDS): this is the one
module outside the lab allowed to import it, and only inside the commands' bodies, so that
loading it for `healthctl --help` loads no lab code.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import click

from rsc_health.commands import FiniteFloat
from rsc_health.commands.lemons import parse_window


@click.command()
@click.option("--nodes", type=click.IntRange(min=1), help="Nodes in the fleet ([sim] nodes).")
@click.option("--days", type=FiniteFloat(min=0, min_open=True),
              help="Days of history ([sim] days).")
@click.option("--seed", type=int, help="Random seed ([sim] seed).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for sacct.txt, events.txt, checks.jsonl, exclusions.jsonl, "
                   "tickets.csv and truth.json.")
@click.option("--lemon-share", type=FiniteFloat(0, 1),
              help="Share of lemon nodes ([sim] lemon_share).")
@click.option("--rf", type=FiniteFloat(min=0),
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


@click.command()
@click.option("--out", "out_dir", default="demo-out", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the simulated fleet, the SQLite historian and the report.")
@click.option("--nodes", type=int, default=None, help="Fleet size (default: [sim] nodes, 256).")
@click.option("--days", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Days simulated (default: [sim] days, 90).")
@click.option("--seed", type=int, default=None, help="Simulator seed (default: [sim] seed).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def demo(ctx: click.Context, out_dir: Path, nodes: int | None, days: float | None,
         seed: int | None, as_json: bool) -> None:
    """Simulate a fleet, ingest it into SQLite, find the lemons and write the nightly report;
    then a fail-slow suspect found, qualified and confirmed (OUT/failslow).

    Needs no GPUs and no Slurm: the fleet simulator writes sacct, sacctmgr and health-check
    output in their real formats, and everything downstream is the production code path.
    The database is --db / $RSC_HEALTH_DB when given, else a fresh OUT/historian.db.
    """
    from rsc_health.commands.progress import steps
    from rsc_health.sim.demo import run_demo

    explicit_db = ctx.obj.db_url or os.environ.get("RSC_HEALTH_DB")
    show = not as_json and sys.stderr.isatty()
    with steps(show) as step:
        result = run_demo(ctx.obj.config, out_dir, nodes=nodes, days=days, seed=seed,
                          database_url=explicit_db, progress=step)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        click.echo(result.summary())


def _seeds(text: str) -> list[int]:
    """`1-10,101,103` -> [1, ..., 10, 101, 103]."""
    out: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",")):
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: expected seeds like 1-10,42") from exc
    return out


@click.command("tune-lemons")
@click.option("--sim-seeds", default="1-10", show_default=True, help="Tuning seeds.")
@click.option(
    "--holdout-seeds",
    default="11-15,101-110",
    show_default=True,
    help="Seeds the accuracy is reported on (never tuned on).",
)
@click.option("--nodes", default=256, show_default=True, type=int)
@click.option("--days", default=90.0, show_default=True, type=FiniteFloat())
@click.option("--window", default="28d", show_default=True, metavar="SPAN")
@click.option(
    "--target-precision",
    default=0.95,
    show_default=True,
    type=FiniteFloat(),
    help="Tuning precision floor; above the 0.9 goal so held-out precision keeps a margin.",
)
@click.option("--top", default=20, show_default=True, type=int, help="Grid rows printed.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the simulated fleets here (default: a temp dir).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def tune_lemons(
    ctx: click.Context,
    sim_seeds: str,
    holdout_seeds: str,
    nodes: int,
    days: float,
    window: str,
    target_precision: float,
    top: int,
    workdir: str | None,
    as_json: bool,
) -> None:
    """Choose [lemon] thresholds on simulated fleets; report accuracy on held-out seeds."""
    from rsc_health.historian.lemons.verdicts import DEFAULTS, LemonRules
    from rsc_health.sim.tune import (
        DEFAULT_GRID,
        choose,
        labelled_from_sim,
        rules_for,
        run_grid,
        score,
        tuning_base,
    )

    window_days = parse_window(window)
    configured = LemonRules.from_config({**DEFAULTS, **ctx.obj.config.section("lemon")})
    base = tuning_base(configured)
    history_days = float({**DEFAULTS, **ctx.obj.config.section("lemon")}["history_days"])

    def say(message: str) -> None:
        click.echo(message, err=True)

    def fleets(seeds: list[int], where: Path):
        return [
            labelled_from_sim(
                s,
                where,
                nodes=nodes,
                days=days,
                window_days=window_days,
                history_days=history_days,
                progress=say,
            )
            for s in seeds
        ]

    with tempfile.TemporaryDirectory(prefix="tune-lemons-") as tmp:
        where = Path(workdir or tmp)
        tuning = fleets(_seeds(sim_seeds), where)
        say(f"scoring {math.prod(len(v) for v in DEFAULT_GRID.values())} grid points")
        results = run_grid(tuning, base, DEFAULT_GRID)
        best = choose(results, list(DEFAULT_GRID), target_precision)
        chosen = {k: best[k] for k in DEFAULT_GRID}
        held = score(fleets(_seeds(holdout_seeds), where), rules_for(base, chosen))
    shown = results.sort_values(["f1", "precision"], ascending=False).head(top)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "tuning_seeds": _seeds(sim_seeds),
                    "holdout_seeds": _seeds(holdout_seeds),
                    "grid": DEFAULT_GRID,
                    "chosen": {k: _plain(v) for k, v in chosen.items()},
                    "tuning": {
                        k: _plain(best[k])
                        for k in ("tp", "fp", "fn", "tn", "precision", "recall", "fpr", "f1")
                    },
                    "holdout": held.to_dict(),
                    "top": json.loads(shown.to_json(orient="records")),
                },
                indent=1,
            )
        )
        return
    click.echo(f"grid: {len(results)} points on tuning seeds {sim_seeds} (pooled); best by F1:")
    click.echo(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    click.echo(
        "\nchosen [lemon] defaults (precision >= "
        f"{target_precision:g}, then recall, then fewest FP, then most conservative):"
    )
    for k, v in chosen.items():
        click.echo(f"{k} = {json.dumps(_plain(v))}")
    click.echo(
        f"tuning seeds:   precision {best['precision']:.3f} recall {best['recall']:.3f} "
        f"FPR {best['fpr']:.4f} (tp {best['tp']} fp {best['fp']} fn {best['fn']})"
    )
    click.echo(
        f"held-out seeds {holdout_seeds}: precision {held.precision:.3f} recall "
        f"{held.recall:.3f} FPR {held.fpr:.4f} (tp {held.tp} fp {held.fp} fn {held.fn})"
    )


def _plain(v):
    if isinstance(v, tuple | list):
        return list(v)
    f = float(v)
    return int(f) if f == int(f) else f
