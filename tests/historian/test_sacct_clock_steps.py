"""sacct rows written while slurmctld's clock was wrong: a job whose End is before its Start
(the clock stepped back while it ran), and one whose Start is from a clock reset to 2000 and
whose End is from the clock put right (24 years of one 32-node job). Before, both landed:
the first subtracted node-days, the second added 281,000 of them and r_f fell from 13.5 to
0.01 per 1000 node-days (MTTF, ETTR and the exported gauge with it) for every window holding
its end. Each now costs only its row, said with its line, and r_f is what the other jobs say."""

from __future__ import annotations

from datetime import datetime

import pytest

from rsc_health.historian.ingest import sacct
from rsc_health.historian.metrics._sql import Window
from rsc_health.historian.metrics.rates import failure_rate

from .test_ingest_adversarial import _names, _parsable, _row

BIG = {"NNodes": "32", "NodeList": "gpu[001-032]", "AllocTRES": "cpu=8,gres/gpu=256,node=32"}
WINDOW = Window(since=datetime(2024, 3, 1), until=datetime(2024, 4, 1))


def _fleet() -> list[dict[str, str]]:
    """Big jobs of a healthy month: ten 24-hour runs, one of them NODE_FAIL."""
    return [_row(str(10 + d), State="NODE_FAIL" if d == 3 else "COMPLETED",
                 Submit=f"2024-03-{d + 1:02d}T00:00:00", Eligible=f"2024-03-{d + 1:02d}T00:00:00",
                 Start=f"2024-03-{d + 1:02d}T00:00:00", End=f"2024-03-{d + 2:02d}T00:00:00",
                 **BIG)
            for d in range(10)]


@pytest.mark.parametrize(("times", "why"), [
    ({"Start": "2024-03-20T10:00:00", "End": "2024-03-20T09:00:00"}, "End is before Start"),
    ({"Submit": "2000-01-01T00:00:00", "Eligible": "2000-01-01T00:00:00",
      "Start": "2000-01-01T00:00:05", "End": "2024-03-20T09:00:00"}, "ran 8845 days"),
], ids=["end-before-start", "start-from-a-reset-clock"])
def test_a_job_stamped_by_a_wrong_controller_clock_costs_only_its_row(historian, times, why):
    sacct.ingest_text(historian, _parsable(_fleet()))
    honest = failure_rate(historian, WINDOW, 128)
    report = sacct.ingest_text(historian, _parsable([_row("99", **BIG, **times)]))
    assert [b.line for b in report.bad] == [2]
    assert why in report.bad[0].message
    assert "99" not in _names(historian)
    after = failure_rate(historian, WINDOW, 128)
    assert (after.node_days, after.r_f) == pytest.approx((honest.node_days, honest.r_f))
    assert honest.node_days == pytest.approx(320.0)
