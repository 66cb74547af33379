"""The lab's one door from a simulated fleet to a historian (rsc_health.sim.historian): every
file the simulator writes lands, the nodes' heartbeats included, and the job failures are
attributed; a second run into the same directory starts from an empty historian."""

from __future__ import annotations

from sqlalchemy import func, select

from rsc_health.historian import db as hdb
from rsc_health.historian import schema
from rsc_health.sim import SimConfig
from rsc_health.sim.historian import ingest_fleet, simulated_historian


def _count(engine, table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_a_simulated_fleet_lands_whole_in_a_fresh_historian(tmp_path):
    fleet = simulated_historian(SimConfig(nodes=64, days=20, seed=5), tmp_path / "fleet")
    sim = fleet.sim
    engine = hdb.connect(fleet.url, create_missing=True)
    try:
        assert _count(engine, schema.jobs) == sim.instances  # one row per sacct row
        # the heartbeats were delivered as a node's flush delivers them: taken from the spool
        assert _count(engine, schema.node_runs) > 0
        assert not sim.files["spool/pending.jsonl"].exists()
        assert _count(engine, schema.job_exclusions) > 0
        assert _count(engine, schema.check_results) > 0
        events = sim.files["events.txt"].read_text().splitlines()[1:]
        assert _count(engine, schema.node_events) == sum(1 for line in events if line.strip())
        # the jobs an injected failure killed (truth.json) were attributed to it
        killed = [j for f in fleet.truth["failures"] for j in f["jobs"]]
        assert killed and _count(engine, schema.attributions) > 0
    finally:
        engine.dispose()
    assert fleet.as_of.isoformat().startswith("2024-01-21")  # start + 20 days (SimConfig)

    again = simulated_historian(SimConfig(nodes=64, days=20, seed=5), tmp_path / "fleet")
    engine = hdb.connect(again.url, create_missing=True)
    try:  # the earlier run's rows are gone, not doubled
        assert _count(engine, schema.jobs) == sim.instances
    finally:
        engine.dispose()


def test_ingesting_a_fleet_twice_changes_nothing(tmp_path):
    """The loaders are idempotent, so the door is too: the same fleet ingested twice into one
    historian holds the same rows."""
    fleet = simulated_historian(SimConfig(nodes=8, days=4, seed=2), tmp_path / "fleet")
    engine = hdb.connect(fleet.url, create_missing=True)
    try:
        tables = (schema.jobs, schema.check_results, schema.node_events, schema.job_exclusions,
                  schema.tickets)
        before = [_count(engine, t) for t in tables]
        seconds = ingest_fleet(engine, fleet.out)
        assert [_count(engine, t) for t in tables] == before
        assert set(seconds) == {"sacct.txt", "events.txt", "checks.jsonl", "exclusions.jsonl",
                                "tickets.csv", "spool"}
    finally:
        engine.dispose()
