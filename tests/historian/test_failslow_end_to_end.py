"""Fail-slow end to end through the product's doors (issue 25): each node's spool of telemetry
records -> `healthctl spool flush` -> `healthctl suspects apply` (detect, then the suspect tier
on the shipped MemorySlurm) -> `healthctl qualify auto` (the qualification job runs `healthctl
qualify run` on the node with stand-in tools printing the real formats) -> `healthctl suspects
apply`: the node whose GPU is stuck in HW slowdown is confirmed (drained with the qualify
reason, a ticket), the node whose HCA port was congested by traffic (its hardware sound) is
released (trusted again, its weight back). A garbled record and a hostile-named node in the
spools cost their own lines, nothing else."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from rsc_health.cli import AppContext, cli
from rsc_health.commands.nodeview import node as node_cmd
from rsc_health.commands.qualify import qualify as qualify_cmd
from rsc_health.commands.suspects import suspects as suspects_cmd
from rsc_health.config import load_config
from rsc_health.historian import db, schema
from rsc_health.model import REASON_PREFIX, ActionKind
from rsc_health.policy import QUALIFY_MODE
from rsc_health.sim.failslow import FailSlowConfig, simulate_failslow
from rsc_health.sim.failslow_demo import (
    DRIVER,
    GPU_MODEL,
    HEALTHY_BUSBW,
    HEALTHY_GFLOPS,
    StandInSlurm,
    sacct_text,
    spool_records,
    standin_bin,
)
from rsc_health.spool import append, record

SWEEPS = 14
CONFIG = """
[suspects]
# 16 nodes: the default 5% would hold the second suspect back (the guard, tested elsewhere)
max_share = 0.2
[qualify]
min_peers = 4
deep = ["dcgm_r3", "nccl_all_reduce", "gpu_burn_long"]
# the stand-in slurmd runs each job in this process (CliRunner swaps stdout and os.environ for
# the whole process): one flow at a time
parallel = 1
[qualify.tests.dcgm_r3]
plugin = "dcgm_diag"
# The stand-in dcgmi is asked only where root or this user listens at --host: the suite's own
# listener (conftest.hostengine_standin).
command = ["dcgmi", "diag", "-r", "3", "-j", "--host", "@HOST@"]
timeout_s = 1800
"""
HOSTILE = 'fs"9\\x{y},z=1\u00e9'


def _ok(res):
    assert res.exit_code == 0, res.output[-1500:]
    return res.output


@pytest.fixture
def lab(tmp_path, hostengine_standin):
    """Two 8-node jobs that ended a minute ago, telemetry only (no step files): one node
    with a GPU stuck in HW slowdown, one with a congested HCA port."""
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    start = now - timedelta(seconds=SWEEPS * 300 + 180)
    fleet = simulate_failslow(FailSlowConfig(
        jobs=2, seed=4, script=("hw_slowdown", "ib_congested"), sizes=(8,),
        size_weights=(1.0,), sweeps=(SWEEPS, SWEEPS), steps_share=0.0,
        start=f"{start:%Y-%m-%dT%H:%M:%S}", start_within_s=0))
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.replace("@HOST@", hostengine_standin))
    url = f"sqlite:///{tmp_path / 'h.db'}"
    return fleet, config, url, now


def test_a_slow_gpus_node_is_confirmed_and_a_congested_but_sound_node_released(lab, tmp_path):
    fleet, config, url, now = lab
    truth = {r.kind: r for r in fleet.truth.itertuples()}
    slow, congested = truth["hw_slowdown"].node, truth["ib_congested"].node
    runner = CliRunner()

    def door(*args, **kw):
        return _ok(runner.invoke(cli, ["--config", str(config), "--db", url, *args], **kw))

    door("db", "upgrade")
    (tmp_path / "sacct.txt").write_text(sacct_text(fleet))
    assert "written 2" in door("ingest", "sacct", "--file", str(tmp_path / "sacct.txt"))

    # Each node's own spool, as its sweeps left it; one node also spooled a garbled record
    # and a node with a hostile name spooled its sweeps too.
    by_node: dict[str, list] = {}
    for rec in spool_records(fleet):
        by_node.setdefault(rec["node"], []).append(rec)
    first = sorted(by_node)[0]
    by_node[first].append(record("telemetry", first, now.replace(tzinfo=UTC), source="sweep",
                                 job_id=None, interval_s=300,
                                 metrics={"gpu_temp_c": {"value": "hot", "component": "g"}}))
    by_node[HOSTILE] = [dict(r, node=HOSTILE, id=r["id"][:-1] + "h")
                        for r in by_node[first][:3]]
    delivered = quarantined = 0
    for node, records in by_node.items():
        sdir = tmp_path / "spools" / f"n{len(node)}-{sorted(by_node).index(node)}"
        append(sdir, records)
        out = door("spool", "flush", "--dir", str(sdir))
        delivered += int(out.split("delivered telemetry ")[1].split()[0].rstrip(",;"))
        quarantined += "quarantined" in out
    # one record per sweep (a sweep may lack a metric: NVLink throughput NOT_SUPPORTED)
    assert delivered == len(fleet.samples[["node", "time"]].drop_duplicates()) + 3
    assert quarantined == 1

    slurm_calls: list = []
    bins = tmp_path / "bin"

    def node_bin(node: str):
        gflops = [HEALTHY_GFLOPS * (1 + 0.001 * (i % 3)) for i in range(8)]
        if node == slow:
            gflops[int(truth["hw_slowdown"].gpu)] /= float(truth["hw_slowdown"].slow)
        standin_bin(bins / node, gflops=gflops, busbw=HEALTHY_BUSBW)
        return bins / node

    def run_on_node(node, job_id, command):
        slurm_calls.append((node, job_id, command))
        env = {"PATH": f"{node_bin(node)}{os.pathsep}{os.environ.get('PATH', '')}",
               "SLURM_JOB_ID": job_id}
        runner.invoke(cli, ["--config", str(config), "--db", url, *command[1:],
                            "--gpu-model", GPU_MODEL, "--driver", DRIVER], env=env)

    names = sorted(fleet.membership["node"])
    slurm = StandInSlurm([], run_job=run_on_node, partition="learn")
    cfg = load_config(config)
    trusted = cfg.get("suspects.trusted_feature")
    for n in names:
        slurm.add_node(n, features=(trusted,), weight=1)

    def obj():
        o = AppContext(config_path=str(config), db_url=url)
        o.slurm = slurm
        return o

    # The fleet's earlier passes: four healthy nodes of the congested node's job.
    healthy = [n for n in names if n not in (slow, congested)]
    for n in healthy[-4:]:
        run_on_node(n, "", ["healthctl", "qualify", "run", "--tier", "deep", "--node", n])

    first_pass = json.loads(_ok(runner.invoke(suspects_cmd, ["apply", "--json"], obj=obj())))
    assert sorted(first_pass["recorded"]) == sorted([slow, congested])
    for n in (slow, congested):  # kept from big jobs, short of a drain
        info = slurm.info[n]
        assert trusted not in info.features
        assert info.weight == cfg.get("suspects.suspect_weight")
        assert "DRAIN" not in info.state
    assert all(trusted in slurm.info[n].features for n in healthy)

    auto = json.loads(_ok(runner.invoke(qualify_cmd, ["auto", "--json"], obj=obj())))
    results = {r["node"]: r for r in auto["results"]}
    assert results[slow]["result"] == "fail" and results[congested]["result"] == "pass"
    assert [c[0] for c in slurm_calls[-2:]] == [r["node"] for r in auto["results"]]
    assert all(c[2][1:4] == ["qualify", "run", "--tier"] for c in slurm_calls)

    second = json.loads(_ok(runner.invoke(suspects_cmd, ["apply", "--json"], obj=obj())))
    assert {s["node"]: s["state"] for s in second["settled"]} == {slow: "confirmed",
                                                                  congested: "cleared"}
    drained, released = slurm.info[slow], slurm.info[congested]
    assert "DRAIN" in drained.state
    assert drained.reason.startswith(f"{REASON_PREFIX}{QUALIFY_MODE}:gpu_burn_long:")
    assert "DRAIN" not in released.state and not slurm.reservations()
    assert trusted in released.features and released.weight == 1
    engine = db.connect(url, create_missing=True)
    try:
        with engine.connect() as conn:
            tickets = conn.execute(select(schema.tickets.c.node)).scalars().all()
            actions = conn.execute(select(schema.node_actions.c.node, schema.node_actions.c.action)
                                   ).all()
    finally:
        engine.dispose()
    assert tickets == [slow]
    assert (congested, ActionKind.QUALIFY_RELEASE) in actions
    assert (slow, ActionKind.QUALIFY_DRAIN) in actions
    shown = _ok(runner.invoke(suspects_cmd, ["--all"], obj=obj()))
    assert f"{slow}: confirmed" in shown and f"{congested}: cleared" in shown
    view = _ok(runner.invoke(node_cmd, [slow], obj=obj()))
    assert "suspect   CONFIRMED" in view and "FAIL" in view
