"""The simulator's parameters: the [sim] section of the config, overridable from the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# Failure modes as the paper's Fig. 4 groups them; `node_down` is the unattributed share
# (the node stops answering and no health check fires).
FAILURE_MODES = ("infiniband", "mount", "gpu_memory", "pcie", "xid", "nvlink", "gpu", "node_down")

# Table II root causes of lemon nodes, and the failure mode each one shows up as.
LEMON_CAUSE_MODES = {
    "optics": "infiniband",
    "cpu": "node_down",
    "psu": "node_down",
    "nic": "infiniband",
    "eud": "gpu_memory",
    "pcie": "pcie",
    "dimm": "node_down",
    "gpu": "xid",
    "bios": "pcie",
}


@dataclass
class SimConfig:
    nodes: int = 256
    days: float = 90.0
    seed: int = 0
    gpus_per_node: int = 8
    node_prefix: str = "node"
    start: str = "2024-01-01T00:00:00"
    first_job_id: int = 1000
    partitions: list[str] = field(default_factory=lambda: ["learn", "dev", "eval"])
    partition_shares: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    utilisation: float = 0.85
    users: int = 400
    size_gpus: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    )
    size_weights: list[float] = field(
        default_factory=lambda: [
            0.46, 0.15, 0.30, 0.06, 0.012, 0.007, 0.005, 0.003,
            0.0015, 0.0008, 0.0004, 0.0002, 0.0001,
        ]
    )
    runtime_median_h: list[float] = field(
        default_factory=lambda: [0.5, 0.7, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0, 7.5, 9.0,
                                 10.5, 12.0]
    )
    runtime_sigma: float = 1.2
    # The node path's sweep cadence: checks.jsonl carries the all-clear intervals at it.
    sweep_interval_s: int = 300
    time_limit_h: float = 72.0
    outcome_shares: dict[str, float] = field(
        default_factory=lambda: {
            "COMPLETED": 0.612, "FAILED": 0.24, "CANCELLED": 0.035, "TIMEOUT": 0.006,
            "OUT_OF_MEMORY": 0.001, "PREEMPTED": 0.086, "REQUEUED": 0.02,
        }
    )
    preempt_min_runtime_h: float = 2.0
    requeue_min_gpus: int = 64
    requeue_share_small: float = 0.2
    rf_per_1000_node_days: float = 6.5
    mode_weights: dict[str, float] = field(
        default_factory=lambda: {
            "infiniband": 0.20, "mount": 0.16, "gpu_memory": 0.16, "pcie": 0.10,
            "xid": 0.10, "nvlink": 0.04, "gpu": 0.08, "node_down": 0.16,
        }
    )
    pcie_xid79_share: float = 0.43
    ib_gpu_share: float = 0.02
    node_fail_share: dict[str, float] = field(
        default_factory=lambda: {"node_down": 1.0, "gpu": 0.5, "pcie": 0.5}
    )
    node_fail_share_default: float = 0.15
    repair_median_h: float = 18.0
    repair_sigma: float = 1.0
    ticket_share: float = 0.3
    transient_per_1000_node_days: float = 30.0
    lemon_share: float = 0.015
    lemon_rf_multiplier: float = 10.0
    lemon_ticket_share: float = 0.9
    lemon_xid_per_day: float = 0.3
    lemon_job_fail_share: float = 0.05
    exclusion_job_share: float = 0.01
    exclusion_informed_share: float = 0.2
    maintenance_drains: int = 0
    fleet_events: int = 0

    @classmethod
    def from_mapping(cls, data: dict[str, Any], **overrides: Any) -> SimConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"[sim]: unknown key(s) {', '.join(sorted(unknown))}")
        merged = {**data, **{k: v for k, v in overrides.items() if v is not None}}
        return cls(**merged)

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> SimConfig:
        """From a loaded rsc_health Config's [sim] section; None-valued overrides are ignored."""
        return cls.from_mapping(config.section("sim"), **overrides)

    @property
    def rf(self) -> float:
        return self.rf_per_1000_node_days / 1000.0
