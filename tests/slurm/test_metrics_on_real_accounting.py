"""The reliability metrics on REAL Slurm accounting (issue 4, "Proof"): the session cluster
(slurmdbd on MariaDB) runs jobs that complete, fail, get requeued and hit NODE_FAIL; the
historian reads them through `healthctl ingest sacct|events` and `healthctl attribute`, and
`outcomes`, `failure-rate` and `goodput` report exactly what was run, with GPU-hours from the
runtimes slurmdbd itself recorded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, select

from rsc_health.historian.schema import attributions, jobs

pytestmark = pytest.mark.slurm

SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
# First run sleeps until the test requeues it; after the requeue it finishes at once.
REQUEUE_SCRIPT = 'if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then sleep 1; else sleep 300; fi'


def healthctl(cluster, db_url: str, *args: str) -> subprocess.CompletedProcess:
    # No site config: defaults only (gpus_per_node 8, attribution window 10 min / 5 min).
    env = dict(cluster.env, RSC_HEALTH_CONFIG=os.devnull)
    argv = [sys.executable, "-m", "rsc_health.cli", "--db", db_url, *args]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"healthctl {' '.join(args)}: {out.stderr}"
    return out


def healthctl_json(cluster, db_url: str, *args: str):
    return json.loads(healthctl(cluster, db_url, *args, "--json").stdout)


def running_out_of_prolog(cluster, job: str) -> bool:
    info = cluster.job(job)
    return info.get("JobState") == "RUNNING" and info.get("Reason") != "Prolog"


def has_run_for(cluster, job: str, seconds: int) -> bool:
    """Slurm's own RunTime (D-HH:MM:SS) has reached `seconds`: the instance then has a
    non-zero runtime in sacct, whatever second it started in."""
    if not running_out_of_prolog(cluster, job):
        return False
    days, _, hms = cluster.job(job).get("RunTime", "0").rpartition("-")
    h, m, sec = (int(x) for x in hms.split(":"))
    return (int(days or 0) * 86400 + h * 3600 + m * 60 + sec) >= seconds


def sacct_rows(cluster, job: str) -> list[dict[str, str]]:
    fields = ["JobIDRaw", "State", "Start", "End", "NNodes", "NodeList", "AllocTRES"]
    return [dict(zip(fields, row, strict=True)) for row in cluster.sacct(job, ",".join(fields))]


def sacct_states(cluster, job: str) -> list[str]:
    return [r["State"].split()[0] for r in sacct_rows(cluster, job)]


def runtime_s(row: dict[str, str]) -> float:
    start, end = (datetime.strptime(row[k], SACCT_TIME) for k in ("Start", "End"))
    return (end - start).total_seconds()


def test_outcomes_failure_rate_and_goodput_match_the_jobs_slurm_ran(slurm_cluster, tmp_path):
    c = slurm_cluster
    # Every job of earlier tests ended before this second boundary (reset emptied the queue),
    # and every job of this one ends after it: the metric windows below hold exactly ours.
    t0 = datetime.now(UTC).replace(tzinfo=None, microsecond=0) + timedelta(seconds=1)
    c.wait_for(lambda: datetime.now(UTC).replace(tzinfo=None) >= t0, 5, "the next second",
               interval=0.05)
    since = t0.strftime(SACCT_TIME)
    victim = c.node_names[-1]

    # job -> (GPUs requested in all, nodes)
    ok = c.sbatch("-N", "2", "--gres=gpu:8", "-J", "m_ok", "--wrap", "sleep 2")
    bad = c.sbatch("-N", "1", "--gres=gpu:4", "-J", "m_fail", "--wrap", "sleep 1; exit 1")
    rq = c.sbatch("-N", "1", "--gres=gpu:2", "-J", "m_requeue", "--requeue",
                  "--wrap", REQUEUE_SCRIPT)
    nf = c.sbatch("-N", "1", "--gres=gpu:8", "-J", "m_nodefail", "-w", victim, "--no-requeue",
                  "--wrap", "sleep 300")
    size = {ok: (16, 2), bad: (4, 1), rq: (2, 1), nf: (8, 1)}

    # Requeued in the second it started, the first instance would have no runtime to check.
    c.wait_for(lambda: has_run_for(c, rq, 2), 60, "requeue job RUNNING for 2 s")
    c.run(["scontrol", "requeue", rq])
    c.wait_for(lambda: running_out_of_prolog(c, nf), 60, "node-fail job RUNNING")
    slurmd = c.procs.pop(f"slurmd-{victim}")
    slurmd.terminate()  # the job's slurmstepd lives on; slurmctld only sees the node go silent
    slurmd.wait(15)
    try:
        # SlurmdTimeout=10: slurmctld marks the node DOWN and ends its job NODE_FAIL.
        c.wait_for(lambda: c.job_state(nf) == "NODE_FAIL", 60, "job NODE_FAIL")
    finally:
        # Leave the shared cluster healthy: slurmd back (it kills the orphaned step), node up.
        c.start_slurmd(victim)
        c.wait_for(lambda: "NOT_RESPONDING" not in c.node(victim).get("State", "")
                   and "*" not in c.run(["sinfo", "-h", "-n", victim, "-o", "%t"]).stdout,
                   60, "victim slurmd responding")
        if "DOWN" in c.node_state(victim) or "DRAIN" in c.node_state(victim):
            c.run(["scontrol", "update", f"NodeName={victim}", "State=RESUME"], check=False)
        c.wait_for(lambda: c.node_state(victim) in ("IDLE", "MIXED", "ALLOCATED"), 60,
                   "victim back in service")

    expected_states = {ok: ["COMPLETED"], bad: ["FAILED"], rq: ["REQUEUED", "COMPLETED"],
                       nf: ["NODE_FAIL"]}
    for job, states in expected_states.items():
        c.wait_for(lambda j=job, s=states: sacct_states(c, j) == s, 90, f"sacct {job}: {states}")
    rows = {job: sacct_rows(c, job) for job in expected_states}
    for job, instances in rows.items():
        for r in instances:  # what Slurm allocated is what was asked for
            gpus = re.search(r"gres/gpu=(\d+)", r["AllocTRES"])
            assert gpus and int(gpus.group(1)) == size[job][0], r
            assert int(r["NNodes"]) == size[job][1], r
    assert rows[nf][0]["NodeList"] == victim

    url = f"sqlite:///{tmp_path / 'history.db'}"
    # slurmdbd stores a job's end a moment after slurmctld ends it: ingest until every
    # instance landed finished (re-ingesting the same rows changes nothing).
    engine = create_engine(url)

    def landed() -> bool:
        report = healthctl_json(c, url, "ingest", "sacct", "--since", since)
        assert report.get("bad", []) == [], report
        with engine.connect() as conn:
            got = conn.execute(select(jobs.c.job_id, jobs.c.state, jobs.c.end)).all()
        return sorted((j, s) for j, s, e in got if e is not None) == sorted(
            (j, s) for j, states in expected_states.items() for s in states)

    c.wait_for(landed, 60, "slurmdbd to return every instance finished", interval=1)
    healthctl(c, url, "ingest", "events", "--since", since)
    healthctl(c, url, "attribute")

    with engine.connect() as conn:
        db_jobs = conn.execute(select(jobs).order_by(jobs.c.id)).all()
        blamed = conn.execute(select(attributions.c.job_pk, attributions.c.node,
                                     attributions.c.cause, attributions.c.kind)).all()
    engine.dispose()
    # The requeued job: two instances, one Job ID, each with its own runtime.
    requeued = [r for r in db_jobs if r.job_id == rq]
    assert [r.state for r in requeued] == ["REQUEUED", "COMPLETED"]
    assert [(r.start, r.end) for r in requeued] == [
        tuple(datetime.strptime(x[k], SACCT_TIME) for k in ("Start", "End")) for x in rows[rq]]
    assert requeued[0].end <= requeued[1].start
    # The NODE_FAIL is blamed on its node's own DOWN event (no health check fired).
    nf_pk = next(r.id for r in db_jobs if r.job_id == nf)
    assert blamed == [(nf_pk, victim, "node_down", "event")]
    bad_row = next(r for r in db_jobs if r.job_id == bad)
    assert (bad_row.exit_code, bad_row.gpus) == ("1:0", 4)

    # Expected figures from the runtimes slurmdbd recorded.
    gpu_h: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    node_days = 0.0
    for job, instances in rows.items():
        gpus, nnodes = size[job]
        for r in instances:
            state = r["State"].split()[0]
            count[state] += 1
            gpu_h[state] += runtime_s(r) * gpus / 3600
            node_days += runtime_s(r) * nnodes / 86400
    assert runtime_s(rows[nf][0]) > 0 and runtime_s(rows[rq][0]) > 0

    outcomes = healthctl_json(c, url, "outcomes", "--since", since)
    got = {o["outcome"]: (o["jobs"], o["gpu_hours"]) for o in outcomes}
    assert got.keys() == {"COMPLETED", "FAILED", "REQUEUED", "NODE_FAIL (HW)"}
    for outcome, (n, hours) in got.items():
        state = outcome.removesuffix(" (HW)")
        assert n == count[state], outcome
        assert hours == pytest.approx(gpu_h[state], rel=1e-9, abs=1e-9), outcome
    assert count == {"COMPLETED": 2, "FAILED": 1, "REQUEUED": 1, "NODE_FAIL": 1}
    assert sum(o["job_share"] for o in outcomes) == pytest.approx(1.0)

    # Small jobs count here: every instance has more than 0 GPUs. The user's exit 1 and the
    # user's requeue are not infra failures; the NODE_FAIL is.
    fr = healthctl_json(c, url, "failure-rate", "--since", since, "--large-job-gpus", "0")
    assert (fr["jobs"], fr["failures"], fr["large_job_gpus"]) == (5, 1, 0)
    assert fr["node_days"] == pytest.approx(node_days, rel=1e-9)
    assert fr["r_f_per_1000_node_days"] == pytest.approx(1000 / node_days, rel=1e-9)
    assert (fr["ci_low_per_1000_node_days"] < fr["r_f_per_1000_node_days"]
            < fr["ci_high_per_1000_node_days"])
    # The paper's default threshold (128 GPUs) leaves none of these jobs in the rate.
    default = healthctl_json(c, url, "failure-rate", "--since", since)
    assert (default["jobs"], default["failures"]) == (0, 0)

    # Goodput: only the NODE_FAIL lost work, min(runtime, 30 min) x 8 GPUs; nothing PREEMPTED.
    lost = healthctl_json(c, url, "goodput", "--since", since)
    assert [(g["size"], g["kind"], g["jobs"]) for g in lost] == [("8", "failure", 1)]
    expected_lost = min(runtime_s(rows[nf][0]), 1800) * 8 / 3600
    assert lost[0]["gpu_hours_lost"] == pytest.approx(expected_lost, rel=1e-9)

