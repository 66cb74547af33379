"""Two repair tickets that open in the same second still write (Failure objects do not order)."""

from __future__ import annotations

import csv

import numpy as np

from rsc_health.sim.failures import Failure
from rsc_health.sim.writers import write_tickets


def test_tickets_opened_in_the_same_second_are_written_in_node_order(tmp_path):
    same = 3600
    failures = [
        Failure(node=2, time=same - 60, mode="pcie", repair_end=same + 7200, lemon=False,
                node_fail=True, rows=[], ticket=(same, same + 7200)),
        Failure(node=1, time=same - 60, mode="mount", repair_end=same + 3600, lemon=False,
                node_fail=False, rows=[], ticket=(same, same + 3600)),
    ]
    path = tmp_path / "tickets.csv"
    written = write_tickets(path, np.datetime64("2024-01-01T00:00:00"), ["n0", "n1", "n2"],
                            failures, horizon=10 * 3600)
    rows = list(csv.DictReader(path.open()))
    assert written == 2
    assert [r["node"] for r in rows] == ["n1", "n2"]
    assert rows[0]["opened"] == rows[1]["opened"] == "2024-01-01T01:00:00"
