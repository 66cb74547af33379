"""`healthctl`'s subcommands, one module per part of the product (rsc_health.cli loads them
lazily). What several of them need is here, once: the historian a command opens and the Slurm
handle it uses. Both import their dependencies when called, so loading this package costs the
node path nothing."""

from __future__ import annotations

import math
import os

import click


class FiniteFloat(click.FloatRange):
    """Every number option's type: a finite float, within the bounds given (FloatRange's).
    click's FLOAT and FloatRange take "nan" and "inf", and a NaN compares false with any bound:
    `qualify cleanup --older-than nan` ended flows still running. tests/unit/
    test_number_options.py fails on a float option of another type."""

    name = "number"

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


class NameFilter(click.ParamType):
    """A node or cluster name an option filters by: text the database can hold. An argument's
    bytes that were not UTF-8 (a Latin-1 terminal) reach Python as lone surrogates, which no
    database driver encodes: refused in words, not a UnicodeEncodeError from the query."""

    name = "name"

    def convert(self, value, param, ctx):
        text = str(value)
        if "\x00" in text or any("\ud800" <= c <= "\udfff" for c in text):
            self.fail(f"{text.encode('utf-8', 'replace').decode()!r} holds bytes that were "
                      "not UTF-8 (or a NUL): not a name", param, ctx)
        return text


NAME_FILTER = NameFilter()


def historian_engine(ctx: click.Context, *, upgrade: bool = False, create_missing: bool = False):
    """The configured historian (--db, $RSC_HEALTH_DB or [historian] url) with the configured
    statement timeout; a database that cannot be opened (or is not there: only an ingest
    creates one, `create_missing`) is a one-line click error."""
    from rsc_health.historian import db as hdb

    try:
        return hdb.connect(ctx.obj.database_url, upgrade=upgrade, create_missing=create_missing,
                           statement_timeout_s=ctx.obj.statement_timeout_s)
    except hdb.HistorianError as exc:
        raise click.ClickException(str(exc)) from exc


def slurm_handle(ctx: click.Context):
    """SlurmAPI: one injected through ctx.obj (tests, other backends), else the configured one
    (rsc_health.slurm.from_config, the one door)."""
    injected = getattr(ctx.obj, "slurm", None)
    if injected is not None:
        return injected
    from rsc_health.slurm import from_config

    return from_config(ctx.obj.config)


# The kernel's audit login uid of this process: set once at login (pam_loginuid) and kept
# through sudo, `sudo -i` and `su -`; unset (no login: a daemon, cron, a container) it reads
# 4294967295, (uid_t)-1.
LOGINUID_FILE = "/proc/self/loginuid"
NO_LOGINUID = 4294967295


def audit_login() -> str | None:
    """The name of the person who logged in to the session running this command (the audit
    login uid, a number when no name has it), or None where the kernel has none."""
    try:
        with open(LOGINUID_FILE) as fh:
            uid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    if uid == NO_LOGINUID or uid < 0:
        return None
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def invoking_person() -> str:
    """Who a person's command acts as (a `healthctl drain`'s `by NAME`, a suspect's clear):
    the audit login, then SUDO_USER, then the login name. SUDO_USER alone was `root` in a
    `sudo -i` shell (so every person's drain from one said `by root`, and any other root
    lifted it without --force), and unset in an `su -` shell (the owner could not resume
    their own drain); the audit login is the person in both."""
    import getpass

    return audit_login() or os.environ.get("SUDO_USER") or getpass.getuser()
