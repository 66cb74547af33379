"""Each lemon feature's definition on a hand-built historian; expected counts worked by hand."""

from __future__ import annotations

from datetime import timedelta

import pytest
from lemon_fleet import AS_OF

from rsc_health.historian.lemons.features import PAPER_FEATURES, lemon_features

DAY = timedelta(days=1)


def test_excl_jobid_count_counts_distinct_jobs_inside_the_window_only(fleet, engine):
    fleet.job(["n1"], end=AS_OF - DAY)
    fleet.exclude("500", "n1", AS_OF - 2 * DAY)
    fleet.exclude("501", "n1", AS_OF - 3 * DAY)
    fleet.exclude("502", "n1", AS_OF - 29 * DAY)  # before the 28-day window
    fleet.exclude("503", "n1", AS_OF)  # the window is [as_of - 28d, as_of)
    fleet.exclude("500", "n2", AS_OF - DAY)
    f = lemon_features(engine, AS_OF)
    assert f.loc["n1", "excl_jobid_count"] == 2
    assert f.loc["n2", "excl_jobid_count"] == 1


def test_xid_cnt_counts_distinct_events_and_keeps_the_codes(fleet, engine):
    t = AS_OF - 5 * DAY
    fleet.xid("n1", t, "xid79", "gpu3")
    fleet.xid("n1", t, "xid79", "gpu3", status="warn")  # same event seen twice: one event
    # separate occasions more than a day apart (episode_gap_h 24): three episodes
    fleet.xid("n1", t + 2 * DAY, "xid48", "gpu1")
    fleet.xid("n1", t + 4 * DAY, "xid79", "gpu3")
    fleet.xid("n1", t + 4 * DAY, "xid13", "gpu2", status="ok")  # ok rows are not events
    fleet.xid("n1", AS_OF - 40 * DAY, "xid31", "gpu0")  # outside the window
    f = lemon_features(engine, AS_OF)
    assert f.loc["n1", "xid_cnt"] == 3
    assert f.loc["n1", "xid_codes"] == ["xid48", "xid79"]


def test_tickets_and_out_count_use_open_and_start_times(fleet, engine):
    fleet.ticket("n1", AS_OF - 2 * DAY)
    fleet.ticket("n1", AS_OF - 10 * DAY, AS_OF - 9 * DAY, source="csv")
    fleet.ticket("n1", AS_OF - 30 * DAY, AS_OF - 3 * DAY)  # opened before the window
    fleet.event("n1", AS_OF - 27 * DAY)
    fleet.event("n1", AS_OF - 4 * DAY, state="DOWN")
    fleet.event("n1", AS_OF - 28 * DAY - timedelta(seconds=1))  # one second too early
    f = lemon_features(engine, AS_OF)
    assert f.loc["n1", "tickets"] == 2
    assert f.loc["n1", "out_count"] == 2
    # Out at -4d started after the tickets closed at -9d and -3d? only -9d is before it: 1 repeat.
    assert f.loc["n1", "repeat_outs"] == 1


def test_node_fails_split_by_job_size_and_count_only_attributed_failures(fleet, engine):
    end = AS_OF - 3 * DAY
    fleet.failed(["n1", "n2", "n3"], "n1", end=end)
    fleet.failed(["n1", "n2"], "n1", end=end + timedelta(hours=1))
    fleet.failed(["n1", "n2"], "n2", end=end + timedelta(hours=2))
    fleet.failed(["n1"], "n1", end=end)
    fleet.failed(["n1"], None, end=end)  # failed, unattributed: not "caused by" n1
    for k in range(3):
        fleet.job(["n1"], end=end - k * DAY)
    fleet.failed(["n1"], "n1", end=AS_OF - 30 * DAY)  # outside the window
    f = lemon_features(engine, AS_OF)
    assert f.loc["n1", "multi_node_node_fails"] == 2
    assert f.loc["n2", "multi_node_node_fails"] == 1
    assert f.loc["n1", "single_node_node_fails"] == 1
    # single-node jobs that ended in the window on n1: 1 + 1 + 3 = 5
    assert f.loc["n1", "single_node_jobs"] == 5
    assert f.loc["n1", "single_node_node_failure_rate"] == pytest.approx(1 / 5)
    assert f.loc["n1", "single_node_failed_jobs"] == 2
    assert f.loc["n1", "single_node_fail_rate_any"] == pytest.approx(2 / 5)
    assert f.loc["n1", "node_fails"] == 3
    assert f.loc["n1", "jobs"] == 8
    assert f.loc["n3", "node_fails"] == 0


