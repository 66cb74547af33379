"""The simulated fleet: node names, the two scheduling regions and the partitions over them."""

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
    big_hi: int  # nodes below this index run multi-node jobs, the rest single-node jobs

    @property
    def size(self) -> int:
        return len(self.names)


def build_fleet(cfg: SimConfig, big_hi: int) -> Fleet:
    """Nodes [0, big_hi) run the multi-node jobs, [big_hi, nodes) the single-node jobs. The
    first partition (`learn`) spans every node; the others (`dev`, `eval`) share the
    single-node region with it."""
    if cfg.nodes < 1:
        raise ValueError("nodes must be >= 1")
    width = max(4, len(str(cfg.nodes)))
    names = [f"{cfg.node_prefix}{i:0{width}d}" for i in range(1, cfg.nodes + 1)]
    n_parts = len(cfg.partitions)
    lo = np.full(n_parts, big_hi, dtype=np.int64)
    hi = np.full(n_parts, cfg.nodes, dtype=np.int64)
    lo[0] = 0
    return Fleet(names, list(cfg.partitions), lo, hi, int(big_hi))
