"""Migration 0013 adds node_versions (each node's driver and GPU firmware as its heartbeats
said them, rsc_health.historian.versions); a database at version 12 keeps every row and ends as
a new one starts. Delivery folds the heartbeats in: the first sight is no change, a new driver
or VBIOS is, a run where NVML would not say the firmware is not, and garbled versions cost
their fields, never the heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import inspect, select, text

from rsc_health import spool
from rsc_health.historian import db, schema, versions
from rsc_health.historian.ingest.delivery import deliver

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def _shape(engine, tables):
    insp = inspect(engine)
    return {t: (sorted((c["name"], c["nullable"]) for c in insp.get_columns(t)),
                sorted(i["name"] for i in insp.get_indexes(t)),
                sorted(insp.get_pk_constraint(t)["constrained_columns"])) for t in tables}


def test_upgrade_from_12_adds_node_versions_as_a_new_database_has_it(tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("sqlite"):
        if mig.version <= 12:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 12
        with old.begin() as conn:
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        applied = db.migrate(old, 12)
        assert 13 in applied and applied[-1] == schema.SCHEMA_VERSION
        db.create(new)
        assert _shape(old, ("node_versions",)) == _shape(new, ("node_versions",))
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
    finally:
        old.dispose()
        new.dispose()


def _beat(node, minutes, vers):
    extra = {} if vers is None else {"versions": vers}
    return spool.record("heartbeat", node, T0 + timedelta(minutes=minutes), source="sweep",
                        level="ok", checker_errors=0, duration_s=0.3, families={}, version="t",
                        **extra)


def _deliver(historian, tmp_path, records):
    d = tmp_path / f"spool{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    spool.append(d, records)
    report = deliver(historian, d)
    assert report.quarantined_count == 0
    return report


def _rows(historian):
    t = schema.node_versions
    with historian.connect() as conn:
        return {r.node: (r.versions, r.previous) for r in conn.execute(select(t))}


A = {"driver": "570.133.20", "vbios": {str(i): "96.00.AF.00.01" for i in range(8)},
     "inforom": {str(i): "G520.0200.00.05" for i in range(8)}}


def test_a_new_driver_is_a_change_the_first_sight_and_a_quiet_firmware_are_not(historian,
                                                                               tmp_path):
    _deliver(historian, tmp_path, [_beat("gpu070", 0, A), _beat("gpu071", 0, A)])
    first = "driver=570.133.20 vbios=96.00.AF.00.01 inforom=G520.0200.00.05"
    assert _rows(historian) == {"gpu070": (first, None), "gpu071": (first, None)}
    # NVML would not say the firmware, one GPU is missing, an older node sends nothing.
    _deliver(historian, tmp_path, [
        _beat("gpu070", 5, {"driver": "570.133.20"}),
        _beat("gpu071", 5, {**A, "vbios": {str(i): "96.00.AF.00.01" for i in range(7)}}),
        _beat("gpu070", 6, None)])
    with historian.connect() as conn:
        assert versions.changes(conn) == {}
    upgraded = {**A, "driver": "580.95.05",
                "vbios": {**A["vbios"], "3": "96.00.AF.00.02"}}
    _deliver(historian, tmp_path, [_beat("gpu070", 10, upgraded)])
    rows = _rows(historian)
    assert rows["gpu070"] == (
        "driver=580.95.05 vbios=96.00.AF.00.01+96.00.AF.00.02 inforom=G520.0200.00.05", first)
    with historian.connect() as conn:
        since, previous, now = versions.changes(conn)["gpu070"]
    assert since == (T0 + timedelta(minutes=10)).replace(tzinfo=None) and previous == first
    # A heartbeat older than what was folded in (a late spool) changes nothing back.
    _deliver(historian, tmp_path, [_beat("gpu070", 7, A)])
    assert _rows(historian)["gpu070"] == rows["gpu070"]


def test_garbled_or_hostile_versions_cost_their_fields_never_the_heartbeat(historian, tmp_path):
    report = _deliver(historian, tmp_path, [
        _beat("gpu072", 0, {"driver": "'; DROP TABLE jobs; --" + "9" * 900,
                            "vbios": ["not", "a", "map"], "inforom": {"0": 7, "1": "\x00\x07"}}),
        _beat("gpu073", 0, "not a map"),
        _beat("gpu074", 0, {"vbios": {str(i): f"{i}" * 80 for i in range(64)}}),
    ])
    assert report.delivered.get("heartbeat") == 3
    rows = _rows(historian)
    assert set(rows) == {"gpu072", "gpu074"}
    assert rows["gpu072"][0].startswith("driver='DROPTABLEjobs--999")
    assert len(rows["gpu072"][0]) <= versions.MAX_TEXT
    assert len(rows["gpu074"][0]) <= versions.MAX_TEXT and " #" in rows["gpu074"][0]
    with historian.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 0


def test_the_nodes_own_form_the_distinct_values_reads_as_the_per_gpu_map_does(historian,
                                                                              tmp_path):
    as_list = {"driver": "570.133.20", "vbios": ["96.00.AF.00.02", "96.00.AF.00.01"],
               "inforom": ["G520.0200.00.05"]}
    as_map = {"driver": "570.133.20",
              "vbios": {"0": "96.00.AF.00.01", "1": "96.00.AF.00.02"},
              "inforom": {"0": "G520.0200.00.05", "1": "G520.0200.00.05"}}
    _deliver(historian, tmp_path, [_beat("gpu090", 0, as_list), _beat("gpu091", 0, as_map)])
    rows = _rows(historian)
    assert rows["gpu090"] == rows["gpu091"] == (
        "driver=570.133.20 vbios=96.00.AF.00.01+96.00.AF.00.02 inforom=G520.0200.00.05", None)
