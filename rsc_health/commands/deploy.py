"""`healthctl install-units`: the shipped systemd units, rendered to run the `healthctl` this
command is (the virtual environment it was installed into), never a hard-coded
/usr/local/bin/healthctl that a venv install does not have (issue 26).

Standard library and click only: it runs on compute nodes too (the flush unit)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

# The path the shipped units name; rendering replaces it with this install's healthctl.
SHIPPED_HEALTHCTL = "/usr/local/bin/healthctl"

# Which units a host of each role takes, relative to the checkout.
ROLES: dict[str, tuple[str, ...]] = {
    "node": ("deploy/node/*.service", "deploy/node/*.timer", "checks/rsc-health-sweep.service",
             "checks/rsc-health-sweep.timer"),
    "manager": ("deploy/manager/*.service", "deploy/manager/*.timer",
                "checks/rsc-health-report.service", "checks/rsc-health-report.timer"),
}


def this_healthctl() -> Path:
    """The `healthctl` next to the Python running this command: a venv's bin/ (its console
    script), whatever the PATH of the shell that ran it."""
    return Path(sys.executable).parent / "healthctl"


def checkout_of_package() -> Path | None:
    """The checkout this package was imported from (an editable install or PYTHONPATH), when
    it has the units; None for a wheel installed into site-packages."""
    top = Path(__file__).resolve().parents[2]
    return top if (top / "deploy" / "node").is_dir() else None


def unit_files(checkout: Path, role: str) -> list[Path]:
    roles = ROLES if role == "all" else {role: ROLES[role]}
    return sorted({p for patterns in roles.values() for pattern in patterns
                   for p in checkout.glob(pattern)})


# A path written into a unit as it is: no quoting, no specifier (%), no variable ($), no
# space (systemd would split the command line there), nothing sh -c would read twice.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*")


def render(text: str, healthctl: Path, python: Path) -> str:
    """The unit's text with every command line naming this install's healthctl, and (for the
    sweep script, which runs `$RSC_HEALTH_PYTHON -m rsc_health.nodepath`) this venv's Python as
    RSC_HEALTH_PYTHON unless /etc/default/rsc-health names another (EnvironmentFile= wins)."""
    for path in (healthctl, python):
        if not _PLAIN_PATH.fullmatch(str(path)):
            raise ValueError(f"{str(path)!r}: a unit cannot name this path unquoted "
                             "(spaces, quotes, % or $); install the venv at a plain path")
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith(("ExecStart", "ExecStop", "ExecReload", "ExecCondition")):
            line = line.replace(SHIPPED_HEALTHCTL, str(healthctl))
        out.append(line)
        if line.strip() == "[Service]":
            out.append(f"Environment=RSC_HEALTH_PYTHON={python}\n")
    return "".join(out)


@click.command("install-units")
@click.argument("role", type=click.Choice(["node", "manager", "all"]))
@click.option("--from", "checkout", type=click.Path(file_okay=False, path_type=Path),
              help="The rsc-health checkout whose deploy/ and checks/ units to render "
                   "(default: the one this healthctl runs from).")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path),
              default=Path("/etc/systemd/system"), show_default=True,
              help="Where the rendered units go.")
@click.option("--healthctl", "healthctl", type=click.Path(dir_okay=False, path_type=Path),
              help="The healthctl the units run (default: this one, in its venv's bin/).")
def install_units(role: str, checkout: Path | None, dest: Path, healthctl: Path | None) -> None:
    """Write the systemd units of a compute NODE or the MANAGER host (or ALL) into --dest,
    each command line pointing at this venv's healthctl. Then:
    systemctl daemon-reload && systemctl enable --now THE-TIMERS (printed)."""
    from rsc_health.durable import UnsafeDirectory, write_atomic

    exe = (healthctl or this_healthctl()).absolute()
    if not exe.is_file():
        raise click.ClickException(
            f"{exe} does not exist: run the healthctl of the venv the units should use "
            "(/opt/rsc_health/venv/bin/healthctl install-units ...), or name it with --healthctl")
    source = checkout or checkout_of_package()
    if source is None:
        raise click.ClickException(
            "this healthctl was installed from a wheel, without the units: "
            "pass --from CHECKOUT (the rsc-health source tree)")
    python = Path(sys.executable) if healthctl is None else exe.parent / "python3"
    files = unit_files(source, role)
    if not files:
        raise click.ClickException(f"{source} has no deploy/ or checks/ units")
    for path in files:
        try:
            write_atomic(dest / path.name, render(path.read_text(), exe, python), mode=0o644)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        except (OSError, UnsafeDirectory) as exc:
            raise click.ClickException(f"cannot write {dest / path.name}: {exc}") from exc
        click.echo(f"{dest / path.name}")
    timers = " ".join(p.name for p in files if p.suffix == ".timer")
    click.echo(f"now: systemctl daemon-reload && systemctl enable --now {timers}", err=True)
