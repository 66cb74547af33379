"""`healthctl`, the operators' CLI.

Every subcommand is a thin call into the library. Subcommands are imported lazily, so
`healthctl check` on a compute node never pays for the historian's imports (SQLAlchemy, pandas).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click

from rsc_health.config import Config, ConfigError, load_config, node_root

# name -> "module:attribute" under rsc_health.commands; grouped by the part that owns them.
LAZY_COMMANDS: dict[str, str] = {
    # node checks (issue: node health checks)
    "check": "node:check",
    "snapshot": "node:snapshot",
    "config": "config:config",
    "node": "nodeview:node",
    # Slurm actions and the node-path entry points
    "drain": "slurm:drain",
    "resume": "slurm:resume",
    "status": "slurm:status",
    "sweep": "slurm:sweep",
    "prolog": "slurm:prolog",
    "epilog": "slurm:epilog",
    # historian
    "db": "historian:db",
    "ingest": "historian:ingest",
    "ticket": "historian:ticket",
    "spool": "historian:spool",
    "attribute": "historian:attribute",
    # reliability metrics
    "outcomes": "metrics:outcomes",
    "failure-rate": "metrics:failure_rate",
    "causes": "metrics:causes",
    "rolling": "metrics:rolling",
    "mttf": "metrics:mttf",
    "ettr": "metrics:ettr",
    "goodput": "metrics:goodput",
    "reliability": "metrics:reliability",
    "gpus": "metrics:gpus",
    "triage": "metrics:triage",
    "metrics": "exporter:metrics",
    # lemon nodes
    "lemons": "lemons:lemons",
    # qualification against peers before return to service
    "qualify": "qualify:qualify",
    # the suspect tier: slow nodes kept from big jobs, short of a drain
    "suspects": "suspects:suspects",
    # the nightly report
    "report": "report:report",
    # deployment: systemd units rendered for the venv this healthctl runs from
    "install-units": "deploy:install_units",
}

# The lab's commands (the fleet simulator, the demo, the lemon tuning): the only commands that
# load the lab package rsc_health.sim, and only when run (rsc_health/commands/lab.py;
# tests/unit/test_lab_apart.py holds the product to it).
LAB_COMMANDS: dict[str, str] = {
    "sim": "lab:sim",
    "demo": "lab:demo",
    "tune-lemons": "lab:tune_lemons",
}


@dataclass
class AppContext:
    """What every subcommand gets through click's obj: global options, resolved lazily."""

    config_path: str | None = None
    db_url: str | None = None
    root_arg: str | None = None
    _config: Config | None = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            try:
                self._config = load_config(self.config_path)
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from exc
        return self._config

    @property
    def root(self) -> Path:
        return Path(node_root(self.root_arg))  # config's paths are str (issue 25)

    @property
    def historian_configured(self) -> bool:
        return bool(self.db_url or os.environ.get("RSC_HEALTH_DB")
                    or self.config.get("historian.url"))

    @property
    def statement_timeout_s(self) -> float:
        return float(self.config.get("historian.statement_timeout_s"))

    @property
    def database_url(self) -> str:
        """--db > $RSC_HEALTH_DB > [historian] url in the config file. None of them: an error,
        never a database quietly created in the current directory."""
        url = (
            self.db_url
            or os.environ.get("RSC_HEALTH_DB")
            or self.config.get("historian.url")
        )
        if not url:
            raise click.ClickException(
                "no historian configured: set [historian] url in the config, $RSC_HEALTH_DB "
                "or --db URL (e.g. sqlite:////var/lib/rsc_health/history.db)"
            )
        return url


# Commands that can run for more than a few seconds on a big historian or a slow controller and
# have no progress of their own (report, demo, sim and spool flush draw their own).
SPINNER_COMMANDS = frozenset({
    "attribute", "causes", "db", "ettr", "failure-rate", "goodput", "gpus", "ingest", "lemons",
    "metrics", "mttf", "node", "outcomes", "reliability", "rolling", "status", "suspects", "ticket",
    "triage", "tune-lemons",
})


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS.keys() | LAB_COMMANDS.keys())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = LAZY_COMMANDS.get(cmd_name) or LAB_COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(f"rsc_health.commands.{module_name}")
        except ImportError as exc:
            missing = exc.name or "rsc_health"
            if missing.split(".")[0] != "rsc_health":
                return _unavailable(cmd_name, missing)
            if isinstance(exc, ModuleNotFoundError) and _in_zipapp():
                # The node zipapp holds the node side only (scripts/build-node): `--help` listing
                # every command, or `lemons` run on a node, ended in a traceback (helper-113).
                return _unavailable(cmd_name, missing, in_zipapp=True)
            raise
        return getattr(module, attr)


def _in_zipapp() -> bool:
    """Whether this rsc_health is imported from a zip (the node zipapp): its directory is no
    directory on disk."""
    import rsc_health

    return not os.path.isdir(os.path.dirname(rsc_health.__file__ or ""))


def _unavailable(name: str, missing: str, in_zipapp: bool = False) -> click.Command:
    """A command whose library this Python lacks (the node zipapp, a node without the
    [node-flush] extra), or whose module the node zipapp does not hold: listed, and saying
    what to install or where to run it when run, never a traceback."""
    if in_zipapp:
        why = ("is not in the node zipapp, which holds the node side only: run it where "
               "rsc-health is installed (the management host's commands need "
               "rsc-health[historian])")
    else:
        why = (f"needs the Python package {missing!r}, not installed for {sys.executable} "
               "(on a node, `spool flush` needs rsc-health[node-flush]: SQLAlchemy and psycopg; "
               "the management host's commands need rsc-health[historian])")

    @click.command(name, help=f"(not available here: {why})", add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def command() -> None:
        raise click.ClickException(f"healthctl {name} {why}")

    return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", metavar="PATH", help="Config file (TOML).")
@click.option("--db", "db_url", metavar="URL", help="Historian database URL.")
@click.option("--root", "root_arg", metavar="DIR", help="Read the node under DIR instead of /.")
@click.version_option(package_name="rsc-health")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, db_url: str | None, root_arg: str | None):
    """GPU node health checks and lemon-node detection for Slurm clusters."""
    ctx.obj = AppContext(config_path=config_path, db_url=db_url, root_arg=root_arg)
    if ctx.invoked_subcommand in SPINNER_COMMANDS and "--help" not in sys.argv:
        from rsc_health.commands.progress import start_spinner, watched

        if watched():
            ctx.call_on_close(start_spinner(f"healthctl {ctx.invoked_subcommand}"))


def main() -> None:
    """The console entry point. Commands turn the failures they expect into one line; this is
    the net under them: whatever else escapes (a database that froze mid-call, a bug) is one
    line on stderr and exit 1 for the operator's timer, with the traceback on request."""
    try:
        cli(prog_name="healthctl")
    except KeyboardInterrupt:
        print("healthctl: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last resort: never a traceback by default
        if os.environ.get("RSC_HEALTH_DEBUG"):
            raise
        orig = getattr(exc, "orig", None) or exc
        text = (str(orig).strip().splitlines() or [""])[0][:500]
        if "database is locked" in text:  # SQLite, past the busy timeout
            text += (" (another healthctl, an ingest or a flush, held the historian's write "
                     "lock for the whole wait; run this again once it has finished)")
        print(f"healthctl: error: {type(orig).__name__}: {text} "
              f"(RSC_HEALTH_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
