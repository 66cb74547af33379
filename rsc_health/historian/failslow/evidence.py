"""What the fail-slow detector hands the suspect tier: one record per node, metric and source.

The shape is a contract between helpers (the detector here, the suspect tier in Slurm, the
CLI and the report); change it only with both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

TELEMETRY, STEPS = "telemetry", "steps"
SOURCES = (TELEMETRY, STEPS)


@dataclass(frozen=True)
class SuspectEvidence:
    """A node that ran slow against its own job's peers, persistently.

    node, metric   the node and what showed it (a telemetry metric name, or the steps metric)
    value          the node's median value over its outlying sweeps
    peer_median    the median, over the same sweeps, of its peer group's medians
    deviation      how far past its peers in the metric's bad direction, as a robust z-score
                   whose spread is floored (docs/failslow.md): (value - median) x sign /
                   (line / k); a node is an outlier above k ([failslow] k)
    since, last    naive UTC: the first and the latest outlying sweep of the runs behind it
    job_ids        the jobs it was judged in (sorted)
    source         "telemetry" or "steps" (per-rank step times a job wrote: untrusted input,
                   enough for a suspect, never for a drain)
    detail         one line for an operator: the component, the stage, the sweeps, the jobs
    """

    node: str
    metric: str
    value: float
    peer_median: float
    deviation: float
    since: datetime
    last: datetime
    job_ids: tuple[str, ...]
    source: str  # "telemetry" or "steps"
    detail: str
