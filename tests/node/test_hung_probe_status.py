"""`healthctl status` names a node whose probes keep hanging (issue 21, class A), and since
when. A hung mount's drain held back by the mass-drain guard (or Slurm away) left the node out
of status's drained list, and with no checker error it was not 'not checking' either: status
said nothing. NVML on a wedged driver is a checker error until [gpu] nvml_hang_sweeps: status
said 'checker errors', never which probe or since when. The node path's real records (a sweep
on a real hung FUSE mount, sweeps with the wedged_nvml fixture), delivered to a historian."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.historian.db import connect
from rsc_health.historian.ingest.delivery import deliver
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node
from tests.lemons.lemon_fleet import fleet_slurm

REPO = Path(__file__).resolve().parents[2]
WEDGED = REPO / "tests" / "fixtures" / "fault" / "wedged_nvml"


def _sweeps(root: Path, n: int, pythonpath: str = str(REPO)) -> str:
    """n sweeps of the node under root, as node gpu042 (Slurm away); the first run's time."""
    env = dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(root / "site.toml"),
               SLURMD_NODENAME="gpu042", PYTHONPATH=pythonpath)
    for key in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST"):
        env.pop(key, None)
    for _ in range(n):
        out = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    spool = root / NODE_STATE / "spool" / "pending.jsonl"
    return json.loads(spool.read_text().splitlines()[0])["time"]


def _report_section(url: str, out: Path) -> str:
    """The nightly report's 'checks stopped or cannot look' section, from the historian."""
    import re

    from rsc_health.model import utcnow
    from rsc_health.report.gather import GatherOptions, gather
    from rsc_health.report.render import write_report

    skip = frozenset({"outcomes", "causes", "rolling", "deployments", "mttf", "goodput", "ettr"})
    engine = connect(url, create_missing=True)
    try:
        data = gather(engine, utcnow().replace(tzinfo=None), GatherOptions(skip=skip))
    finally:
        engine.dispose()
    html = write_report(data, out).html.read_text()
    return re.search(r'<section id="stale">(.*?)</section>', html, re.S).group(1)


def _status(root: Path, tmp_path: Path, monkeypatch) -> tuple[int, dict, str]:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    engine = connect(url, create_missing=True)
    try:
        deliver(engine, root / NODE_STATE / "spool")
    finally:
        engine.dispose()
    # Slurm's view: nothing drained (the guard held the drain, or slurmctld was away).
    fleet = fleet_slurm({"gpu042": ("MIXED", ""), "gpu043": ("IDLE", "")}, size=0)
    monkeypatch.setattr("rsc_health.commands.slurm._slurm", lambda ctx: fleet)
    result = CliRunner().invoke(cli, ["--db", url, "status", "--json"])
    text = CliRunner().invoke(cli, ["--db", url, "status"]).output
    return result.exit_code, json.loads(result.output), text


@pytest.mark.usefixtures("figures_not_drawn")
def test_status_names_a_node_whose_mount_keeps_hanging(hung_mount, tmp_path, monkeypatch):
    root = hung_mount
    (root / "site.toml").write_text((root / "config.toml").read_text()
                                    + '\n[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    first = _sweeps(root, 2)
    code, data, text = _status(root, tmp_path, monkeypatch)
    assert code == 1, data
    (hung,) = data.get("probes_hung") or [None]
    assert hung is not None, data
    assert (hung["node"], hung["probe"], hung["codes"]) == ("gpu042", "/checkpoint",
                                                            ["mount_hung"])
    assert hung["since"][:19] == first[:19]  # since the first sweep that found it hung
    assert "probes hanging: 1" in text and "gpu042" in text and "/checkpoint since" in text
    section = _report_section(f"sqlite:///{tmp_path / 'history.db'}", tmp_path / "report")
    assert "probes hanging (1)" in section and "probe hanging: /checkpoint since" in section


def test_status_names_a_node_whose_nvml_keeps_hanging(tmp_path, monkeypatch):
    root = copy_node(tmp_path / "node")
    (root / "site.toml").write_text((root / "config.toml").read_text().replace(
        "[gpu]\n", '[gpu]\nbackend = "nvml"\nnvml_binding = "pynvml"\nnvml_timeout_s = 1.0\n')
        + '\n[slurm]\nbin_dir = "/nonexistent-slurm"\n')
    first = _sweeps(root, 2, f"{WEDGED}:{REPO}")
    code, data, text = _status(root, tmp_path, monkeypatch)
    assert code == 1, data
    (hung,) = data.get("probes_hung") or [None]
    assert hung is not None, data
    assert (hung["node"], hung["probe"], hung["codes"]) == ("gpu042", "nvml", ["nvml_hung"])
    assert hung["since"][:19] == first[:19]
    assert "nvml since" in text


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch):
    monkeypatch.delenv("RSC_HEALTH_CONFIG", raising=False)
