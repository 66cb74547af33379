"""`healthctl metrics export`: the historian's fleet view as Prometheus metrics."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from rsc_health.commands import FiniteFloat


@click.group()
def metrics() -> None:
    """Prometheus metrics from the historian."""


@metrics.command("export")
@click.option("--out", "out", type=click.Path(dir_okay=False),
              help="Write here (atomically; e.g. node_exporter's textfile directory/"
                   "rsc_health_fleet.prom); default stdout.")
@click.option("--window-days", default=30.0, show_default=True,
              type=FiniteFloat(min=0, min_open=True), help="Window of r_f and MTTF.")
@click.option("--statement-timeout", "timeout_s", type=FiniteFloat(min=1), default=120.0,
              show_default=True,
              help="Seconds any one query may take (at most [historian] statement_timeout_s): "
                   "a held or frozen historian ends the export with rsc_health_historian_up 0 "
                   "in the file instead of the last good numbers for a quarter hour.")
@click.pass_context
def export(ctx: click.Context, out: str | None, window_days: float, timeout_s: float) -> None:
    """r_f with its interval, MTTF by size, lemon candidates, stale and broken nodes, open
    findings, guard trips and data age, in Prometheus' text format."""
    try:
        from sqlalchemy.exc import SQLAlchemyError

        from rsc_health.exporter.historian import build, exposition, unreachable
        from rsc_health.historian.db import HistorianError, connect, first_line
    except ImportError as exc:
        raise click.ClickException(
            f"the historian extra is not installed here ({exc.name}): "
            "pip install 'rsc-health[historian]'") from exc
    now = datetime.now(UTC).replace(tzinfo=None)
    failed: str | None = None
    try:
        configured = ctx.obj.statement_timeout_s  # 0: none set for the other commands
        engine = connect(ctx.obj.database_url, create_missing=False,  # a reader
                         statement_timeout_s=min(timeout_s, configured)
                         if configured > 0 else timeout_s)
        try:
            text = exposition(build(engine, ctx.obj.config, now, window_days=window_days))
        finally:
            engine.dispose()
    except (HistorianError, SQLAlchemyError) as exc:
        # Gone, locked past the busy timeout, frozen past the statement timeout, or not a
        # historian: the file says so (rsc_health_historian_up 0) instead of keeping the last
        # good numbers on display, and the command ends with one line.
        failed = first_line(exc)
        text = exposition(unreachable())
    if not out:
        click.echo(text.decode(), nl=False)
    else:
        from rsc_health.durable import write_atomic

        path = Path(out)
        try:
            # A textfile collector directory is often shared: nothing planted there is
            # followed, and one others may write without the sticky bit is refused.
            write_atomic(path, text, sync_dir=False)
        except OSError as exc:
            raise click.ClickException(f"cannot write {path}: {exc}") from exc
        if failed is None:
            click.echo(f"wrote {path}", err=True)
    if failed is not None:
        raise click.ClickException(f"historian unreachable, exported "
                                   f"rsc_health_historian_up 0: {failed}")
