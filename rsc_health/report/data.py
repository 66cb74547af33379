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
    # What rsc-health did in Slurm over the last day (node_actions); gather folds repeats into
    # intervals (report.fleet.fold_repeats: time is the first, last_seen and count added).
    "actions": ("time", "node", "action", "reason", "job_id"),
    # The headline r_f (per 1000 node-days, with its interval): the latest 7 days, the 7 before
    # them, and the metrics window; one row per period.
    "rates": ("period", "since", "until", "failures", "node_days", "r_f", "ci_low", "ci_high"),
    # Nodes out of service at as_of, from the historian (node events, rsc-health's own drains).
    "out_of_service": ("node", "state", "since", "age_hours", "reason", "source"),
    # Nodes whose node-path runs stopped arriving, whose checker cannot look, or whose probes
    # keep hanging (hung: "PROBE since TIME; ...", "" for none).
    "stale": ("node", "last_seen", "age_hours", "source", "level", "stopped", "broken", "hung"),
    # XID check intervals per GPU in the lemon window, most first.
    "xids": ("node", "gpu", "intervals", "codes", "last_seen"),
    # The newest row of each input, so a stopped ingest is obvious.
    "freshness": ("input", "newest", "age_hours", "stale", "note"),
    # Findings open now (check intervals not closed), most severe first: a young fleet's faults.
    "open_findings": ("node", "check", "component", "severity", "code", "since", "reason"),
    # Node events that began in the lemon window, per node, most first.
    "node_events": ("node", "events", "down", "last_start", "last_state", "last_reason"),
    # Qualification runs of the last day (rsc_health/qualify), newest first: passed, failed and
    # why, or inconclusive and why.
    "qualified": ("node", "tier", "verdict", "ended", "reason", "job_id"),
    # Suspect episodes open now or ended in the last day (rsc_health/suspects.py), open first:
    # the evidence (metric, value against the peers' median, deviation, jobs) and how it ended.
    "suspects": ("node", "state", "metric", "value", "peer_median", "deviation", "source",
                 "since", "last_evidence", "job_ids", "tier", "changed_by", "change_reason"),
    # Event-based reliability per month and peer group over the metrics window (node events
    # and XIDs, historian/metrics/reliability.py); attrs["left_out"]: what the maintenance and
    # fleet-event filters removed, by pattern.
    "reliability": ("period", "group", "failures", "episodes", "nodes_failed", "node_days",
                    "system_mtbf_h", "node_mtbf_h", "repair_p50_h", "repair_p90_h",
                    "repair_mean_h", "reasons"),
    # Failed jobs of the lemon window by triage label (historian/triage.py): how many, and
    # the nodes the host-labelled ones blame, most first ("node (jobs)").
    "triage": ("label", "jobs", "nodes"),
}



class SectionEmpty(Exception):
    """A section with nothing to show for a reason the reader should see (a young cluster, an
    input never ingested), not an error: the note says why, and nothing is logged as a failure."""


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
    rates: pd.DataFrame = _frame("rates")
    out_of_service: pd.DataFrame = _frame("out_of_service")
    stale: pd.DataFrame = _frame("stale")
    xids: pd.DataFrame = _frame("xids")
    freshness: pd.DataFrame = _frame("freshness")
    qualified: pd.DataFrame = _frame("qualified")
    suspects: pd.DataFrame = _frame("suspects")
    open_findings: pd.DataFrame = _frame("open_findings")
    node_events: pd.DataFrame = _frame("node_events")
    reliability: pd.DataFrame = _frame("reliability")
    triage: pd.DataFrame = _frame("triage")
    # The mass-drain guard's state: {"state": "armed|tripped|...", "detail": "..."}.
    guard: dict[str, Any] = field(default_factory=dict)
    # Why a section is empty when it is (e.g. "metrics module unavailable"): section -> text.
    notes: dict[str, str] = field(default_factory=dict)
    # The sections whose gathering raised (their note says why), as against skipped or empty
    # for a reason: `healthctl report` exits 1 after writing everything when any did.
    failed: list[str] = field(default_factory=list)
    # Seconds each gathering step took (label -> s), reported in report.json.
    timings: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        """Fail early, naming the section, when a producer broke the column contract."""
        for section, columns in COLUMNS.items():
            frame = getattr(self, section)
            missing = [c for c in columns if c not in frame.columns]
            if missing:
                raise ValueError(f"report section {section!r} lacks column(s) {missing}")
