"""Every `healthctl` command the README shows exists with the options it shows: each one's
`--help` runs, and every long option written on the line is one the command takes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def _command_lines() -> list[str]:
    lines, fence = [], None
    for raw in README.read_text().splitlines():
        if raw.startswith("```"):
            fence = None if fence is not None else raw[3:].strip()
            continue
        if fence not in ("", "bash"):
            continue
        line = raw.split(" #", 1)[0].strip()
        for part in re.split(r"&&|;", line):
            part = part.strip()
            if part.startswith("healthctl "):
                lines.append(part)
    return lines


COMMANDS = _command_lines()


def test_the_readme_shows_commands():
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize("line", COMMANDS)
def test_each_readme_command_exists_with_its_options(line):
    words = shlex.split(line.replace("...", "").replace("|", " "))[1:]
    # global options first (--config PATH, --db URL, --root DIR)
    while words and words[0] in ("--config", "--db", "--root"):
        words = words[2:]
    path, rest = [], []
    group = cli
    for i, w in enumerate(words):
        sub = group.get_command(None, w) if hasattr(group, "get_command") else None
        if sub is None:
            rest = words[i:]
            break
        path.append(w)
        group = sub
    assert path, line
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, (line, result.output)
    for option in (w.split("=")[0] for w in rest if w.startswith("--")):
        assert option in result.output, (line, option)
