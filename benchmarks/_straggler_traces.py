"""ByteDance's straggler traces (github.com/ByteDance-Seed/StragglerAnalysis, data/trace-*.parquet,
Apache-2.0; the OSDI'25 paper "Understanding Stragglers in Large Model Training Using What-if
Analysis") reduced to per-worker step compute times, and read back as step-time frames.

    python3 benchmarks/_straggler_traces.py DIR_WITH_PARQUETS   # rewrite the CSV fixtures

Each row of the reduction: one worker (dp_rank, stage; its rank) and one traced step, with
compute_s the sum of its forward-compute and backward-compute op durations in that step. The
traces hold no wall-clock times, only the sampled steps' ids (clusters of consecutive steps)
and op times inside a step.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "failslow" / \
    "bytedance-straggler"
TRACES = {"AR": "one worker slowed on purpose (paper A.2)",
          "SE": "sequence-length imbalance (paper 5.2)",
          "ST": "stage partitioning imbalance: a long last stage (paper 5.3)"}


def reduce(parquet: Path) -> pd.DataFrame:
    d = pd.read_parquet(parquet)
    c = d[d["optype"].isin(["forward-compute", "backward-compute"])]
    return (c.groupby(["dp_rank", "stage", "rank", "step"], observed=True)["duration"].sum()
            .rename("compute_s").reset_index().round({"compute_s": 6}))


def step_frame(trace: str, slot_s: int, start: datetime = datetime(2025, 1, 1)):
    """(steps, membership) for the detector: each worker a "node" (trace-dpD-ppS), its stage
    the pipeline stage, each traced step placed in a slot of its own (the k-th traced step at
    start + k slots), so every step is judged on its own and persistence counts steps."""
    rows = pd.read_csv(FIXTURE / f"{trace}.csv")
    order = {s: k for k, s in enumerate(sorted(rows["step"].unique()))}
    node = (trace + "-dp" + rows["dp_rank"].astype(str) + "-pp" + rows["stage"].astype(str))
    steps = pd.DataFrame({
        "job_id": trace, "rank": rows["rank"], "node": node, "stage": rows["stage"].astype(str),
        "step": rows["step"], "seconds": rows["compute_s"],
        "time": [start + timedelta(seconds=slot_s * order[s] + slot_s // 2)
                 for s in rows["step"]]})
    members = steps[["job_id", "node", "stage"]].drop_duplicates().assign(
        start=start, end=start + timedelta(seconds=slot_s * (len(order) + 1)))
    return steps, members


def nvrx_reports(trace: str, section: str = "fwd_bwd"):
    """(step, report) per traced step: the report NVRx's ReportGenerator would make of it
    (nvidia_resiliency_ext/attribution/straggler/reporting.py, _compute_sections_perf_scores:
    a section's relative score is the fastest rank's median time over this rank's), with the
    step's compute time as the one timed section and each worker a node of one rank. No GPU
    (kernel) score: the traces hold no kernel times. A mapping of Report's fields, as
    `dataclasses.asdict` gives them."""
    rows = pd.read_csv(FIXTURE / f"{trace}.csv")
    node = trace + "-dp" + rows["dp_rank"].astype(str) + "-pp" + rows["stage"].astype(str)
    rows = rows.assign(node=node)
    for step, at in rows.groupby("step", sort=True):
        fastest = float(at["compute_s"].min())
        scores = {int(r): fastest / float(t) for r, t in zip(at["rank"], at["compute_s"],
                                                               strict=True)}
        yield int(step), {
            "gpu_relative_perf_scores": {}, "section_relative_perf_scores": {section: scores},
            "gpu_individual_perf_scores": {}, "section_individual_perf_scores": {},
            "rank_to_node": dict(zip(at["rank"].astype(int), at["node"], strict=True)),
            "local_section_summaries": {}, "local_kernel_summaries": {},
            "generate_report_elapsed_time": 0.0, "gather_on_rank0": True, "rank": 0}


def nvrx_frame(trace: str, slot_s: int, start: datetime = datetime(2025, 1, 1)):
    """(steps, membership) as the historian would hold the trace's NVRx reports: each traced
    step's report (nvrx_reports) written by rsc_health/nvrx_lines.py and read back by
    `healthctl ingest steps`' parser (relative times 1/score, stage section:NAME), a slot per
    traced step. No pipeline stage: NVRx names none."""
    from rsc_health.historian.ingest.steps import parse_line
    from rsc_health.nvrx_lines import report_lines

    rows = []
    received = datetime.now(UTC).replace(tzinfo=None)
    for k, (step, report) in enumerate(nvrx_reports(trace)):
        when = start + timedelta(seconds=slot_s * k + slot_s // 2)
        for line in report_lines(report, step=step, job_id=trace, when=when):
            rows += parse_line(line, received)
    steps = pd.DataFrame(rows, columns=["job_id", "rank", "stage", "step", "node", "time",
                                        "seconds", "unit"])
    steps = steps.assign(time=pd.to_datetime(steps["time"]))
    members = steps[["job_id", "node"]].drop_duplicates().assign(
        start=start, end=start + timedelta(seconds=slot_s * (steps["step"].nunique() + 1)))
    return steps.drop(columns="unit"), members


def main(src: str) -> int:
    FIXTURE.mkdir(parents=True, exist_ok=True)
    for trace in TRACES:
        out = reduce(Path(src) / f"trace-{trace}.parquet")
        out.to_csv(FIXTURE / f"{trace}.csv", index=False)
        print(trace, len(out), "rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
