"""Fig. 5's markers: the day each check family began running, from its first all-clear row."""

from __future__ import annotations

import json
from datetime import datetime

from rsc_health.historian.ingest import checks
from rsc_health.historian.metrics._sql import Window
from rsc_health.historian.metrics.deployments import check_deployments


def _rows(*rows: tuple[str, str, str]) -> list[str]:
    return [json.dumps({"time": t, "node": "gpu001", "check": c, "status": s}) + "\n"
            for t, c, s in rows]


def test_a_family_that_starts_running_later_is_a_deployment_and_one_there_from_the_start_is_not(
    historian,
):
    report = checks.ingest_lines(historian, _rows(
        ("2026-01-01T00:00:00Z", "gpu", "ok"),
        ("2026-01-01T00:05:00Z", "xid", "ok"),
        # A failure before the first all-clear row says nothing about when the check began:
        # imported history may hold failures of checks the node path never ran.
        ("2026-01-20T00:00:00Z", "nvlink", "fail"),
        ("2026-02-03T10:00:00Z", "nvlink", "ok"),
        ("2026-02-03T10:05:00Z", "nvlink", "ok"),
        ("2026-03-01T00:00:00Z", "infiniband", "warn"),  # only failures: no deployment known
        ("2026-03-15T08:00:00Z", "mount", "ok"),
    ))
    assert not report.bad

    found = check_deployments(historian)

    assert list(found["check"]) == ["nvlink", "mount"]
    assert list(found["time"]) == [datetime(2026, 2, 3, 10), datetime(2026, 3, 15, 8)]
    march = check_deployments(historian, Window(since=datetime(2026, 3, 1)))
    assert list(march["check"]) == ["mount"]


def test_history_with_no_all_clear_rows_has_no_deployments(historian):
    checks.ingest_lines(historian, _rows(("2026-01-01T00:00:00Z", "xid", "fail"),
                                         ("2026-02-01T00:00:00Z", "ecc", "fail")))
    assert check_deployments(historian).empty
    assert check_deployments(historian).columns.tolist() == ["check", "time"]
