"""The simulated history has the shape the RSC paper reports (Fig. 3, 6, Obs. 7, Sec. IV-A)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta

from scipy import stats

from rsc_health.sim import SimConfig, simulate


def hours(row: dict) -> float:
    ran = datetime.fromisoformat(row["End"]) - datetime.fromisoformat(row["Start"])
    return ran.total_seconds() / 3600


def gpus(row: dict) -> int:
    return int(row["AllocTRES"].split("gres/gpu=")[1].split(",")[0])


def test_job_mix_single_gpu_small_jobs_and_big_jobs_gpu_time(fleet):
    first = {}
    for row in fleet["rows"]:
        first.setdefault(row["JobIDRaw"], row)
    sizes = [gpus(r) for r in first.values()]
    assert sum(g == 1 for g in sizes) / len(sizes) > 0.40
    assert sum(g < 8 for g in sizes) / len(sizes) > 0.90
    done = [r for r in fleet["rows"] if r["End"] != "Unknown"]
    gpu_h = [gpus(r) * hours(r) for r in done]
    big = sum(h for r, h in zip(done, gpu_h, strict=True) if gpus(r) >= 256)
    assert big / sum(gpu_h) > 0.5


def test_outcome_shares_follow_fig3(fleet):
    states = defaultdict(int)
    for row in fleet["rows"]:
        states[row["State"].split(" ")[0]] += 1
    n = sum(states.values())
    assert 0.5 < states["COMPLETED"] / n < 0.7
    assert 0.18 < states["FAILED"] / n < 0.3
    assert 0.05 < states["PREEMPTED"] / n < 0.15
    for state in ("CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "REQUEUED", "NODE_FAIL"):
        assert states[state] > 0, state
    assert (states["NODE_FAIL"] + states["REQUEUED"]) / n < 0.05


def test_fleet_is_kept_about_85_percent_busy(fleet):
    done = [r for r in fleet["rows"] if r["End"] != "Unknown"]
    used = sum(gpus(r) * hours(r) for r in done)
    assert 0.7 < used / (256 * 8 * 60 * 24) < 1.0


def test_preemption_only_after_two_hours_of_runtime(fleet):
    failed_by_hw = {str(j) for f in fleet["truth"]["failures"] for j in f["jobs"]}
    checked = 0
    for row in fleet["rows"]:
        state = row["State"]
        if state == "PREEMPTED" or (state == "REQUEUED" and row["JobIDRaw"] not in failed_by_hw):
            assert hours(row) >= 2.0, row
            checked += 1
    assert checked > 100


def test_requeued_jobs_keep_their_job_id(fleet):
    by_id = defaultdict(list)
    for row in fleet["rows"]:
        by_id[row["JobIDRaw"]].append(row)
    requeued = {k: v for k, v in by_id.items() if len(v) > 1}
    assert len(requeued) > 10
    for rows in requeued.values():
        for earlier, later in zip(rows, rows[1:], strict=False):
            # PREEMPTED: a failure's requeue took its nodes, and it requeued in turn.
            assert earlier["State"] in {"REQUEUED", "NODE_FAIL", "PREEMPTED"}
            assert later["Submit"] >= earlier["End"]
            assert later["AllocTRES"] == earlier["AllocTRES"]
    # Infrastructure failures of big jobs always come back (crash loops included); a requeue
    # queues again, so one killed late in the window may still be pending at its end (the
    # widest jobs wait days for a block).
    end = datetime.fromisoformat(fleet["truth"]["start"]) + timedelta(days=fleet["truth"]["days"])
    hit_at = {str(j): datetime.fromisoformat(f["time"]) for f in fleet["truth"]["failures"]
              for j in f["jobs"]}
    big = [k for k in hit_at if gpus(by_id[k][0]) >= 64]
    assert big
    pending = [k for k in big if len(by_id[k]) == 1]
    assert len(pending) <= 0.1 * len(big)
    assert all(hit_at[k] > end - timedelta(days=15) for k in pending)


def test_injected_failures_match_rf_within_the_poisson_90_interval(tmp_path):
    out = tmp_path / "rf"
    simulate(SimConfig(nodes=600, days=60, seed=21, lemon_share=0.0, rf_per_1000_node_days=6.5,
                       utilisation=0.2), out)
    truth = json.loads((out / "truth.json").read_text())
    expected = 6.5 / 1000 * truth["node_days_up"]
    lo, hi = stats.poisson.interval(0.90, expected)
    assert lo <= len(truth["failures"]) <= hi
    assert truth["rf_per_node_day"] == 0.0065 and not truth["lemon_nodes"]


def test_lemons_are_planted_at_the_requested_share_and_fail_more(tmp_path):
    out = tmp_path / "lemons"
    simulate(SimConfig(nodes=400, days=60, seed=4, lemon_share=0.05, utilisation=0.2), out)
    truth = json.loads((out / "truth.json").read_text())
    lemons = set(truth["lemon_nodes"])
    assert len(lemons) == 20
    assert {entry["node"] for entry in truth["lemons"]} == lemons
    per_node = defaultdict(int)
    for f in truth["failures"]:
        per_node[f["node"]] += 1
    lemon_rate = sum(per_node[n] for n in lemons) / len(lemons)
    other_rate = sum(v for n, v in per_node.items() if n not in lemons) / (400 - len(lemons))
    assert lemon_rate > 4 * other_rate
    # Table II signatures: repeated XIDs and single-node job failures on the lemons.
    checks = [json.loads(line) for line in (out / "checks.jsonl").open()]
    xid_nodes = {c["node"] for c in checks if c["check"] == "xid" and c["status"] == "warn"}
    assert lemons & xid_nodes
    assert sum(entry["job_failures"] for entry in truth["lemons"]) > 0


def test_requeued_big_jobs_preempt_jobs_that_ran_two_hours_on_their_nodes(fleet):
    """Fig. 8's second-order cost: a big job requeued after a failure has priority and takes
    nodes from jobs that have run two hours or more; they end PREEMPTED the second it starts,
    on nodes it now uses, and come back under their own JobID."""
    from rsc_health.hostlist import expand

    rows = defaultdict(list)
    for row in fleet["rows"]:
        rows[row["JobIDRaw"]].append(row)
    checked = 0
    for f in fleet["truth"]["failures"]:
        if not f["preempted_jobs"]:
            continue
        requeues = [r for j in f["jobs"] for r in rows[str(j)][1:] if r["Start"] != "Unknown"]
        for job_id in f["preempted_jobs"]:
            preempted = [r for r in rows[str(job_id)] if r["State"] == "PREEMPTED"]
            assert preempted and all(hours(r) >= 2.0 for r in preempted)
            hit = [(v, q) for v in preempted for q in requeues if v["End"] == q["Start"]
                   and set(expand(v["NodeList"])) & set(expand(q["NodeList"]))]
            assert hit, job_id
            assert gpus(hit[0][1]) >= 64
            checked += 1
    assert checked >= 5
