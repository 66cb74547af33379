"""The lab: the fleet simulator (a Slurm cluster's history in the real formats, with the truth
known), a simulated fleet in a historian (historian.py), the demo (demo.py), the lemon tuning
(tune.py) and the qualification stand-in tools. The product never imports this package
(tests/unit/test_lab_apart.py); the lab commands reach it (rsc_health/commands/lab.py).

`simulate(SimConfig(...), out_dir)` writes sacct.txt, events.txt, checks.jsonl,
exclusions.jsonl, tickets.csv and truth.json (see common.md for the contract).
"""

from rsc_health.sim.config import SimConfig
from rsc_health.sim.core import FILES, SimResult, simulate

__all__ = ["FILES", "SimConfig", "SimResult", "simulate"]
