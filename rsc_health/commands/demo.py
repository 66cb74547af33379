"""`healthctl demo`: README command one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click


@click.command()
@click.option("--out", "out_dir", default="demo-out", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the simulated fleet, the SQLite historian and the report.")
@click.option("--nodes", type=int, default=None, help="Fleet size (default: [sim] nodes, 256).")
@click.option("--days", type=float, default=None, help="Days simulated (default: [sim] days, 90).")
@click.option("--seed", type=int, default=None, help="Simulator seed (default: [sim] seed).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def demo(ctx: click.Context, out_dir: Path, nodes: int | None, days: float | None,
         seed: int | None, as_json: bool) -> None:
    """Simulate a fleet, ingest it into SQLite, find the lemons and write the nightly report.

    Needs no GPUs and no Slurm: the fleet simulator writes sacct, sacctmgr and health-check
    output in their real formats, and everything downstream is the production code path.
    The database is --db / $RSC_HEALTH_DB when given, else a fresh OUT/historian.db.
    """
    from rsc_health.commands.progress import steps
    from rsc_health.demo import run_demo

    explicit_db = ctx.obj.db_url or os.environ.get("RSC_HEALTH_DB")
    show = not as_json and click.get_text_stream("stderr").isatty()
    with steps(show) as step:
        result = run_demo(ctx.obj.config, out_dir, nodes=nodes, days=days, seed=seed,
                          database_url=explicit_db, progress=step)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        click.echo(result.summary())
