"""`healthctl db | ingest | ticket | spool | attribute`: the historian's write side."""

from __future__ import annotations

import importlib
import io
import json
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rsc_health.commands import NAME_FILTER
from rsc_health.commands import historian_engine as _engine
from rsc_health.compat import UTC
from rsc_health.config import state_dir
from rsc_health.historian import db as hdb
from rsc_health.historian.ingest import IngestReport
from rsc_health.terminal import echo

if TYPE_CHECKING:
    from sqlalchemy import Engine

MAX_BAD_SHOWN = 20


@contextmanager
def _historian(ctx: click.Context, *errors: type[Exception],
               create_missing: bool = False) -> Iterator[Engine]:
    """The historian for one command: its own errors (`errors`) and the database's become a
    one-line click error, and the engine is closed however the command ends. Only an ingest
    creates a historian that is not there yet (`create_missing`, db.connect)."""
    engine = _engine(ctx, create_missing=create_missing)
    try:
        yield engine
    except (hdb.HistorianError, *errors) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        engine.dispose()


def _print_report(report: IngestReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.as_dict()))
        return
    click.echo(report.summary())
    for bad in report.bad[:MAX_BAD_SHOWN]:
        echo(f"  skipped {bad}", err=True)
    more = max(0, len(report.bad) - MAX_BAD_SHOWN) + report.bad_not_listed
    if more:
        click.echo(f"  ... and {more} more", err=True)


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


# -- db ---------------------------------------------------------------------------------------


@click.group()
def db() -> None:
    """Create, inspect and migrate the historian database."""


@db.command()
@click.pass_context
def upgrade(ctx: click.Context) -> None:
    """Create the schema, or migrate an existing database to this release (rows are kept)."""
    url = ctx.obj.database_url
    try:
        before, after, applied = hdb.upgrade(url)
    except hdb.HistorianError as exc:
        raise click.ClickException(str(exc)) from exc
    if before is None:
        click.echo(f"created {hdb.safe_url(url)} at schema version {after}")
    elif applied:
        click.echo(f"migrated {hdb.safe_url(url)} from version {before} to {after}")
    else:
        click.echo(f"{hdb.safe_url(url)} is at schema version {after}: nothing to do")


