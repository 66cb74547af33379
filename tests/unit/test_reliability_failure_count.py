"""The fleet-wide-event filter of `healthctl reliability` sizes "the fleet"
by the nodes that had an outage, not by the fleet, so a handful of independent node failures
that happen to start within fleet_event_window_s of each other vanish from the figures."""

from __future__ import annotations

import io
from datetime import datetime, timedelta

from sqlalchemy import insert

from rsc_health.historian import db, schema
from rsc_health.historian.ingest import events, inventory
from rsc_health.historian.metrics.reliability import failures, reliability

T0 = datetime(2026, 1, 1)


def test_five_of_200_nodes_failing_within_minutes_are_still_five_failures(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    nodes = [f"n{i:03d}" for i in range(200)]
    inventory.import_lines(engine, io.StringIO("node,cluster,partition,from,to\n" + "".join(
        f"{n},c,p,{T0:%Y-%m-%dT%H:%M:%S},\n" for n in nodes)))
    # five nodes, five different faults, starting one minute apart (a busy hour, not an event)
    t = T0 + timedelta(days=10)
    reasons = ["PSU", "DIMM", "GPU fell off the bus", "IB link down", "Not responding"]
    lines = ["NodeName|TimeStart|TimeEnd|State|Reason"] + [
        f"{n}|{t + timedelta(minutes=i):%Y-%m-%dT%H:%M:%S}|"
        f"{t + timedelta(hours=3):%Y-%m-%dT%H:%M:%S}|DOWN|{r}"
        for i, (n, r) in enumerate(zip(nodes[:5], reasons, strict=True))]
    events.ingest_text(engine, "\n".join(lines) + "\n")

    # default_config.toml: fleet-wide = fleet_event_nodes (8) or fleet_event_share (5%) of the
    # fleet (200 nodes: 10), the smaller: 8. Five nodes are below it: five failures.
    df = reliability(engine, T0, datetime(2026, 4, 1))
    try:
        assert df["failures"].sum() == 5, (df.to_dict("records"), df.attrs["left_out"])
    finally:
        engine.dispose()


def test_an_outage_and_its_xid_in_the_same_second_are_one_failure(tmp_path):
    """reliability.failures: "one failure per node and second: an outage and its XID are
    one". The node path stamps an XID with sub-second precision; slurmdbd's outage has whole
    seconds."""
    import json

    from rsc_health.historian.ingest import checks

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    inventory.import_lines(engine, io.StringIO(
        f"node,cluster,partition,from,to\na,c,p,{T0:%Y-%m-%dT%H:%M:%S},\n"))
    t = T0 + timedelta(days=3)
    events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                       f"a|{t:%Y-%m-%dT%H:%M:%S}|{t + timedelta(hours=2):%Y-%m-%dT%H:%M:%S}"
                       "|DRAIN|rsc_health:now:xid79:GPU fell off the bus\n")
    checks.ingest_lines(engine, io.StringIO(json.dumps(
        {"time": (t + timedelta(milliseconds=400)).isoformat(), "node": "a", "check": "xid",
         "status": "fail", "code": "xid79"}) + "\n"))
    df = reliability(engine, T0, datetime(2026, 4, 1))
    engine.dispose()
    assert df["failures"].sum() == 1, df.to_dict("records")


def test_an_xid_and_the_drain_it_caused_half_a_second_later_are_one_failure(tmp_path):
    """helper-213: matching by floor-second split an XID at 10:00:00.700 and the drain the
    same run made at 10:00:01.2 (slurmdbd: 10:00:01) into two failures of one node."""
    import json

    from rsc_health.historian.ingest import checks

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    inventory.import_lines(engine, io.StringIO(
        f"node,cluster,partition,from,to\na,c,p,{T0:%Y-%m-%dT%H:%M:%S},\n"))
    t = T0 + timedelta(days=3, hours=10)
    events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                       f"a|{t + timedelta(seconds=1):%Y-%m-%dT%H:%M:%S}|"
                       f"{t + timedelta(hours=2):%Y-%m-%dT%H:%M:%S}"
                       "|DRAIN|rsc_health:now:xid79:GPU fell off the bus\n")
    checks.ingest_lines(engine, io.StringIO(json.dumps(
        {"time": (t + timedelta(milliseconds=700)).isoformat(), "node": "a", "check": "xid",
         "status": "fail", "code": "xid79"}) + "\n"))
    df = reliability(engine, T0, datetime(2026, 4, 1))
    engine.dispose()
    assert df["failures"].sum() == 1, df.to_dict("records")


def test_an_xid_a_minute_before_an_outage_is_a_failure_of_its_own(tmp_path):
    """The tolerance is the drain's latency, not a window that merges separate faults."""
    import json

    from rsc_health.historian.ingest import checks

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    inventory.import_lines(engine, io.StringIO(
        f"node,cluster,partition,from,to\na,c,p,{T0:%Y-%m-%dT%H:%M:%S},\n"))
    t = T0 + timedelta(days=3, hours=10)
    events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                       f"a|{t + timedelta(minutes=1):%Y-%m-%dT%H:%M:%S}|"
                       f"{t + timedelta(hours=2):%Y-%m-%dT%H:%M:%S}|DOWN|PSU\n")
    checks.ingest_lines(engine, io.StringIO(json.dumps(
        {"time": t.isoformat(), "node": "a", "check": "xid", "status": "fail",
         "code": "xid48"}) + "\n"))
    df = reliability(engine, T0, datetime(2026, 4, 1))
    engine.dispose()
    assert df["failures"].sum() == 2, df.to_dict("records")

def _inventoried(tmp_path, nodes):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True, create_missing=True)
    inventory.import_lines(engine, io.StringIO("node,cluster,partition,from,to\n" + "".join(
        f"{n},c,p,{T0:%Y-%m-%dT%H:%M:%S},\n" for n in nodes)))
    return engine


def test_an_outage_inside_a_maint_reservation_is_not_a_failure_in_reliability(tmp_path):
    """helper-213: reliability.failures() never read the MAINT reservations: a node down
    inside one (reason 'Not responding': the firmware flash rebooted it) was a failure there
    while lemons and attribution call it maintenance."""
    engine = _inventoried(tmp_path, nodes=[f"n{i:02d}" for i in range(40)])
    t = T0 + timedelta(days=10)
    with engine.begin() as conn:
        conn.execute(insert(schema.reservations).values(
            cluster="", name="fw_upgrade", start=t, end=t + timedelta(hours=8),
            flags="MAINT,IGNORE_JOBS", nodelist="n00"))
    events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                       f"n00|{t + timedelta(hours=1):%Y-%m-%dT%H:%M:%S}|"
                       f"{t + timedelta(hours=2):%Y-%m-%dT%H:%M:%S}|DOWN|Not responding\n")
    import pandas as pd

    from rsc_health.historian.outages import (
        OutageRules,
        maintenance_reservations,
        planned_maintenance,
    )
    row = pd.DataFrame([{"node": "n00", "start": t + timedelta(hours=1),
                         "reason": "Not responding"}])
    # the rule attribution and the lemon features apply: maintenance
    assert planned_maintenance(row, OutageRules(),
                               maintenance_reservations(engine, datetime.max)).all()
    f = failures(engine, T0, datetime(2026, 4, 1))
    engine.dispose()
    assert f.empty, f.to_dict("records")
