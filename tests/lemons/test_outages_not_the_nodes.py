"""Planned maintenance and fleet-wide events are not a node's outages: on SQLite and
PostgreSQL, out_count, repeat_outs, out_count_history and down_outs_history leave them out,
while the node's own drains and deaths beside them still count."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest
from lemon_fleet import AS_OF

from rsc_health.historian.lemons.features import OutageRules, classify_outages, lemon_features

DAY = timedelta(days=1)
OUTAGE_FEATURES = ["out_count", "repeat_outs", "out_count_history", "down_outs_history"]
BLIND = OutageRules((), 0, 0.0, 300, incident_alpha=0.0)  # nothing left out


def _counts(engine, outages=None) -> pd.DataFrame:
    return lemon_features(engine, AS_OF, outages=outages)[OUTAGE_FEATURES]


@pytest.mark.parametrize("reason", ["maint: BIOS upgrade", "Scheduled MAINTENANCE",
                                    "firmware update", "planned: driver upgrade"])
def test_a_maintenance_drain_is_not_the_nodes_outage(fleet_any, reason):
    fleet = fleet_any
    fleet.ticket("n1", AS_OF - 40 * DAY, closed=AS_OF - 35 * DAY)
    fleet.event("n1", AS_OF - 3 * DAY, reason=reason)
    fleet.event("n1", AS_OF - 2 * DAY, state="DOWN", reason="Not responding")  # its own
    fleet.job(["n2"], end=AS_OF - DAY)
    got = _counts(fleet.engine).loc["n1"].tolist()
    assert got == [1, 1, 1, 1]
    assert _counts(fleet.engine, BLIND).loc["n1"].tolist() == [2, 2, 2, 1]


def test_rsc_healths_own_drain_reason_is_never_maintenance(fleet):
    # a check's detail may say "upgrade": the drain is still the node's
    fleet.event("n1", AS_OF - 3 * DAY,
                reason="rsc_health:now:gpu:driver upgrade needed (gpu0 lost)")
    assert _counts(fleet.engine).loc["n1", "out_count"] == 1


def test_many_nodes_out_within_minutes_is_a_fleet_event(fleet_any):
    fleet = fleet_any
    t = AS_OF - 4 * DAY
    for i in range(20):  # 20 of 40 nodes die within 3 minutes: a switch, not the nodes
        fleet.event(f"n{i:02d}", t + timedelta(seconds=9 * i), state="DOWN",
                    reason="Not responding")
    for i in range(40):
        fleet.job([f"n{i:02d}"], end=AS_OF - DAY)
    fleet.event("n03", AS_OF - 2 * DAY, state="DOWN", reason="Not responding")  # its own
    counts = _counts(fleet.engine)
    assert counts.loc["n03"].tolist() == [1, 0, 1, 1]
    assert counts.drop("n03")["out_count"].eq(0).all()
    blind = _counts(fleet.engine, BLIND)
    assert blind.loc["n03", "out_count"] == 2 and blind.loc["n05", "out_count"] == 1


def test_an_incident_day_too_slow_for_a_fleet_event_is_left_out_of_the_counts(fleet_any):
    """20 of 40 nodes die over one afternoon, 10 minutes apart (the five-minute fleet event
    misses it): the day is a fleet-wide incident of the group, and each struck node's outage
    that day, and the ticket opened for it the next morning, count in none of the count
    rules; a struck node's own outage on another day still counts, and the verdict's features
    say how many of its episodes the incidents took."""
    fleet = fleet_any
    t = AS_OF - 4 * DAY
    for i in range(20):
        fleet.event(f"n{i:02d}", t + timedelta(minutes=10 * i), state="DOWN",
                    reason="Not responding")
    fleet.ticket("n05", t + timedelta(hours=20), closed=t + 2 * DAY)
    for i in range(40):
        fleet.job([f"n{i:02d}"], end=AS_OF - DAY)
    fleet.event("n03", AS_OF - 2 * DAY, state="DOWN", reason="Not responding")  # its own
    f = lemon_features(fleet.engine, AS_OF)
    assert f.attrs["left_out"]["incident_days"][0]["nodes"] == 20
    assert f.loc["n03", OUTAGE_FEATURES].tolist() == [1, 0, 1, 1]
    assert f.loc[[f"n{i:02d}" for i in range(20) if i != 3], "out_count_history"].eq(0).all()
    assert f.loc["n05", "tickets_history"] == 0
    assert f.loc[[f"n{i:02d}" for i in range(20)], "incident_episodes"].eq(1).all()
    counted = lemon_features(fleet.engine, AS_OF, outages=OutageRules(incident_alpha=0.0))
    assert counted.loc["n05", ["out_count_history", "tickets_history"]].tolist() == [1, 1]
    assert counted["incident_episodes"].eq(0).all()


def test_a_few_nodes_out_together_still_count(fleet):
    t = AS_OF - 4 * DAY
    for i in range(3):  # three in a minute on a 40-node fleet: under 8 nodes and 5%
        fleet.event(f"n{i}", t + timedelta(seconds=20 * i), state="DOWN",
                    reason="Not responding")
    for i in range(3, 40):  # the fleet's usual trouble: an outage every other day
        fleet.event(f"n{i}", AS_OF - (10 + 2 * (i - 3)) * DAY, state="DOWN",
                    reason="Not responding")
    for i in range(40):
        fleet.job([f"n{i}"], end=AS_OF - DAY)
    f = lemon_features(fleet.engine, AS_OF)
    assert f.loc[["n0", "n1", "n2"], "out_count"].tolist() == [1, 1, 1]
    # three on a day is within what this fleet's rate allows: no incident day either
    assert f.attrs["left_out"]["incident_days"] == []


def test_fleet_threshold_is_the_smaller_of_count_and_share():
    rules = OutageRules((), 8, 0.05, 300)
    assert rules.fleet_threshold(100) == 5  # 5% of 100 nodes
    assert rules.fleet_threshold(16_000) == 8
    assert OutageRules((), 0, 0.0, 300).fleet_threshold(100) == float("inf")
    with pytest.raises(ValueError, match="regular expression"):
        OutageRules.from_config({"maintenance_reason_patterns": ["(unclosed"]})


def test_classify_outages_counts_distinct_nodes_not_rows():
    t0 = pd.Timestamp("2024-03-01 00:00:00")
    # one flapping node with ten events in a minute is not a fleet
    frame = pd.DataFrame({"node": ["n1"] * 10, "start": [t0 + pd.Timedelta(seconds=5 * i)
                                                        for i in range(10)],
                          "reason": ["Not responding"] * 10})
    kinds = classify_outages(frame, OutageRules((), 8, 0.0, 300), 100)
    assert (kinds == "node").all()


def test_lemon_features_of_one_cluster_only(fleet_any):
    from sqlalchemy import update

    from rsc_health.historian import schema

    fleet = fleet_any
    for node in ("a1", "a2", "b1"):
        fleet.job([node], end=AS_OF - DAY)
        fleet.event(node, AS_OF - 2 * DAY, state="DOWN", reason="Not responding")
    with fleet.engine.begin() as conn:
        for table in (schema.jobs, schema.node_events):
            conn.execute(update(table).values(cluster="alpha"))
        conn.execute(update(schema.node_events).where(schema.node_events.c.node == "b1")
                     .values(cluster="beta"))
        conn.execute(update(schema.jobs).where(schema.jobs.c.id.in_(
            conn.execute(schema.job_nodes.select().where(schema.job_nodes.c.node == "b1"))
            .scalars().all())).values(cluster="beta"))
    alpha = lemon_features(fleet.engine, AS_OF, cluster="alpha")
    beta = lemon_features(fleet.engine, AS_OF, cluster="beta")
    assert list(alpha.index) == ["a1", "a2"] and list(beta.index) == ["b1"]
    assert alpha["out_count"].tolist() == [1, 1] and beta.loc["b1", "out_count"] == 1
    assert list(lemon_features(fleet.engine, AS_OF).index) == ["a1", "a2", "b1"]


def test_an_outage_inside_a_maint_reservation_is_maintenance(fleet_any):
    """The reason says nothing of maintenance ("bob: cabling"), the reservation does."""
    from rsc_health.historian.ingest import reservations

    fleet = fleet_any
    start = AS_OF - 3 * DAY
    stamp = start.strftime("%Y-%m-%dT%H:%M:%S")
    end = (start + DAY).strftime("%Y-%m-%dT%H:%M:%S")
    report = reservations.ingest_text(fleet.engine, (
        "Cluster|Name|TimeStart|TimeEnd|Flags|NodeName\n"
        f"alpha|mx|{stamp}|{end}|MAINT,IGNORE_JOBS|n[1-2]\n"
        f"alpha|train|{stamp}|{end}|IGNORE_JOBS|n3\n"
        "alpha|broken|yesterday|x|MAINT|n4\n"
    ))
    assert report.written == 2 and [b.line for b in report.bad] == [4]
    fleet.event("n1", start - timedelta(minutes=30), reason="bob: cabling")  # drained ahead
    fleet.event("n2", start + 2 * DAY, reason="bob: cabling")  # after it ended: its own
    fleet.event("n3", start + timedelta(hours=1), reason="bob: cabling")  # not MAINT
    counts = _counts(fleet.engine)
    assert counts.loc[["n1", "n2", "n3"], "out_count"].tolist() == [0, 1, 1]


def test_every_pattern_the_config_accepts_classifies_and_counts_alike_everywhere():
    """Config validation compiles each maintenance pattern alone with Python's re. The
    filters used to join them with "|" and match through the string column's engine
    (pyarrow's RE2), which refuses a lookahead the config accepts: the reliability report,
    the lemon features and the counts of what was left out all raised. Now every site asks
    outages.planned_pattern, pattern by pattern, first match in the configured order."""
    from rsc_health.historian.outages import planned_pattern, removed_by_cause

    rules = OutageRules.from_config({"maintenance_reason_patterns": [
        "(?i)maint", r"(?i)swap(?=ped)", "(?i)upgrad"]})
    t0 = pd.Timestamp("2024-03-01 00:00:00")
    reasons = ["Maintenance window", "PSU swapped", "PSU swap failed", "OS upgrade",
               "rsc_health:now:xid79:gpu2 maintenance", "Not responding"]
    frame = pd.DataFrame({"node": [f"n{i}" for i in range(6)],
                          "start": [t0 + pd.Timedelta(hours=i) for i in range(6)],
                          "reason": reasons})
    kinds = classify_outages(frame, rules, 100)
    assert kinds.tolist() == ["maintenance", "maintenance", "node", "maintenance", "node",
                              "node"]
    assert [planned_pattern(r, rules) for r in reasons] == [
        "(?i)maint", r"(?i)swap(?=ped)", None, "(?i)upgrad", None, None]
    assert removed_by_cause(frame, kinds, rules, 100)["maintenance"] == {
        "(?i)maint": 1, r"(?i)swap(?=ped)": 1, "(?i)upgrad": 1}
