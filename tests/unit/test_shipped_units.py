"""The systemd units we ship call commands that exist, with options that parse: a typo in a
unit fails silently at 3 a.m. (a timer that runs nothing useful), so every `healthctl` line of
every ExecStart is parsed here by the real CLI, and every timer has its service."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

REPO = Path(__file__).resolve().parents[2]
UNIT_DIRS = [REPO / "deploy" / "node", REPO / "deploy" / "manager", REPO / "checks"]
SERVICES = sorted(p for d in UNIT_DIRS for p in d.glob("*.service"))
TIMERS = sorted(p for d in UNIT_DIRS for p in d.glob("*.timer"))


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


def _healthctl_calls(exec_start: str) -> list[list[str]]:
    """Each `healthctl ...` of an ExecStart, through one `sh -c '... && ...'` if there."""
    words = shlex.split(exec_start)
    if Path(words[0]).name == "sh" and words[1:2] == ["-c"]:
        commands = [shlex.split(part) for part in words[2].split("&&")]
    else:
        commands = [words]
    return [c[1:] for c in commands if Path(c[0]).name == "healthctl"]


def test_every_timer_has_its_service():
    assert TIMERS
    for timer in TIMERS:
        assert timer.with_suffix(".service").exists(), timer
        section = _unit(timer)["Timer"]
        assert "OnCalendar" in section or "OnUnitActiveSec" in section, timer


@pytest.mark.parametrize("service", SERVICES, ids=lambda p: p.name)
def test_every_healthctl_line_of_a_shipped_service_parses(service):
    exec_start = _unit(service).get("Service", "ExecStart")
    for args in _healthctl_calls(exec_start):
        result = CliRunner().invoke(cli, [*args, "--help"])
        assert result.exit_code == 0, (service.name, args, result.output)


def test_every_management_timer_is_in_the_deployment_docs_and_the_readme():
    docs = (REPO / "docs" / "deployment.md").read_text()
    readme = (REPO / "README.md").read_text()
    for timer in (REPO / "deploy" / "manager").glob("*.timer"):
        assert timer.stem in docs, timer.stem
        assert timer.name in readme, timer.name


CRONS = sorted((REPO / "checks").glob("*.cron"))


def _cron_commands(path: Path) -> list[list[str]]:
    """The command words of each /etc/cron.d entry (5 time fields and a user, then the command)."""
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" in line.split()[0]:
            continue
        out.append(shlex.split(line)[6:])
    return out


def test_cron_entries_name_every_program_by_its_full_path_and_parse():
    """cron's PATH is /usr/bin:/bin: a bare `healthctl` from a venv install is 'not found'
    every night, and nobody reads the mail. Every program a cron line runs (and the one it
    wraps through flock/timeout) is a full path, and healthctl's arguments parse."""
    assert CRONS
    for path in CRONS:
        assert "PATH=" not in path.read_text(), f"{path.name} leans on a PATH"
        commands = _cron_commands(path)
        assert commands, path.name
        for words in commands:
            assert words[0].startswith("/"), f"{path.name}: {words[0]} by PATH"
            for w in words:
                if Path(w).name in {"flock", "timeout", "healthctl", "rsc-health-sweep"}:
                    assert w.startswith("/"), f"{path.name}: {w} by PATH"
            if Path(words[0]).name == "healthctl":
                assert words[0] == "/opt/rsc_health/venv/bin/healthctl"
                args = [w for w in words[1:] if not w.startswith(">")]
                result = CliRunner().invoke(cli, [*args, "--help"])
                assert result.exit_code == 0, result.output
