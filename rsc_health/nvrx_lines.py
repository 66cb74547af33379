"""Job side: NVIDIA Resiliency Extension straggler reports as step-file lines for
`healthctl ingest steps` (docs/failslow.md). Standard library only and Python 3.9, so a training
job can import it, or copy it, without the rest of rsc-health.

NVRx (`nvidia_resiliency_ext.attribution.straggler` from 0.4, `nvidia_resiliency_ext.straggler`
before) builds a `Report` in memory and writes no file; its callbacks only log the worst and
best few scores as text. `json.dumps(dataclasses.asdict(report))` fails on a real report:
`local_section_summaries` and `local_kernel_summaries` are keyed by the `Statistic` enum,
which JSON cannot key. And one line per report holding every rank outgrows a line the
historian reads (`[failslow] steps_max_line_bytes`, 64 KiB) at about 500 ranks. So:

    from rsc_health.nvrx_lines import report_lines

    report = straggler.Detector.generate_report_if_interval_elapsed()
    if report is not None:  # gather_on_rank0=True: rank 0 holds every rank's scores
        with open(f"/shared/steps/{os.environ['SLURM_JOB_ID']}.jsonl", "a") as fh:
            fh.writelines(line + "\\n" for line in report_lines(report, step=iteration))

writes one line per node: the relative scores (GPU and per section) of that node's ranks and
their node names, with the job id, step and time. Individual scores (a rank against its own
past) and the local summaries are left out: they are not a comparison with peers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

GPU = "gpu_relative_perf_scores"
SECTIONS = "section_relative_perf_scores"
NODES = "rank_to_node"
UNKNOWN_NODE = "<unk>"  # NVRx's rank_to_node default
UTC = timezone.utc  # noqa: UP017 (Python 3.9 has no datetime.UTC)


def _field(report: Any, name: str) -> Any:
    if isinstance(report, Mapping):
        return report.get(name) or {}
    return getattr(report, name, None) or {}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def report_lines(report: Any, step: int, job_id: str | None = None,
                 when: datetime | None = None) -> list[str]:
    """One JSON line per node of `report` (an NVRx Report, or a mapping of its fields such as
    `dataclasses.asdict` gives) for the drop directory. `job_id`: $SLURM_JOB_ID when not
    given; `when`: now (UTC). NaN scores (NVRx: no result for the rank) and ranks whose node
    NVRx did not learn are left out."""
    job = job_id if job_id is not None else os.environ.get("SLURM_JOB_ID")
    if not job:
        raise ValueError("report_lines: no job_id and no SLURM_JOB_ID")
    stamp = when or datetime.now(UTC)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    time = stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    by_node: dict[str, list[int]] = {}
    for rank, node in dict(_field(report, NODES)).items():
        if node in (None, "", UNKNOWN_NODE):
            continue
        by_node.setdefault(str(node), []).append(int(rank))
    gpu = dict(_field(report, GPU))
    sections = dict(_field(report, SECTIONS))

    def scores(of: Mapping, ranks: list[int]) -> dict[str, float]:
        out = {}
        for r in ranks:
            value = of.get(r, of.get(str(r)))
            if _finite(value):
                out[str(r)] = float(value)
        return out

    lines = []
    for node in sorted(by_node):
        ranks = sorted(by_node[node])
        gpu_scores = scores(gpu, ranks)
        section_scores = {str(name): scores(dict(per_rank), ranks)
                          for name, per_rank in sections.items()}
        section_scores = {k: v for k, v in section_scores.items() if v}
        if gpu_scores or section_scores:
            lines.append(json.dumps({"job_id": str(job), "step": int(step), "time": time,
                                     NODES: {str(r): node for r in ranks}, GPU: gpu_scores,
                                     SECTIONS: section_scores}, sort_keys=True))
    return lines
