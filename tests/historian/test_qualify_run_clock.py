"""A qualification run is stamped by the historian's clock, never the node's: the node is the
one whose clock is in doubt (a dead RTC battery, a bad NTP server), and the management side
compares those stamps with its own (a drain's time, a suspect episode, the flow's submission).

Before, `qualify run` on a node one year ahead stored a pass ending a year ahead: every later
repair drain then found "a pass since", so `healthctl resume` let the node back unqualified,
every later suspect episode of the node was cleared by it, and no strike ever counted after
it. A node reset to the past stored a pass before the flow's own job was submitted, which
the flow never found (inconclusive, drained, for ever)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from unittest import mock

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from rsc_health.cli import cli
from rsc_health.historian.db import connect
from rsc_health.historian.schema import qualify_runs
from rsc_health.qualify.flow import RESULT_CLOCK_SLACK, HistorianSide
from rsc_health.sim import qualify_tools as standin


class _Ahead(datetime):
    """The node's wall clock, `shift` away from everyone else's."""

    shift = timedelta(0)

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) + cls.shift


def _qualify_run(tmp: Path, cfg: Path, db: str):
    """`healthctl qualify run` on gpu007 with a stand-in gpu_burn printing the real format."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "gpu_burn.out").write_text(standin.gpu_burn([16950.0] * 8))
    tool = bin_dir / "gpu_burn"
    tool.write_text(f'#!/bin/sh\ncat "{bin_dir}/gpu_burn.out"\n')
    tool.chmod(0o755)
    with mock.patch.dict(os.environ, {"PATH": f"{bin_dir}:/usr/bin:/bin", "RSC_HEALTH_DB": db,
                                     "SLURM_JOB_ID": "4242"}):
        return CliRunner().invoke(cli, ["--config", str(cfg), "qualify", "run", "--node",
                                        "gpu007", "--gpu-model", "NVIDIA H100 80GB HBM3",
                                        "--driver", "570.124.06", "--tier", "lite", "--json"])


@pytest.mark.parametrize("shift", [timedelta(days=365), timedelta(days=-3650)],
                         ids=["a-year-ahead", "ten-years-behind"])
def test_a_qualification_run_is_stamped_by_the_historians_clock_not_the_nodes(
        historian_url, tmp_path, shift):
    cfg = tmp_path / "config.toml"
    cfg.write_text("[qualify]\nlite = [\"burn\"]\nmin_peers = 4\ntier_budget_s = 60\n"
                   "[qualify.tests.burn]\nplugin = \"gpu_burn\"\n"
                   "command = [\"gpu_burn\", \"-tc\", \"60\"]\ntimeout_s = 10\n")
    connect(historian_url, upgrade=True, create_missing=True).dispose()
    before = datetime.now(UTC).replace(tzinfo=None)
    _Ahead.shift = shift
    with mock.patch("rsc_health.commands.qualify.datetime", _Ahead):
        result = _qualify_run(tmp_path, cfg, historian_url)
    after = datetime.now(UTC).replace(tzinfo=None)
    assert result.exit_code in (0, 4), result.output[-600:]
    engine = connect(historian_url, create_missing=True)
    try:
        with engine.connect() as conn:
            started, ended = conn.execute(select(qualify_runs.c.started,
                                                 qualify_runs.c.ended)).one()
        slack = timedelta(seconds=5)
        assert before - slack <= started <= ended <= after + slack, (started, ended)
        # The flow finds its job's result (it asks for one stored since its submission).
        assert HistorianSide(engine).result("gpu007", "4242",
                                            since=before - RESULT_CLOCK_SLACK) is not None
    finally:
        engine.dispose()
