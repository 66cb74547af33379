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