@db.command("prune")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@json_option
@click.pass_context
def db_prune(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Delete what is past its [historian] retention (closed check intervals, actions,
    exclusions; rollups and jobs only when their retention is set)."""
    from rsc_health import model
    from rsc_health.historian.retention import Retention, prune, prune_moment

    retention = Retention.from_config(ctx.obj.config)
    with _historian(ctx) as engine:
        now, note = prune_moment(engine, model.utcnow().replace(tzinfo=None))
        counts = prune(engine, now, retention, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "retention_days": retention.days,
                               "as_of": now.isoformat(), "note": note, "rows": counts},
                              indent=2))
        return
    if note:
        click.echo(f"note: {note}", err=True)
    verb = "would delete" if dry_run else "deleted"
    parts = ", ".join(f"{n} {t}" for t, n in counts.items()) or "nothing (retention off)"
    click.echo(f"prune ({retention.days} days): {verb} {parts}")


@db.command("status")
@json_option
@click.pass_context
def db_status(ctx: click.Context, as_json: bool) -> None:
    """Schema version and row counts."""
    url = ctx.obj.database_url
    gone = hdb.missing_file(url)  # said, not created: opening it would make an empty one
    version, counts = None, {}
    if gone is None:
        engine = hdb.engine_for(url)
        try:
            version = hdb.current_version(engine)
            counts = hdb.table_counts(engine) if version is not None else {}
        except Exception as exc:  # noqa: BLE001 -- any driver error means "cannot read it"
            raise click.ClickException(f"{hdb.safe_url(url)}: {exc}") from exc
        finally:
            engine.dispose()
    from rsc_health.historian.schema import SCHEMA_VERSION

    state = (
        f"absent: no file {gone}"
        if gone is not None
        else "empty"
        if version is None
        else "current"
        if version == SCHEMA_VERSION
        else "needs `healthctl db upgrade`"
        if version < SCHEMA_VERSION
        else "newer than this release"
    )
    if as_json:
        out = {"url": hdb.safe_url(url), "version": version, "state": state, "rows": counts}
        click.echo(json.dumps(out))
        return
    click.echo(f"{hdb.safe_url(url)}: schema version {version} ({state})")
    for table, n in counts.items():
        click.echo(f"  {table:<16} {n:>12,}")


# -- ingest -----------------------------------------------------------------------------------


@click.group()
def ingest() -> None:
    """Load Slurm accounting, node events and health results into the historian."""


def _load(ctx: click.Context, path: str, as_json: bool, from_lines: Callable,
          from_file: Callable, *errors: type[Exception], csv: bool = False,
          **options: Any) -> None:
    """One source's `--file PATH` (or `-`: standard input) through its loader, and the load's
    report printed. `csv`: standard input's line endings untranslated, as the csv module
    wants (newline=""). `options` go to the loader (tz)."""
    with _historian(ctx, *errors, create_missing=True) as engine:
        if path == "-":
            report = from_lines(engine, _stdin_text(newline="" if csv else None), **options)
        else:
            report = from_file(engine, path, **options)
    _print_report(report, as_json)


def _stdin_text(newline: str | None = None) -> io.TextIOWrapper:
    """Standard input as text for `--file -`: UTF-8, bytes that are not replaced (a reason or
    a node name is a person's text); a CSV's (newline "") leading byte-order mark dropped."""
    from rsc_health.historian.ingest import CSV_ENCODING

    return io.TextIOWrapper(sys.stdin.buffer, errors="replace", newline=newline,
                            encoding=CSV_ENCODING if newline == "" else "utf-8")


def _file_or_none(_ctx, _param, value):
    """A regular file, or '-' for stdin. A FIFO with no writer would block open() for ever
    (the next timer run stacks up behind it), and a directory or device is never an export."""
    if value is None or value == "-":
        return value
    try:
        mode = Path(value).stat().st_mode
    except OSError as exc:
        raise click.BadParameter(f"{value}: {exc.strerror or 'cannot stat'}") from exc
    if not stat.S_ISREG(mode):
        raise click.BadParameter(f"{value}: not a regular file")
    return value


def _accounting(ctx: click.Context):
    """sacct/sacctmgr through the one Slurm door ([slurm] bin_dir, [historian] sacct_timeout_s)."""
    from rsc_health.slurm import from_config

    cfg = ctx.obj.config
    return from_config(cfg).accounting(float(cfg.get("historian.sacct_timeout_s")))


@ingest.command("sacct")
@click.option("--file", "path", callback=_file_or_none, help="sacct --parsable2 output ('-').")
@click.option("--since", help="Start (sacct -S) instead of the stored cursor.")
@json_option
@click.pass_context
def ingest_sacct(ctx: click.Context, path: str | None, since: str | None, as_json: bool) -> None:
    """Job instances from `sacct -a -X -D --parsable2` (run incrementally, or --file)."""
    from rsc_health.historian.ingest import sacct

    cfg = ctx.obj.config
    with _historian(ctx, sacct.SacctError, create_missing=True) as engine:
        gpn = int(cfg.get("historian.gpus_per_node"))
        if path is not None:
            source = sys.stdin if path == "-" else Path(path)
            report = sacct.ingest_text(engine, source, gpus_per_node=gpn,
                                       cluster=str(cfg.get("historian.cluster")))
        else:
            report = sacct.ingest_incremental(
                engine,
                since=since,
                gpus_per_node=gpn,
                acct=_accounting(ctx),
                default_start=str(cfg.get("historian.first_start")),
                overlap_s=int(cfg.get("historian.sacct_overlap_s")),
                form=str(cfg.get("historian.sacct_format")),
                cluster=str(cfg.get("historian.cluster")),
            )
    _print_report(report, as_json)


@ingest.command("events")
@click.option("--file", "path", callback=_file_or_none, help="`sacctmgr -P show event` output.")
@click.option("--since", help="Start= for sacctmgr (default [historian] first_start).")
@click.option("--tz", help="With --file: the IANA zone its times are wall-clock times of "
              "(default: UTC; the sacctmgr run without --file prints UTC).")
@json_option
@click.pass_context
def ingest_events(ctx: click.Context, path: str | None, since: str | None, tz: str | None,
                  as_json: bool) -> None:
    """Node down/drain periods from `sacctmgr -P show event` (or --file)."""
    from rsc_health.historian.ingest import events
    from rsc_health.historian.retention import Retention

    if tz and path is None:
        # accounting.py runs sacctmgr with TZ=UTC: its times are UTC already, and reading
        # them as another zone's would store every outage hours off (a second copy of each)
        raise click.UsageError("--tz is for a --file made elsewhere: the sacctmgr this runs "
                               "prints UTC (TZ=UTC)")
    cfg = ctx.obj.config
    cluster = str(cfg.get("historian.cluster"))
    with _historian(ctx, events.EventsError, create_missing=True) as engine:
        if path == "-":  # a reason is a person's text: bytes that are not UTF-8 are replaced
            stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
            report = events.ingest_lines(engine, stdin, cluster=cluster, tz=tz)
        elif path is not None:
            report = events.ingest_file(engine, path, cluster=cluster, tz=tz)
        else:
            start = since or Retention.from_config(ctx.obj.config).events_start(
                str(cfg.get("historian.first_start")),
                datetime.now(UTC).replace(tzinfo=None))
            text = events.run_sacctmgr(start, _accounting(ctx))
            report = events.ingest_text(engine, text, cluster=cluster, tz=tz)
    _print_report(report, as_json)


@ingest.command("telemetry")
@json_option
@click.pass_context
def ingest_telemetry(ctx: click.Context, as_json: bool) -> None:
    """Roll the nodes' telemetry samples up per multi-node job and per node-day outside jobs
    (run after `ingest sacct`: the jobs must be known)."""
    import json

    from rsc_health.historian import telemetry

    with _historian(ctx, create_missing=True) as engine:
        report = telemetry.rollup(engine, datetime.now(UTC), ctx.obj.config)
    if as_json:
        click.echo(json.dumps(report.__dict__))
    else:
        click.echo(report.summary())


@ingest.command("reservations")
@click.option("--file", "path", callback=_file_or_none,
              help="`sacctmgr -P show reservation` output ('-').")
@click.option("--since", help="Start= for sacctmgr (default [historian] first_start).")
@json_option
@click.pass_context
def ingest_reservations(
    ctx: click.Context, path: str | None, since: str | None, as_json: bool
) -> None:
    """Slurm reservations (MAINT ones mark planned maintenance for the lemon features)."""
    from rsc_health.historian.ingest import reservations

    cfg = ctx.obj.config
    cluster = str(cfg.get("historian.cluster"))
    with _historian(ctx, reservations.ReservationsError, create_missing=True) as engine:
        if path == "-":
            stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
            report = reservations.ingest_lines(engine, stdin, cluster=cluster)
        elif path is not None:
            report = reservations.ingest_file(engine, path, cluster=cluster)
        else:
            start = since or str(cfg.get("historian.first_start"))
            text = reservations.run_sacctmgr(start, _accounting(ctx))
            report = reservations.ingest_text(engine, text, cluster=cluster)
    _print_report(report, as_json)


# The sources read from a file (or `-`, standard input) by one loader each: command name, the
# --file help, the command's help, and the loader in rsc_health.historian.ingest.
def _file_source(group: click.Group, name: str, file_help: str, doc: str, module: str,
                 from_lines: str, from_file: str, error: str | None = None,
                 csv: bool = False, tz: bool = False) -> None:
    """`tz`: the source holds wall-clock times; the command takes --tz (an IANA zone) for
    those without an offset, and the report says how they were read."""

    @click.pass_context
    def load(ctx: click.Context, path: str, as_json: bool, tz: str | None = None) -> None:
        loader = importlib.import_module(f"rsc_health.historian.ingest.{module}")
        errors = (getattr(loader, error),) if error else ()
        options = {"tz": _zone(tz)} if tz_option else {}
        _load(ctx, path, as_json, getattr(loader, from_lines), getattr(loader, from_file),
              *errors, csv=csv, **options)

    tz_option = tz
    command = json_option(load)
    if tz:
        command = click.option("--tz", help="The IANA zone times without an offset are "
                               "wall-clock times of (default: UTC).")(command)
    command = click.option("--file", "path", required=True, callback=_file_or_none,
                           help=file_help)(command)
    group.command(name, help=doc)(command)


def _zone(tz: str | None):
    """--tz as a zone (None: UTC), or a usage error naming it."""
    from rsc_health.historian.ingest.events import EventsError, zone

    try:
        return zone(tz)
    except EventsError as exc:
        raise click.BadParameter(str(exc), param_hint="--tz") from exc


_file_source(ingest, "checks", "JSON Lines ('-').",
             "Health results from JSON Lines (time, node, check, status, severity, ...).",
             "checks", "ingest_lines", "ingest_file")
_file_source(ingest, "exclusions", "JSON Lines ('-').",
             "Nodes jobs excluded, from JSON Lines (job_id, node, time): the simulator's export.",
             "exclusions", "ingest_lines", "ingest_file")
_file_source(ingest, "inventory", "CSV with node,cluster,partition,from,to[,gpu_model] ('-').",
             "The fleet the historian had: each node's in-service intervals (to empty: in "
             "service), with its cluster and partition. Node-days and the lemons' peer groups "
             "come from it.",
             "inventory", "import_lines", "import_csv", "InventoryError", csv=True, tz=True)
_file_source(ingest, "gpus", "CSV with serial,node,slot,from,to ('-').",
             "Each GPU's intervals in a node by serial (or UUID): failures follow the GPU when "
             "it moves (`healthctl gpus`), and the node it left is not blamed for them.",
             "inventory", "import_gpu_lines", "import_gpus_csv", "InventoryError", csv=True,
             tz=True)


@ingest.command("steps")
@click.argument("path")
@json_option
@click.pass_context
def ingest_steps(ctx: click.Context, path: str, as_json: bool) -> None:
    """Per-rank step times jobs wrote: a JSON-lines drop file, NVRx straggler reports, or a
    directory of them ('-': stdin). Fail-slow evidence (docs/failslow.md): it can make a node
    a suspect, never drain it."""
    from rsc_health.historian.ingest import steps

    limits = steps.Limits.from_config(ctx.obj.config)
    with _historian(ctx, steps.StepsError, create_missing=True) as engine:
        if path == "-":
            report = steps.ingest_stream(engine, sys.stdin.buffer, limits)
        else:
            report = steps.ingest_path(engine, path, limits)
    _print_report(report, as_json)


# -- tickets ----------------------------------------------------------------------------------


@click.group()
def ticket() -> None:
    """Repair tickets: when a node went to (and came back from) hands-on repair."""


@ticket.command("open")
@click.argument("node")
@click.option("--reason", required=True, help="What is wrong.")
@click.pass_context
def ticket_open(ctx: click.Context, node: str, reason: str) -> None:
    """Open a repair ticket for NODE."""
    from rsc_health.historian.ingest import tickets

    with _historian(ctx) as engine:
        click.echo(f"ticket {tickets.open_ticket(engine, node, reason)} opened for {node}")


@ticket.command("close")
@click.argument("ticket_id", type=int)
@click.pass_context
def ticket_close(ctx: click.Context, ticket_id: int) -> None:
    """Close ticket TICKET_ID."""
    from rsc_health.historian.ingest import tickets

    with _historian(ctx, tickets.TicketError) as engine:
        closed = tickets.close_ticket(engine, ticket_id)
    click.echo(f"ticket {closed.id} for {closed.node} closed")


@ticket.command("reopen")
@click.argument("ticket_id", type=int)
@click.pass_context
def ticket_reopen(ctx: click.Context, ticket_id: int) -> None:
    """Open closed ticket TICKET_ID again (an import never reopens one)."""
    from rsc_health.historian.ingest import tickets

    with _historian(ctx, tickets.TicketError) as engine:
        row = tickets.reopen_ticket(engine, ticket_id)
    click.echo(f"ticket {row.id} for {row.node} reopened")


@ticket.command("list")
@click.option("--open", "open_only", is_flag=True, help="Only tickets still open.")
@click.option("--node", type=NAME_FILTER, help="Only this node.")
@json_option
@click.pass_context
def ticket_list(ctx: click.Context, open_only: bool, node: str | None, as_json: bool) -> None:
    """List tickets, oldest first."""
    from rsc_health.historian.ingest import tickets

    with _historian(ctx) as engine:
        rows = tickets.list_tickets(engine, open_only=open_only, node=node)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "id": t.id,
                        "node": t.node,
                        "opened": t.opened.isoformat(),
                        "closed": t.closed.isoformat() if t.closed else None,
                        "reason": t.reason,
                        "source": t.source,
                    }
                    for t in rows
                ]
            )
        )
        return
    for t in rows:
        closed = f"{t.closed:%Y-%m-%d %H:%M}" if t.closed else "open"
        echo(f"{t.id:>6}  {t.node:<20} {t.opened:%Y-%m-%d %H:%M}  {closed:<16}  {t.reason}")


_file_source(ticket, "import", "CSV export ('-').",
             "Import tickets from CSV with columns node,opened,closed,reason (an empty "
             "closed never reopens a ticket closed since: 'ticket reopen ID' does).",
             "tickets", "import_lines", "import_csv", "TicketError", csv=True, tz=True)


# -- spool ------------------------------------------------------------------------------------


@click.group()
def spool() -> None:
    """The node's local spool of results waiting for the database."""


@spool.command("flush")
@click.option("--dir", "directory", type=click.Path(file_okay=False), help="Spool directory.")
@click.pass_context
def spool_flush(ctx: click.Context, directory: str | None) -> None:
    """Deliver spooled results to the historian, exactly once; keep them if it is down.

    Streams the spool in chunks (bounded memory whatever its size), each chunk one
    transaction with a statement timeout; a progress bar when stdout is a terminal."""
    import sys

    from rsc_health import spool as spool_mod
    from rsc_health.historian.ingest import delivery

    cfg = _flush_config(ctx)
    spool_dir = Path(directory) if directory else Path(state_dir(cfg, ctx.obj.root)) / "spool"
    if not spool_dir.is_dir():
        raise click.ClickException(f"no spool directory {spool_dir}")
    try:
        if sys.stdout.isatty():
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task("spool flush", total=delivery.pending_lines(spool_dir))
                report = delivery.flush(ctx.obj.database_url, spool_dir,
                                        progress=lambda n: bar.advance(task, n))
        else:
            report = delivery.flush(ctx.obj.database_url, spool_dir)
    except spool_mod.SpoolBusy as exc:  # not a failure: the other flush delivers them
        click.echo(f"spool: nothing done: {exc}")
        return
    except hdb.HistorianError as exc:
        raise click.ClickException(f"{exc} (spooled results kept in {spool_dir})") from exc
    except OSError as exc:
        raise click.ClickException(f"cannot read the spool {spool_dir}: {exc}") from exc
    click.echo(report.summary())
    for batch, bad in report.quarantined[:MAX_BAD_SHOWN]:
        echo(f"  quarantined {batch} {bad}", err=True)


def _flush_config(ctx: click.Context):
    """The config a node's flush runs with. A broken one (a bad push) must not keep the spool
    that says so from the historian: the flush goes on with the last good config's settings
    (its historian URL), or the packaged defaults, and says so."""
    from rsc_health.config import fallback_config

    try:
        return ctx.obj.config
    except click.ClickException as exc:
        cfg, which = fallback_config(ctx.obj.root)
        click.echo(f"warning: {exc.message}; flushing with {which}", err=True)
        ctx.obj._config = cfg  # database_url reads [historian] url from it
        return cfg


# -- attribution ------------------------------------------------------------------------------


@click.command()
@click.option("--since", type=click.DateTime(), help="Only jobs that ended at or after (UTC).")
@click.pass_context
def attribute(ctx: click.Context, since: datetime | None) -> None:
    """Attribute FAILED / NODE_FAIL jobs to the health checks that fired around their end."""
    from rsc_health.historian.attribute import Window
    from rsc_health.historian.attribute import attribute as run
    from rsc_health.historian.outages import OutageRules

    # The site catalog's application XIDs and the site's maintenance reasons, as lemons,
    # triage and reliability read them.
    outages = OutageRules.of_site(ctx.obj.config)
    with _historian(ctx) as engine:
        report = run(engine, window=Window.from_config(ctx.obj.config), since=since,
                     outages=outages)
    click.echo(report.summary())
