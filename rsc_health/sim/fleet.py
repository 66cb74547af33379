"""The simulated fleet: node names and the partitions they are split into."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rsc_health.sim.config import SimConfig


@dataclass
class Fleet:
    names: list[str]
    partitions: list[str]
    part_lo: np.ndarray  # first node index of each partition
    part_hi: np.ndarray  # one past the last node index

    @property
    def size(self) -> int:
        return len(self.names)

    def partition_of(self, node: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.part_hi, node, side="right")


def build_fleet(cfg: SimConfig) -> Fleet:
    if cfg.nodes < 1:
        raise ValueError("nodes must be >= 1")
    width = max(4, len(str(cfg.nodes)))
    names = [f"{cfg.node_prefix}{i:0{width}d}" for i in range(1, cfg.nodes + 1)]
    shares = np.asarray(cfg.partition_shares, dtype=float)
    shares = shares / shares.sum()
    # Every partition gets at least one node; the first (the big-job partition) takes the rest.
    counts = np.maximum(1, np.floor(shares * cfg.nodes).astype(int))
    if counts.sum() > cfg.nodes:  # tiny fleets: fewer partitions
        keep = max(1, min(len(counts), cfg.nodes))
        counts = counts[:keep]
        counts[:] = 1
    counts[0] += cfg.nodes - counts.sum()
    hi = np.cumsum(counts)
    lo = hi - counts
    return Fleet(names, list(cfg.partitions[: len(counts)]), lo, hi)
