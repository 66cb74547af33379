"""`healthctl report`: the nightly lemon report (HTML page + PNGs, summary.txt, report.json)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import click


@click.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for report.html, its PNGs, summary.txt and report.json.")
@click.option("--as-of", "as_of", type=click.DateTime(), default=None,
              help="Report as of this UTC date/time (default: now).")
@click.option("--previous", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="report.json to diff lemon candidates against (default: the one in --out).")
@click.option("--embed/--no-embed", default=None,
              help="Inline the PNGs as base64 (one file for mail). Default: [report] embed.")
@click.option("--quiet", "-q", is_flag=True, help="No progress; print only the summary.")
@click.pass_context
def report(ctx: click.Context, out_dir: Path, as_of: datetime | None, previous: Path | None,
           embed: bool | None, quiet: bool) -> None:
    """Write the nightly lemon report into DIR and print its plain-text summary.

    \b
    Example (nightly, from cron):
      healthctl report --out /var/lib/rsc_health/report
    """
    from rsc_health.historian import db as hdb
    from rsc_health.report.gather import GatherOptions, gather
    from rsc_health.report.links import Links
    from rsc_health.report.render import write_report

    cfg = ctx.obj.config
    section = cfg.section("report")
    moment = as_of or datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    if embed is None:
        embed = bool(cfg.get("report.embed"))
    try:
        engine = hdb.connect(ctx.obj.database_url, create_missing=False,
                             statement_timeout_s=ctx.obj.statement_timeout_s)
    except hdb.HistorianError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        try:
            options = GatherOptions.from_config(
                section, cfg.section("lemon"), cfg.section("ettr"), cfg.section("metrics"),
                cfg.section("historian"), cfg.section("xid"),
                cfg.section("actions"))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        from dataclasses import replace

        from rsc_health.report.render import load_previous

        # Last night's report.json (the one in --out unless --previous names another): the
        # pull list's days listed carry on from it instead of re-judging a week of lemons.
        options = replace(options, previous=load_previous(previous, follow=True) if previous
                          else load_previous(out_dir / "report.json"))
        show = not quiet and sys.stderr.isatty()
        from rsc_health.commands.progress import steps
        from rsc_health.durable import ready_dir

        try:
            ready_dir(out_dir)  # a directory refused is said before the gathering, not after
        except OSError as exc:
            raise click.ClickException(f"cannot write the report: {exc}") from exc
        with steps(show) as step:
            data = gather(engine, moment, options, progress=step)
            try:
                written = write_report(data, out_dir, previous=previous, embed=embed,
                                       progress=step, links=Links.from_config(section))
            except OSError as exc:
                raise click.ClickException(f"cannot write the report: {exc}") from exc
    finally:
        engine.dispose()
    click.echo(written.summary.read_text(), nl=False)
    if not quiet:
        click.echo(f"report: {written.html}", err=True)
    for section_name, note in sorted(data.notes.items()):
        if not quiet:
            click.echo(f"note: {section_name}: {note}", err=True)
    if data.failed:
        # Everything else was written; the exit status is what a timer shows of the night.
        failed = ", ".join(dict.fromkeys(data.failed))
        click.echo(f"report: written, but these section(s) failed: {failed} "
                   "(their notes say why)", err=True)
        ctx.exit(1)
