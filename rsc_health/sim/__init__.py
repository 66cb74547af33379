"""Fleet simulator: a Slurm cluster's history in the real formats, with the truth known.

`simulate(SimConfig(...), out_dir)` writes sacct.txt, events.txt, checks.jsonl,
exclusions.jsonl, tickets.csv and truth.json (see common.md for the contract).
"""

from rsc_health.sim.config import SimConfig
from rsc_health.sim.core import FILES, SimResult, simulate

__all__ = ["FILES", "SimConfig", "SimResult", "simulate"]
