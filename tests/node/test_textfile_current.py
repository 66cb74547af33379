"""The textfile never keeps a stale line (issue 21, "Loud, then stale").

Each entry point's lines come from its latest run and each check family's from the latest run
that looked at it; checker errors are said by every run (3, then 0 once gone), faults included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node


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
