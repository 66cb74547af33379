"""The textfile never keeps a stale line, and a broken config push is still said and still
flushed (issue 21, "Loud, then stale").

Each entry point's lines come from its latest run and each check family's from the latest run
that looked at it; checker errors are said by every run (3, then 0 once gone), faults and
broken configs included. A config that does not load falls back on what the last good one
said (its textfile directory, its historian) for the textfile and for `spool flush`.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    root = copy_node(tmp_path / "node")
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text()
                    + '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n')
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    return root


def _no_slurm(cfg, deadline):
    raise AssertionError("a Slurm call was made")


def _samples(root: Path) -> dict[str, str]:
    text = (root / "var/lib/node_exporter" / nodepath.TEXTFILE).read_text()
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


def test_a_checker_error_line_goes_back_to_0_once_the_error_is_gone(node_env):
    """An unreadable counters file is a checker error (rebuilt by the run that says so); on
    main `rsc_health_family_status{family="checker"} 3` stayed for ever after, since a run
    with no checker error wrote no such line and the old one was carried over."""
    state = node_env / NODE_STATE
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    (state / "counters.json").write_text("{ not json")
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    assert _samples(node_env)['rsc_health_family_status{family="checker"}'] == "3"

    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    samples = _samples(node_env)
    assert samples['rsc_health_family_status{family="checker"}'] == "0"
    assert samples['rsc_health_checker_errors{source="sweep"}'] == "0"


def test_a_checker_fault_is_said_in_the_textfile_and_cleared_by_the_next_good_run(
        node_env, monkeypatch):
    """A bug that ends a run early (here while spooling): on main the textfile went on showing
    the last good run's verdict, 0."""
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    def broken(*args, **kwargs):
        raise RuntimeError("bug while spooling")

    with monkeypatch.context() as patch:
        patch.setattr(nodepath, "_within_spool_cap", broken)
        assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    samples = _samples(node_env)
    assert samples['rsc_health_verdict_level{source="sweep"}'] == "4"
    assert samples['rsc_health_family_status{family="checker"}'] == "3"

    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    samples = _samples(node_env)
    assert samples['rsc_health_verdict_level{source="sweep"}'] == "0"
    assert samples['rsc_health_family_status{family="checker"}'] == "0"


def test_a_broken_config_push_is_said_in_the_textfile_and_cleared_once_fixed(node_env):
    """On main the broken run took its textfile_dir from the packaged defaults (none): the
    textfile kept saying the last good run's 0 while the node could not look."""
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    good = site.read_text()
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    assert _samples(node_env)['rsc_health_verdict_level{source="sweep"}'] == "0"

    site.write_text(good + "\n[actions]\nenabeld = false\n")
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    samples = _samples(node_env)
    assert samples['rsc_health_verdict_level{source="sweep"}'] == "4"
    assert samples['rsc_health_family_status{family="checker"}'] == "3"
    assert samples['rsc_health_family_status{family="gpu"}'] == "0"  # its latest word, kept

    site.write_text(good)
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    samples = _samples(node_env)
    assert samples['rsc_health_verdict_level{source="sweep"}'] == "0"
    assert samples['rsc_health_family_status{family="checker"}'] == "0"


def test_spool_flush_with_a_broken_config_delivers_with_the_last_good_historian(
        node_env, tmp_path):
    """A broken config push: the node spools its config_error, and its flush (the historian
    URL in the config) still delivers it. On main `spool flush` failed on the same file."""
    from sqlalchemy import create_engine, select

    from rsc_health.historian import schema

    db = tmp_path / "history.db"
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    good = site.read_text() + f'\n[historian]\nurl = "sqlite:///{db}"\n'
    site.write_text(good)
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    remembered = node_env / NODE_STATE / "last_good_config.json"
    site.write_text(good + "\n[actions]\nenabeld = false\n")
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    done = subprocess.run(  # what the node's rsc-health-flush.service runs
        [sys.executable, "-m", "rsc_health.cli", "spool", "flush"],
        env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert "enabeld" in done.stderr and "flushing with the last good config" in done.stderr
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        codes = set(conn.execute(select(schema.check_results.c.code)).scalars())
    engine.dispose()
    assert "config_error" in codes
    assert stat.S_IMODE(remembered.stat().st_mode) == 0o600  # the URL may hold a password




def test_the_sweeps_telemetry_sample_is_in_the_textfile_and_a_prolog_keeps_it(node_env,
                                                                                monkeypatch):
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    samples = _samples(node_env)
    assert samples['rsc_health_telemetry{source="sweep",metric="gpu_temp_c"}'] == "34"
    assert samples['rsc_health_telemetry{source="sweep",metric="power_ratio"}'] == "0.103929"
    assert not any('metric="throttle_hw_frac"' in k for k in samples)  # no rate on a first run
    # A prolog does not sample: the sweep's lines stay, none of its own appear.
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0
    samples = _samples(node_env)
    assert samples['rsc_health_telemetry{source="sweep",metric="gpu_temp_c"}'] == "34"
    assert not any(k.startswith('rsc_health_telemetry{source="prolog"') for k in samples)
