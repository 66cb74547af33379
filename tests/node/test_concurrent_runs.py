"""A prolog and a sweep started at the same moment, again and again, with an XID arriving in
between: the node lock serialises them, every state file is whole JSON (written to a
temporary name and renamed), every spool line parses, and the XID is recorded once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import REPO, node_env  # noqa: F401 - the fixture

RUN = ("import sys\nfrom rsc_health import nodepath\n"
       "from rsc_health.slurm.memory import MemorySlurm\n"
       "slurm = MemorySlurm(['node01'])\n"
       "slurm.stop()\n"
       "raise SystemExit(nodepath.run_stage(sys.argv[1], slurm_factory=lambda c, d: slurm))\n")


def test_prolog_and_sweep_at_once_leave_whole_state_and_one_record(node_env):  # noqa: F811
    root = node_env
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for rnd in range(4):
        if rnd == 1:
            (root / "dev/kmsg").open("a").write(
                "4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, "
                "GPU has fallen off the bus.\n")
        procs = [subprocess.Popen([sys.executable, "-c", RUN, entry], cwd=REPO, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for entry in ("prolog", "sweep")]
        for p in procs:
            p.wait(60)
    sdir = root / NODE_STATE
    for path in sdir.glob("*.json"):
        json.loads(path.read_text())  # whole JSON, never torn
    assert not list(sdir.glob("*.tmp"))
    lines = (sdir / "spool" / "pending.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len({r["id"] for r in records if r.get("code") == "xid79"}) == 1
    assert len([r for r in records if r["kind"] == "heartbeat"]) == 8
    assert json.loads((sdir / "pending_verdict.json").read_text())["causes"][0]["code"] == "xid79"


def test_a_job_array_of_16_prologs_at_once_all_pass_within_budget_each_spooled_once(
        node_env):  # noqa: F811
    """16 jobs of an array start on one node at the same instant: the node lock serialises
    their checks, none waits past its share of the prolog budget, none fails its job start
    or drains (lock contention is no verdict), and each job's start is spooled exactly once."""
    import time

    root = node_env
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    jobs = [str(5000 + i) for i in range(16)]
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", RUN, "prolog"], cwd=REPO,
                              env={**env, "SLURM_JOB_ID": job}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for job in jobs]
    codes = [p.wait(60) for p in procs]
    errs = [p.stderr.read().decode() for p in procs]

    assert codes == [0] * 16, errs
    assert time.monotonic() - started < 30  # the prolog budget
    assert not [e for e in errs if "held for" in e]  # no prolog gave up on the lock
    records = [json.loads(line) for line in
               (root / NODE_STATE / "spool" / "pending.jsonl").read_text().splitlines()]
    starts = sorted(r["job_id"] for r in records if r["kind"] == "job_start")
    assert starts == jobs
    assert len([r for r in records if r["kind"] == "heartbeat"]) == 16
    assert len({r["id"] for r in records}) == len(records)
