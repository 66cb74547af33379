"""The node path's stream as the historian stores it: sweeps at the configured cadence, in
their interval form (issue 13, point 8).

A real node sweeps every `sweep_interval_s` and the historian folds the runs into intervals
(rsc_health.historian.intervals): an all-clear interval per (node, family) that a failure
interrupts until the node is repaired. Writing the intervals directly gives the historian the
same rows the delivered sweeps would, at the cost of a few rows per node instead of 288 runs
per node-day (the runs themselves are what benchmarks/bench_historian_volume.py delivers).
"""

from __future__ import annotations

from collections import defaultdict

from rsc_health.sim.failures import FailurePlan

SWEEP_FAMILIES = ("gpu", "xid", "ecc", "remap", "nvlink", "pcie", "infiniband", "mount")


def all_clear_intervals(plan: FailurePlan, n_nodes: int, horizon: int, cadence: int
                        ) -> list[tuple[int, int, int, str]]:
    """(node, first seen, last seen, family) for every all-clear stretch: from the first sweep
    (or the sweep after a repair) to the last sweep before a failure of that family."""
    # (node, family) -> [(failure time, back in service)]
    breaks: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for f in plan.failures:
        for r in f.rows:
            breaks[(f.node, r.check)].append((r.time, max(f.repair_end, r.time + cadence)))
        if not f.rows:  # the node died: no sweep of any family until it is back
            for fam in SWEEP_FAMILIES:
                breaks[(f.node, fam)].append((f.time, max(f.repair_end, f.time + cadence)))
    for r in plan.transients:
        breaks[(r.node, r.check)].append((r.time, r.time + cadence))
    out = []
    for node in range(n_nodes):
        for fam in SWEEP_FAMILIES:
            start = 0
            for t, back in sorted(breaks.get((node, fam), ())):
                end = (t - 1) // cadence * cadence
                if end >= start:
                    out.append((node, start, end, fam))
                start = max(start, -(-back // cadence) * cadence)
            last = (horizon - 1) // cadence * cadence
            if last >= start:
                out.append((node, start, last, fam))
    return out
