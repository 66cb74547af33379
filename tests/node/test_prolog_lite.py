"""The lite tier in the prolog of big jobs ([qualify] prolog_lite_min_nodes, issue 24): a job of
that many nodes or more runs DCGM's diagnostic at the lite tier's level in each node's prolog
(a stand-in dcgmi printing DCGM's real diag JSON); a smaller job, or the feature off, spawns
nothing; the job size comes from the prolog's environment only (no Slurm RPC); a diagnostic
that cannot run lets the job start (a checker error, never a drain)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsc_health import nodepath
from rsc_health.node import lite
from rsc_health.sim.qualify_tools import dcgm_diag
from tests.fixtures.nodes.node_copy import NODE_STATE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"


@pytest.fixture
def prolog(node, monkeypatch):
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(node.root))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for name in ("SLURM_JOB_PARTITION", "SLURM_JOBID", "SLURM_JOB_NODELIST",
                 "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(name, raising=False)

    def run(min_nodes: int, env: dict[str, str], extra: str = "") -> int:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        site = node.path("site.toml")
        site.write_text(node.path("config.toml").read_text()
                        + f"\n[qualify]\nprolog_lite_min_nodes = {min_nodes}\n{extra}\n"
                        '[slurm]\nbin_dir = "/nonexistent-slurm"\n')
        monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
        return nodepath.main(["prolog"])

    return run


def fake_dcgmi(node, diag_text: str, body: str | None = None) -> Path:
    marker = node.path("dcgmi-ran")
    node.write("diag.json", diag_text)
    node.write("health.json", (FIXTURES / "health-healthy.json").read_text())
    node.write("usr/bin/dcgmi", "#!/bin/sh\n" + f"echo \"$@\" >> '{marker}'\n" + (body or (
        f"case \"$1\" in health) cat '{node.path('health.json')}';; "
        f"diag) cat '{node.path('diag.json')}';; esac\n")))
    node.path("usr/bin/dcgmi").chmod(0o755)
    return marker


def spooled(node) -> list[dict]:
    text = node.path(f"{NODE_STATE}/spool/pending.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


FAILING = dcgm_diag({"Memory": ["Pass"] * 7 + ["Fail"]})
PASSING = dcgm_diag({"Memory": ["Pass"] * 8})


def test_a_big_jobs_prolog_runs_the_lite_diag_and_a_dcgm_fail_keeps_the_job_off(node, prolog):
    marker = fake_dcgmi(node, FAILING)
    assert prolog(64, {"SLURM_JOB_NUM_NODES": "128"}) != 0
    assert "diag -r 1 -j" in marker.read_text()
    checks = [r for r in spooled(node) if r["kind"] == "check" and r["check"] == "dcgm"]
    assert any(r["status"] == "fail" for r in checks), checks


def test_a_big_jobs_prolog_with_a_passing_diag_lets_the_job_run(node, prolog):
    marker = fake_dcgmi(node, PASSING)
    assert prolog(64, {"SLURM_NNODES": "64"}) == 0
    assert "diag -r 1 -j" in marker.read_text()


@pytest.mark.parametrize("min_nodes, env", [
    (0, {"SLURM_JOB_NUM_NODES": "4096"}),                 # off (the default)
    (64, {"SLURM_JOB_NUM_NODES": "63"}),                  # below the size
    (64, {"SLURM_JOB_NODELIST": "gpu[001-032]"}),         # 32 counted from the nodelist
    (64, {"SLURM_JOB_NUM_NODES": "-5"}),                  # garbled: not a size
    (64, {"SLURM_JOB_NODELIST": "gpu[9-1]"}),             # garbled nodelist: not a size
    (64, {}),                                             # nothing says: not a big job
])
def test_below_the_size_off_or_unknown_the_prolog_spawns_nothing(node, prolog, min_nodes, env):
    marker = fake_dcgmi(node, FAILING)
    assert prolog(min_nodes, env) == 0
    assert not marker.exists()


def test_a_big_job_counted_from_the_nodelist_alone_gets_the_lite_diag(node, prolog):
    marker = fake_dcgmi(node, FAILING)
    assert prolog(64, {"SLURM_JOB_NODELIST": "gpu[0001-0100],cpu01"}) != 0
    assert marker.exists()


def test_a_hung_or_missing_dcgmi_lets_the_big_job_start_within_the_budget(node, prolog):
    import time

    fake_dcgmi(node, PASSING, body="exec sleep 60\n")
    started = time.monotonic()
    assert prolog(8, {"SLURM_JOB_NUM_NODES": "8"}, "prolog_lite_timeout_s = 2.0") == 0
    assert time.monotonic() - started < 10
    beat = next(r for r in spooled(node) if r["kind"] == "heartbeat")
    assert beat["level"] == "checker_error"
    node.path("usr/bin/dcgmi").unlink()
    assert prolog(8, {"SLURM_JOB_NUM_NODES": "8"}) == 0


def test_the_lite_level_is_the_lite_tiers_dcgm_test_and_peer_judged_tests_stay_out():
    from rsc_health.config import Config

    cfg = Config({"qualify": {"lite": ["dcgm_r2", "gpu_burn"], "tests": {
        "dcgm_r2": {"plugin": "dcgm_diag", "command": ["dcgmi", "diag", "-r", "2", "-j"]},
        "gpu_burn": {"plugin": "gpu_burn", "command": ["gpu_burn", "60"]}}}})
    assert lite.lite_diag_level(cfg) == 2
    cfg.data["qualify"]["lite"] = ["gpu_burn"]
    assert lite.lite_diag_level(cfg) == 0
    families, same = lite.prolog_lite(
        Config({"qualify": dict(cfg.data["qualify"], prolog_lite_min_nodes=2)}), ["gpu"],
        {"SLURM_JOB_NUM_NODES": "9"})
    assert families == ["gpu"]  # no node-local test in the lite tier: nothing added
