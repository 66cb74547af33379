"""Fixtures of tests/unit: `db`, the historian the qualification command tests run on (a
SQLite file `db upgrade` made, as a deployment's first step does). A file that needs more in
it defines its own `db`. Every test runs with no audit login (the person a command acts as is
then SUDO_USER or the login name), whatever session runs pytest."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.historian.db import connect


@pytest.fixture
def db(tmp_path):
    """(its URL, an engine on it)."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    engine = connect(url, create_missing=True)
    yield url, engine
    engine.dispose()


@pytest.fixture(autouse=True)
def no_audit_login(monkeypatch):
    """A test that sets SUDO_USER means that person: the session running pytest has its own
    audit login (rsc_health.commands.audit_login), which would come first. raising=False:
    tests/unit copied onto a tree from before audit_login still runs."""
    import rsc_health.commands

    monkeypatch.setattr(rsc_health.commands, "audit_login", lambda: None, raising=False)


def run_slurm_command(tmp_path, monkeypatch, slurm, cmd, args, site=""):
    """One of commands/slurm.py's commands (drain, resume, ...) on `slurm` (a MemorySlurm),
    with `site` as the config file, a root under tmp_path and no historian; its output
    printed for a failing test's log."""
    import rsc_health.commands.slurm as cs
    from rsc_health.cli import AppContext

    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(site)
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    res = CliRunner().invoke(cmd, args, obj=AppContext(config_path=str(cfg)))
    print(res.output)
    return res
