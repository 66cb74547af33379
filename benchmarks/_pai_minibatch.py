"""Alibaba PAI's per-worker mini-batch times (github.com/alibaba/clusterdata,
cluster-trace-gpu-v2020/mini-batch-time/data/job_{1,2,3,4}_norm.csv, commit 7a6c496, CC BY 4.0;
released with "MLaaS in the Wild" (Weng et al., NSDI'22), described in "AntMan" (Xiao et al.,
OSDI'20)), read back as step-time frames for the fail-slow detector. Held out: the detector was
never tuned on them.

Four real distributed training jobs of 10 workers each, every worker on a share of one GPU
(20-50%), one value per worker every 10th iteration, normalised to 0-1000 (only the spread
between workers means anything). The release's own words for them (its README), the only
labels there are:

    job 1  a straggler (worker 6) emerges in the middle of the training
    job 2  the variation is stable, but different workers have different mini-batch times
    job 3  there could be multiple stragglers
    job 4  multiple stragglers; the mini-batch time may fluctuate

The fixtures keep the columns worker, gpu (the GPU share, %), time (the iteration),
batch_time_norm; the rows are as released (the index column dropped).

No wall-clock times are given: each run of PER_SLOT consecutive sampled iterations is placed in a
slot of its own (a sweep holds several step lines per rank, as in the lab's fleets), each worker
a "node" with one rank, no stage (the jobs are data-parallel).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "failslow" / \
    "alibaba-pai-minibatch"
JOBS = {
    "1": "a straggler (worker 6) emerges in the middle of the training",
    "2": "stable variation, different workers have different mini-batch times",
    "3": "there could be multiple stragglers",
    "4": "multiple stragglers; the mini-batch time may fluctuate",
}
PER_SLOT = 6  # sampled iterations (every 10th) per slot: fixed before the detector saw them


def step_frame(job: str, slot_s: int, per_slot: int = PER_SLOT,
               start: datetime = datetime(2020, 7, 1)):
    """(steps, membership) of PAI job `job` ("1".."4"): node pai-jobJ-wW, rank W, no stage."""
    rows = pd.read_csv(FIXTURE / f"job_{job}.csv")
    order = {t: k for k, t in enumerate(sorted(rows["time"].unique()))}
    slot = rows["time"].map(order) // per_slot
    steps = pd.DataFrame({
        "job_id": f"pai-{job}", "rank": rows["worker"].astype(int),
        "node": f"pai-job{job}-w" + rows["worker"].astype(str), "stage": "",
        "step": rows["time"].astype(int), "seconds": rows["batch_time_norm"].astype(float),
        "time": [start + timedelta(seconds=slot_s * int(s) + slot_s // 2) for s in slot]})
    members = steps[["job_id", "node"]].drop_duplicates().assign(
        start=start, end=start + timedelta(seconds=slot_s * (int(slot.max()) + 2)))
    return steps, members