def test_early_fails_are_quick_failures_on_the_node(fleet, engine):
    end = AS_OF - 2 * DAY
    fleet.failed(["n1"], None, end=end, minutes=5)  # single node, quick: counts
    fleet.failed(["n1"], None, end=end, minutes=10)  # exactly 10 minutes: counts
    fleet.failed(["n1"], None, end=end, minutes=11)  # too slow
    fleet.job(["n1"], end=end, minutes=2)  # completed quickly: not a failure
    fleet.failed(["n1", "n2"], "n2", end=end, minutes=3, state="NODE_FAIL")
    f = lemon_features(engine, AS_OF)
    assert f.loc["n1", "early_fails"] == 2  # the multi-node one was n2's fault
    assert f.loc["n2", "early_fails"] == 1


def test_fail_causes_counts_distinct_causes(fleet, engine):
    end = AS_OF - DAY
    fleet.failed(["n1"], "n1", end=end, cause="xid")
    fleet.failed(["n1"], "n1", end=end, cause="xid")
    fleet.failed(["n1", "n2"], "n1", end=end, cause="infiniband")
    f = lemon_features(engine, AS_OF)
    assert f.loc["n1", "fail_causes"] == 2


def test_every_node_seen_gets_a_row_with_all_paper_features(fleet, engine):
    fleet.job(["n1", "n2"], end=AS_OF - DAY)
    fleet.xid("n3", AS_OF - DAY)
    fleet.event("n4", AS_OF - DAY)
    fleet.job(["n5"], end=AS_OF - 40 * DAY)  # not seen in the window
    f = lemon_features(engine, AS_OF)
    assert list(f.index) == ["n1", "n2", "n3", "n4"]
    assert set(PAPER_FEATURES) <= set(f.columns)
    assert f.loc["n4", "out_count"] == 1 and f.loc["n4", "jobs"] == 0


def test_window_days_and_as_of_move_the_window(fleet, engine):
    fleet.failed(["n1"], "n1", end=AS_OF - 10 * DAY)
    assert (
        lemon_features(engine, AS_OF, window_days=7).get("single_node_node_fails", {}).get("n1", 0)
        == 0
    )
    assert lemon_features(engine, AS_OF, window_days=14).loc["n1", "single_node_node_fails"] == 1
    assert lemon_features(engine, AS_OF - 10 * DAY).get("jobs", {}).get("n1", 0) == 0


def test_an_unattributed_single_node_node_fail_is_the_nodes_failure(fleet, engine):
    end = AS_OF - DAY
    fleet.failed(["n1"], None, end=end, state="NODE_FAIL")  # Slurm says the node failed
    fleet.failed(["n1"], None, end=end)  # FAILED, nothing says it was the node
    fleet.failed(["n1", "n2"], None, end=end, state="NODE_FAIL")  # which node? unknown
    fleet.failed(["n1"], "n1", end=end, state="NODE_FAIL")  # attributed too: counted once
    f = lemon_features(engine, AS_OF)
    assert f.loc["n1", "single_node_node_fails"] == 2
    assert f.loc["n1", "multi_node_node_fails"] == 0


