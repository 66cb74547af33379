"""`ReportData`: the report's input, one DataFrame per section.

Rendering depends only on these column contracts, so it is tested with hand-built frames and
`gather` adapts whatever the metrics and lemon modules return into them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd

# section -> the columns rendering relies on (extra columns are carried along, never required).
COLUMNS: dict[str, tuple[str, ...]] = {
    # Fig. 3: job outcomes by count and GPU-hours, one row per Slurm state.
    "outcomes": ("state", "jobs", "gpu_hours"),
    # Fig. 4: attributed failures per GPU-hour, one row per cause.
    "causes": ("cause", "failures", "rate_per_gpu_hour"),
    # Fig. 5: rolling failure rate per 1000 node-days, long format (one row per day and mode).
    "rolling": ("time", "mode", "rate_per_1000_node_days"),
    # Fig. 5's markers: the day each check family began running on the fleet.
    "deployments": ("check", "time"),
    # Fig. 7: MTTF by job size (GPUs, rounded up to a multiple of 8), CI and projection.
    "mttf": ("gpus", "mttf_hours", "ci_low_hours", "ci_high_hours", "projected_hours"),
    # Fig. 8: goodput lost to failures and to the preemptions they caused, by job size.
    "goodput": ("gpus", "failure_gpu_hours", "preemption_gpu_hours"),
    # Fig. 9: ETTR of the longest job runs, measured (with CI) against expected.
    "ettr": ("run", "gpus", "measured", "ci_low", "ci_high", "expected"),
    # Fig. 11: lemon features, one row per node, one column per feature.
    "features": ("node",),
    # Today's lemon candidates: evidence is a list of short human-readable strings.
    "lemons": ("node", "rules", "evidence"),
    # What rsc-health did in Slurm over the last day (node_actions).
    "actions": ("time", "node", "action", "reason", "job_id"),
}

# The paper's seven signals (Fig. 11), in the paper's order.
PAPER_FEATURES: tuple[str, ...] = (
    "excl_jobid_count",
    "xid_cnt",
    "tickets",
    "out_count",
    "multi_node_node_fails",
    "single_node_node_fails",
    "single_node_node_failure_rate",
)


def empty_frame(section: str) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS[section]})


def _frame(section: str) -> Any:
    return field(default_factory=lambda: empty_frame(section))


@dataclass
class ReportData:
    """Everything one report shows; a missing section is an empty frame, never None."""

    as_of: datetime
    window_days: int = 28
    outcomes: pd.DataFrame = _frame("outcomes")
    causes: pd.DataFrame = _frame("causes")
    rolling: pd.DataFrame = _frame("rolling")
    deployments: pd.DataFrame = _frame("deployments")
    mttf: pd.DataFrame = _frame("mttf")
    goodput: pd.DataFrame = _frame("goodput")
    ettr: pd.DataFrame = _frame("ettr")
    features: pd.DataFrame = _frame("features")
    lemons: pd.DataFrame = _frame("lemons")
    actions: pd.DataFrame = _frame("actions")
    # The mass-drain guard's state: {"state": "armed|tripped|...", "detail": "..."}.
    guard: dict[str, Any] = field(default_factory=dict)
    # Why a section is empty when it is (e.g. "metrics module unavailable"): section -> text.
    notes: dict[str, str] = field(default_factory=dict)
    # Seconds each gathering step took (label -> s), reported in report.json.
    timings: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        """Fail early, naming the section, when a producer broke the column contract."""
        for section, columns in COLUMNS.items():
            frame = getattr(self, section)
            missing = [c for c in columns if c not in frame.columns]
            if missing:
                raise ValueError(f"report section {section!r} lacks column(s) {missing}")
