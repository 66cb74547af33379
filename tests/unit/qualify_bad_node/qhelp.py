"""Shared helpers for the qualification-adversary tests: stand-in tools on PATH,
`healthctl qualify run` through the real CLI, a fresh SQLite historian."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from rsc_health.cli import cli

MODEL, DRIVER = "NVIDIA H100 80GB HBM3", "570.124.06"

# (test name, plug-in, argv) of the one-test tiers these files run
NCCL = ("nccl", "nccl_tests", ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8"])
BURN = ("burn", "gpu_burn", ["gpu_burn", "-tc", "60"])
IB = ("ib", "perftest", ["ib_write_bw", "-d", "mlx5_0", "-s", "8388608", "-n", "20000"])


def tier(test: tuple[str, str, list[str]], baseline: str | None = None) -> str:
    """The [qualify] tables of a `full` tier of one test, 4 peers, the baseline when given."""
    name, plugin, command = test
    return (f'\n[qualify]\nfull = ["{name}"]\nmin_peers = 4\ntier_budget_s = 60\n'
            + (f'baseline = "{baseline}"\n' if baseline else "")
            + f'[qualify.tests.{name}]\nplugin = "{plugin}"\ncommand = {json.dumps(command)}\n'
            + "timeout_s = 10\n")


def tools(tmp: Path, name: str, outputs: dict[str, str]) -> Path:
    b = tmp / f"bin-{name}"
    b.mkdir(exist_ok=True)
    for tool, text in outputs.items():
        (b / f"{tool}.out").write_text(text)
        s = b / tool
        s.write_text(f'#!/bin/sh\ncat "{b}/{tool}.out"\n')
        s.chmod(s.stat().st_mode | stat.S_IXUSR)
    return b


def db(tmp: Path) -> str:
    url = f"sqlite:///{tmp / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    return url


def qrun(cfg: Path, url: str, node: str, bindir: Path, *extra: str, root: Path | None = None,
         model: str | None = MODEL, driver: str | None = DRIVER):
    old = dict(os.environ)
    os.environ.update({"PATH": f"{bindir}:/usr/bin:/bin", "RSC_HEALTH_DB": url})
    args = ["--config", str(cfg)] + (["--root", str(root)] if root else []) + [
        "qualify", "run", "--node", node, "--json"]
    if model is not None:
        args += ["--gpu-model", model]
    if driver is not None:
        args += ["--driver", driver]
    try:
        res = CliRunner().invoke(cli, args + list(extra))
    finally:
        os.environ.clear()
        os.environ.update(old)
    try:
        doc = json.loads(res.output)
    except ValueError:
        doc = {"raw": res.output[-1500:]}
    return res.exit_code, doc