def test_history_features_remember_repairs_and_deaths_beyond_the_window(fleet, engine):
    # n1: three repairs and three outages over two months, only one of each in the last 28 days.
    for days in (70, 45, 10):
        fleet.ticket("n1", AS_OF - days * DAY, closed=AS_OF - (days - 1) * DAY)
    fleet.event("n1", AS_OF - 70 * DAY, state="DOWN", reason="Not responding")
    fleet.event("n1", AS_OF - 45 * DAY, state="DOWN*", reason="Not responding")
    fleet.event("n1", AS_OF - 10 * DAY, state="DRAIN", reason="rsc_health:now:xid79:gpu0")
    fleet.ticket("n1", AS_OF - 5 * DAY, source="lemon")  # our own verdict is not evidence
    fleet.ticket("n1", AS_OF - 100 * DAY)  # older than history_days
    # n2: nothing in the 28-day window at all, but a repair 60 days ago: still gets a row.
    fleet.ticket("n2", AS_OF - 60 * DAY)
    f = lemon_features(engine, AS_OF, 28, history_days=90)
    assert f.loc["n1", "tickets"] == 2  # the lemon ticket counts in the plain window feature
    assert f.loc["n1", "tickets_history"] == 3
    assert f.loc["n1", "out_count"] == 1
    assert f.loc["n1", "out_count_history"] == 3
    assert f.loc["n1", "down_outs_history"] == 2
    assert f.loc["n2", "tickets_history"] == 1 and f.loc["n2", "jobs"] == 0
    assert lemon_features(engine, AS_OF, 28, history_days=50).loc["n1", "tickets_history"] == 2


def test_history_starts_over_when_a_lemon_comes_back_from_repair(fleet, engine):
    # A lemon's three repairs: it was drained as a lemon, repaired and resumed 3 days ago.
    for days in (70, 45, 10):
        fleet.ticket("n1", AS_OF - days * DAY, closed=AS_OF - (days - 1) * DAY)
        fleet.event("n1", AS_OF - days * DAY, state="DOWN", reason="Not responding")
    fleet.ticket("n1", AS_OF - 8 * DAY, closed=AS_OF - 3 * DAY, source="lemon")
    fleet.event("n1", AS_OF - 1 * DAY, state="DOWN", reason="Not responding")  # new trouble
    f = lemon_features(engine, AS_OF, 28, history_days=90)
    assert f.loc["n1", "tickets_history"] == 0
    assert f.loc["n1", "out_count_history"] == 1 and f.loc["n1", "down_outs_history"] == 1
    # Before the repair closed, the whole history counts.
    before = lemon_features(engine, AS_OF - 4 * DAY, 28, history_days=90)
    assert before.loc["n1", "tickets_history"] == 3 and before.loc["n1", "out_count_history"] == 3


def test_a_node_back_from_a_lemon_repair_is_judged_only_on_what_happened_since(fleet_any):
    fleet, engine = fleet_any, fleet_any.engine
    # Drained as a lemon for its XIDs, repaired (lemon ticket closed) 6 days before as_of.
    for day in (20, 18, 15, 12, 9):
        fleet.xid("n1", AS_OF - day * DAY, "xid48", f"gpu{day % 8}")
    fleet.failed(["n1"], "n1", end=AS_OF - 10 * DAY)
    fleet.ticket("n1", AS_OF - 8 * DAY, AS_OF - 6 * DAY, source="lemon")
    # Since the repair: one new XID and one failed job.
    fleet.xid("n1", AS_OF - 2 * DAY, "xid79", "gpu3")
    fleet.failed(["n1"], "n1", end=AS_OF - DAY)
    # n2 had the same old trouble and no repair: its window is the whole 28 days.
    for day in (20, 18, 15, 12, 9):
        fleet.xid("n2", AS_OF - day * DAY, "xid48", f"gpu{day % 8}")
    fleet.failed(["n2"], "n2", end=AS_OF - 10 * DAY)

    f = lemon_features(engine, AS_OF)

    assert (f.loc["n1", "xid_cnt"], f.loc["n1", "xid_codes"]) == (1, ["xid79"])
    assert f.loc["n1", "single_node_node_fails"] == 1
    assert f.loc["n1", "tickets"] == 0  # the lemon ticket was opened before the repair
    assert (f.loc["n2", "xid_cnt"], f.loc["n2", "single_node_node_fails"]) == (5, 1)


def test_a_lemon_repair_before_the_window_changes_nothing_inside_it(fleet, engine):
    fleet.ticket("n1", AS_OF - 45 * DAY, AS_OF - 40 * DAY, source="lemon")
    for day in (20, 10, 5):
        fleet.xid("n1", AS_OF - day * DAY, "xid48", f"gpu{day % 8}")
    assert lemon_features(engine, AS_OF).loc["n1", "xid_cnt"] == 3
