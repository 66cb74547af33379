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
        except PermissionError as exc:
            raise click.ClickException(_not_replaceable(path) or f"cannot write {path}: {exc}"
                                       ) from exc
        except OSError as exc:
            raise click.ClickException(f"cannot write {path}: {exc}") from exc
        if failed is None:
            click.echo(f"wrote {path}", err=True)
        _warn_root_in_a_shared_sticky_dir(path)
    if failed is not None:
        raise click.ClickException(f"historian unreachable, exported "
                                   f"rsc_health_historian_up 0: {failed}")


# How the timer's user runs the export by hand (README, docs/deployment.md).
_AS_THE_TIMER = "systemctl start rsc-health-export.service"


def _sticky_shared(directory: Path):
    """The stat of `directory` when it is sticky and a group other than root's may write it
    (node_exporter's textfile directory: 1775 root:rsc-health), else None."""
    import os
    import stat

    try:
        st = os.stat(directory)
    except OSError:
        return None
    if st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        return st
    return None


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _warn_root_in_a_shared_sticky_dir(path: Path) -> None:
    """Root's file in a sticky directory can be replaced by root alone: the export timer
    (User=rsc-health, the directory's group) fails every 5 minutes from then on and the fleet
    file stays as root wrote it (rsc_health_historian_up 1, every stale, lemon and suspect
    alert dead). Said on stderr at once, with the way out, rather than found days later."""
    import os

    if os.geteuid() != 0 or _sticky_shared(path.parent) is None or not _owned_by(path, 0):
        return
    click.echo(
        f"warning: {path} is root's now and {path.parent} is sticky with its group writing "
        "it: only root can replace this file, and the export timer (its own user) will fail "
        f"on it until it is deleted (rm {path}); run the export as the timer's user: "
        f"{_AS_THE_TIMER}", err=True)


def _owned_by(path: Path, uid: int) -> bool:
    import os

    try:
        return os.lstat(path).st_uid == uid
    except OSError:
        return False


def _not_replaceable(path: Path) -> str | None:
    """Why the rename over `path` was refused, when it is the sticky bit: another user's file
    stands there (root's, left by an export run as root) and only its owner or root may
    replace or delete it. Names the file to delete; None when that is not the reason."""
    import os

    try:
        st = os.lstat(path)
        sticky = os.stat(path.parent).st_mode & 0o1000
    except OSError:
        return None
    if not sticky or st.st_uid == os.geteuid():
        return None
    return (f"cannot replace {path}: it belongs to {_owner(st.st_uid)} and {path.parent} is "
            f"sticky, so only its owner may replace it; the file keeps its old numbers until "
            f"it is deleted: rm {path} (as {_owner(st.st_uid)}), then the next export writes it")
