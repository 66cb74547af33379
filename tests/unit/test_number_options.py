"""Every number option of healthctl is a finite number: click's FLOAT (and FloatRange, whose
bounds a NaN compares false with) takes "nan" and "inf". `qualify cleanup --older-than nan`
ended and drained qualification flows still running; `qualify start --timeout nan` and
`metrics export --window-days nan` were taken too. A new float option that forgets
rsc_health.commands.FiniteFloat fails here."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.commands import FiniteFloat


def _commands(group: click.Group, ctx: click.Context, path=()):
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None:
            continue
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, click.Context(cmd, parent=ctx), (*path, name))


def _float_options():
    ctx = click.Context(cli)
    for path, cmd in _commands(cli, ctx):
        for p in cmd.params:
            if isinstance(p.type, click.types.FloatParamType):
                yield " ".join(path), p


def test_every_float_option_of_every_command_is_a_finite_float():
    found = list(_float_options())
    assert len(found) >= 10  # the walk reached the lazily loaded commands
    loose = [f"{path} {p.opts[0]}" for path, p in found if not isinstance(p.type, FiniteFloat)]
    assert loose == []


@pytest.mark.parametrize("word", ["nan", "NaN", "inf", "-inf", "1e999"])
def test_a_number_that_is_not_finite_is_refused_before_the_command_runs(word):
    res = CliRunner().invoke(cli, ["qualify", "cleanup", "--older-than", word])
    assert res.exit_code == 2 and "--older-than" in res.output, res.output
    assert "finite" in res.output or word == "-inf"  # -inf is below the range first


def test_finite_numbers_keep_their_ranges():
    t = FiniteFloat(min=0, min_open=True)
    assert t.convert("2.5", None, None) == 2.5
    with pytest.raises(click.BadParameter):
        t.convert("0", None, None)
    with pytest.raises(click.BadParameter):
        t.convert("nan", None, None)
