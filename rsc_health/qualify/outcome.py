"""What a qualification plug-in yields: metrics, or why the run failed or proves nothing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Metric:
    name: str                  # SuperBench-style "<benchmark>/<metric>"
    value: float
    unit: str
    scope: str = "node"        # node | gpu | hca
    index: str = ""            # GPU index or HCA name for per-device scopes
    higher_is_better: bool = True
    # A count of what the tool measured (nvbandwidth's matrix cells), not a speed: fewer than
    # its peers' median is less evidence (inconclusive), never judged within a margin.
    exact: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}:{self.index}" if self.index else self.name


@dataclass
class Outcome:
    """One tool run, parsed."""

    test: str
    metrics: list[Metric] = field(default_factory=list)
    failed: str | None = None          # the tool said the hardware is wrong
    inconclusive: str | None = None    # the run proves nothing either way
    # How many GPUs the tool itself says it ran on (gpu-burn's GPU list, nccl-tests' ranks on
    # a host, nvbandwidth's CUDA devices); None: the tool does not say. Fewer than [gpu]
    # count is less evidence than a whole node's (verdict.judge_run): never a pass.
    devices: int | None = None
    # The tool passed it but warned (DCGM diag's Warn: e.g. a PCIe replay rate past DCGM's
    # limit, clocks held back for heat or power): what it said. [qualify] dcgm_warn decides
    # whether a run may pass with one; either way the run's reason and report carry it.
    warned: str | None = None

    def __post_init__(self) -> None:
        if self.failed is None and self.inconclusive is None and not self.metrics:
            self.inconclusive = "no result in the output"


def number(token: str) -> float:
    """A finite, non-negative float from a tool's table, or ValueError."""
    value = float(token)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"not a measurement: {token[:40]!r}")
    return value
