"""Telemetry in the historian, on SQLite and PostgreSQL: the nodes' `telemetry` spool records
land as samples exactly once, `load_samples` is the door to them, the rollups per multi-node
job and per node-day outside jobs say what the samples said, and retention forgets the samples
but keeps the rollups."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest
from sqlalchemy import func, inspect, select, text

from rsc_health import spool
from rsc_health.config import load_config
from rsc_health.historian import db, schema
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.retention import Retention, prune
from rsc_health.historian.telemetry import load_rollups, load_samples, rollup
from rsc_health.model import Metric

DAY = datetime(2026, 11, 20)
CFG = load_config(None)


def _record(node: str, when: datetime, metrics: dict, interval_s=300.0) -> dict:
    rec = spool.record("telemetry", node, when, source="sweep", job_id=None,
                       interval_s=interval_s, metrics=metrics)
    return rec


def _spool(tmp_path, records):
    sdir = tmp_path / "spool"
    spool.append(sdir, records)
    return sdir


def _samples(engine) -> list[tuple]:
    """(node, time, metric, value, component) rows, through the loader."""
    frame = load_samples(engine, datetime(2000, 1, 1), datetime(2100, 1, 1))
    return sorted(tuple(r) for r in frame.itertuples(index=False))


def test_telemetry_records_land_once_as_samples(historian, tmp_path):
    t = datetime.now().replace(microsecond=0) - timedelta(minutes=5)
    rec = _record("gpu001", t, {
        "throttle_hw_frac": {"value": 0.4, "component": "gpu3"},
        "gpu_temp_c": {"value": 71.0, "component": "gpu5"},
        "some_future_metric": {"value": 1.0, "component": "x"},  # a newer node: left out
    })
    report = deliver(historian, _spool(tmp_path, [rec, rec]))
    assert report.delivered.get("telemetry") == 2
    assert _samples(historian) == [("gpu001", t, "gpu_temp_c", 71.0, "gpu5"),
                                   ("gpu001", t, "throttle_hw_frac", 0.4, "gpu3")]
    deliver(historian, _spool(tmp_path, [rec]))  # delivered again: nothing more
    assert len(_samples(historian)) == 2


@pytest.mark.parametrize("bad", [{"value": "hot"}, {"value": float("nan")}, {"value": True},
                                 {"value": None}, "0.4", ["x"]])
def test_a_garbled_sample_is_quarantined_with_its_record(historian, tmp_path, bad):
    t = datetime.now().replace(microsecond=0) - timedelta(minutes=5)
    good = _record("gpu002", t, {"gpu_temp_c": {"value": 60, "component": "gpu0"}})
    garbled = _record("gpu001", t, {"gpu_temp_c": {"value": 60, "component": "gpu0"},
                                    "power_ratio": bad})
    report = deliver(historian, _spool(tmp_path, [garbled, good]))
    assert report.quarantined_count == 1
    assert [r[0] for r in _samples(historian)] == ["gpu002"]


@pytest.mark.parametrize("metric, value", [("pcie_link_ratio", -5.0), ("sm_clock_ratio", 3.0),
                                           ("throttle_hw_frac", -0.1), ("ib_xmit_wait_rate", -1.0),
                                           ("power_ratio", 11.0), ("gpu_temp_c", -40.0)])
def test_a_value_outside_its_metrics_range_is_quarantined_with_its_record(historian, tmp_path,
                                                                         metric, value):
    """A reading no node writes (model.RANGES: a ratio of a maximum in [0, 1] with a little
    headroom, rates never negative) is refused as a NaN is: stored, a node reporting a link
    ratio of -5 every sweep counted as one that moved with its job and hid another node's
    real downtrain from the fail-slow detector."""
    t = datetime.now().replace(microsecond=0) - timedelta(minutes=5)
    good = _record("gpu002", t, {metric: {"value": 1.0, "component": "gpu0"},
                                 "power_ratio": {"value": 1.047, "component": "gpu1"},
                                 "ib_link_ratio": {"value": 2.0, "component": "mlx5_0/1"}})
    garbled = _record("gpu001", t, {"gpu_temp_c": {"value": 60, "component": "gpu0"},
                                    metric: {"value": value, "component": "gpu0"}})
    report = deliver(historian, _spool(tmp_path, [garbled, good]))
    assert report.quarantined_count == 1
    assert "outside its range" in report.quarantined[0][1].message
    assert {r[0] for r in _samples(historian)} == {"gpu002"}


@pytest.mark.parametrize("tiny", [1e-50, -1e-45, 5e-324])
def test_a_value_too_small_for_a_4_byte_float_lands_as_zero_beside_the_rest(historian, tmp_path,
                                                                          tiny):
    """PostgreSQL's REAL refuses a non-zero value under about 1.2e-38 ("underflow"): one such
    sample failed the whole flush, every node's record behind it, and every retry. It is 0."""
    t = datetime.now().replace(microsecond=0) - timedelta(minutes=5)
    recs = [_record(f"gpu{i:03d}", t, {"gpu_temp_c": {"value": 50, "component": "gpu0"}})
            for i in range(4)]
    recs.insert(2, _record("odd001", t, {"pcie_replay_rate": {"value": tiny,
                                                              "component": "gpu1"}}))
    report = deliver(historian, _spool(tmp_path, recs))
    assert report.delivered.get("telemetry") == 5 and report.quarantined_count == 0
    rows = _samples(historian)
    assert len(rows) == 5
    assert ("odd001", t, "pcie_replay_rate", 0.0, "gpu1") in rows


def _insert_samples(engine, rows):
    """(node, time, metric, value, component) rows, stored as the delivery stores them: one
    row per (time, node)."""
    wide: dict[tuple, dict] = {}
    for n, t, m, v, c in rows:
        row = wide.setdefault((t, n), {"time": t, "node": n})
        row.update({m: v, f"{m}_c": c})
    names = [c.name for c in schema.telemetry_samples.columns]
    with engine.begin() as conn:
        conn.execute(schema.telemetry_samples.insert(),
                     [{k: row.get(k) for k in names} for row in wide.values()])


def _job(engine, pk: int, nodes: list[str], start, end) -> None:
    with engine.begin() as conn:
        conn.execute(schema.jobs.insert().values(
            id=pk, job_id=str(pk), job_id_display=str(pk), state="COMPLETED",
            submit=start, start=start, end=end, nnodes=len(nodes), gpus=8 * len(nodes),
            nodelist=",".join(nodes), instance_key=f"{pk}:{start}:{start}"))
        conn.execute(schema.job_nodes.insert(), [{"job_pk": pk, "node": n} for n in nodes])


def _sweeps(node: str, metric: str, start: datetime, hours: float, value, comp="gpu0"):
    n = int(hours * 12)
    return [(node, start + timedelta(minutes=5 * i), metric,
             value(i) if callable(value) else value, comp) for i in range(n)]


def test_load_samples_is_the_door_with_a_window_and_nodes(historian):
    rows = (_sweeps("a1", "gpu_temp_c", DAY, 2, 60.0)
            + _sweeps("a2", "gpu_temp_c", DAY, 2, 61.0)
            + _sweeps("a3", "sm_clock_ratio", DAY, 2, 0.9, "gpu7"))
    _insert_samples(historian, rows)
    frame = load_samples(historian, DAY + timedelta(hours=1), DAY + timedelta(hours=2),
                         nodes=["a2", "a3", "nowhere"])
    assert list(frame.columns) == ["node", "time", "metric", "value", "component"]
    assert set(frame["node"]) == {"a2", "a3"}
    assert len(frame) == 24
    assert frame["time"].min() == DAY + timedelta(hours=1)
    assert frame["time"].max() == DAY + timedelta(hours=1, minutes=55)
    assert str(frame["time"].dtype).startswith("datetime64")
    a3 = frame[frame["node"] == "a3"]
    assert set(a3["component"]) == {"gpu7"} and set(a3["metric"]) == {"sm_clock_ratio"}
    assert load_samples(historian, DAY, DAY + timedelta(days=1)).shape == (72, 5)
    # Two metrics of one sweep: two rows out of the one stored.
    _insert_samples(historian, [("a4", DAY, "gpu_temp_c", 50.0, "gpu1"),
                                ("a4", DAY, "power_ratio", 0.5, "gpu2")])
    a4 = load_samples(historian, DAY, DAY + timedelta(minutes=1), nodes=["a4"])
    assert [tuple(r) for r in a4.itertuples(index=False)] == [
        ("a4", DAY, "gpu_temp_c", 50.0, "gpu1"), ("a4", DAY, "power_ratio", 0.5, "gpu2")]


def test_rollups_per_job_and_per_node_day_outside_jobs(historian):
    """Two nodes in a 4-hour two-node job from 02:00; b1 ran hot in it (past 85 C half the
    time, gpu3 the hottest); outside the job both idled at 40 C. A one-node job (below the
    multi-node cut) is not a job here: its samples belong to the day."""
    hot = _sweeps("b1", "gpu_temp_c", DAY + timedelta(hours=2), 4,
                  lambda i: 90.0 if i % 2 else 80.0, "gpu3")
    cool = _sweeps("b2", "gpu_temp_c", DAY + timedelta(hours=2), 4, 70.0)
    idle = [r for node in ("b1", "b2") for r in
            _sweeps(node, "gpu_temp_c", DAY, 2, 40.0)
            + _sweeps(node, "gpu_temp_c", DAY + timedelta(hours=6), 18, 40.0)]
    _insert_samples(historian, hot + cool + idle)
    _job(historian, 7, ["b1", "b2"], DAY + timedelta(hours=2), DAY + timedelta(hours=5, minutes=59))
    _job(historian, 8, ["b1"], DAY + timedelta(hours=7), DAY + timedelta(hours=8))
    report = rollup(historian, DAY + timedelta(days=1, hours=2), CFG)
    assert (report.jobs, report.job_rows, report.days) == (1, 2, 1)
    jobs = load_rollups(historian, "job", DAY, DAY + timedelta(days=1)).set_index("node")
    days = load_rollups(historian, "day", date(2026, 11, 20), date(2026, 11, 21)) \
        .set_index("node")
    assert list(jobs.columns) == ["job_pk", "metric", "n", "mean", "min", "max", "past",
                                  "worst"]
    b1 = jobs.loc["b1"]
    assert (b1.job_pk, b1.metric, b1.n, b1["min"], b1["max"], b1.past, b1.worst) == (
        7, "gpu_temp_c", 48, 80.0, 90.0, 24, "gpu3")
    assert b1["mean"] == pytest.approx(85.0)
    assert (jobs.loc["b2"].n, jobs.loc["b2"].past, jobs.loc["b2"]["mean"]) == (48, 0, 70.0)
    assert days.loc["b1"].day == date(2026, 11, 20)
    assert (days.loc["b1"].n, days.loc["b1"]["max"], days.loc["b1"].past) == (24 + 216, 40.0, 0)
    # One row per node, NULL for the metrics it did not report.
    jr, dr = schema.telemetry_job_rollups, schema.telemetry_day_rollups
    with historian.connect() as conn:
        row = conn.execute(select(jr).where(jr.c.node == "b1")).one()._mapping
    # the row's sample count once (0016): a metric sampled every sweep has no n of its own
    assert row["sweeps"] == 48 and row["gpu_temp_c_n"] is None
    assert row["gpu_temp_c_min"] == 80.0 and row["sm_clock_ratio_min"] is None
    # Rolled up again: the same rows, not twice as many.
    rollup(historian, DAY + timedelta(days=1, hours=3), CFG)
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jr)).scalar() == 2
        assert conn.execute(select(func.count()).select_from(dr)).scalar() == 2


def test_a_day_is_not_rolled_up_before_it_settles_nor_a_running_job(historian):
    _insert_samples(historian, _sweeps("c1", "sm_clock_ratio", DAY + timedelta(hours=22), 2,
                                       0.5))
    with historian.begin() as conn:
        conn.execute(schema.jobs.insert().values(
            id=9, job_id="9", job_id_display="9", state="RUNNING", submit=DAY, start=DAY,
            end=None, nnodes=2, gpus=16, nodelist="c1,c2", instance_key="9:a:b"))
        conn.execute(schema.job_nodes.insert(), [{"job_pk": 9, "node": n}
                                                 for n in ("c1", "c2")])
    assert rollup(historian, DAY + timedelta(days=1, minutes=30), CFG).days == 0
    report = rollup(historian, DAY + timedelta(days=1, hours=2), CFG)
    # The day closed; its samples were all inside the running job: no day rows, no job rows.
    assert (report.days, report.day_rows, report.jobs) == (1, 0, 0)


def test_fraction_past_a_lower_is_worse_threshold(historian):
    ratios = _sweeps("d1", Metric.SM_CLOCK_RATIO.value, DAY, 1,
                     lambda i: 0.5 if i < 3 else 0.95, "gpu2")
    _insert_samples(historian, ratios)
    rollup(historian, DAY + timedelta(days=2), CFG)
    day = load_rollups(historian, "day", DAY.date(), DAY.date() + timedelta(days=1))
    (row,) = day.itertuples()
    assert (row.metric, row.n, row.past, row.min) == ("sm_clock_ratio", 12, 3, 0.5)
    # below the 0.6 of warn_below; 0.95 is stored as a 4-byte float on PostgreSQL
    assert row.max == pytest.approx(0.95, rel=1e-6)


def test_prune_forgets_old_samples_and_keeps_the_rollups(historian):
    now = datetime.now().replace(microsecond=0)
    old = now - timedelta(days=5)
    _insert_samples(historian, _sweeps("e1", "gpu_temp_c", old, 3, 50.0)
                    + _sweeps("e1", "gpu_temp_c", now - timedelta(hours=3), 1, 50.0))
    rollup(historian, now, CFG)
    counts = prune(historian, now, Retention(days=400, telemetry_days=3))
    assert counts["telemetry_samples"] == 36  # one row per sweep
    assert len(_samples(historian)) == 12
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(
            schema.telemetry_day_rollups)).scalar() >= 1


def _shape(engine, tables):
    insp = inspect(engine)
    return {t: (sorted((c["name"], c["nullable"]) for c in insp.get_columns(t)),
                sorted(i["name"] for i in insp.get_indexes(t)),
                sorted(insp.get_pk_constraint(t)["constrained_columns"])) for t in tables}


def test_upgrade_to_9_adds_the_telemetry_tables_as_a_new_database_has_them(tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("sqlite"):
        if mig.version <= 8:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 8
        with old.begin() as conn:
            conn.execute(text("INSERT INTO tickets (node, opened, reason, source) "
                              "VALUES ('gpu001', '2026-01-01 00:00:00', 'PSU', 'manual')"))
        assert 9 in db.migrate(old, 8)
        db.create(new)
        tables = ("telemetry_samples", "telemetry_job_rollups", "telemetry_day_rollups")
        assert _shape(old, tables) == _shape(new, tables)
        with old.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tickets")).scalar() == 1
            # WITHOUT ROWID: the key is the table, no second copy of each row.
            ddl = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = "
                                    "'telemetry_samples'")).scalar()
            assert "WITHOUT ROWID" in ddl
    finally:
        old.dispose()
        new.dispose()


@pytest.mark.postgres
def test_upgrade_to_9_on_postgresql_matches_a_new_database(pg_url, tmp_path):
    """The PostgreSQL file of 0009 builds what schema.py creates (4-byte floats included)."""
    from sqlalchemy import create_engine

    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("postgresql"):
        if mig.version <= 8:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(pg_url)
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{old.url.database}_new"')
    new = db.engine_for(old.url.set(database=f"{old.url.database}_new")
                        .render_as_string(hide_password=False))
    try:
        db.migrate(old, 0, old_dir)
        assert 9 in db.migrate(old, 8)
        db.create(new)
        tables = ("telemetry_samples", "telemetry_job_rollups", "telemetry_day_rollups")

        def typed(engine):
            insp = inspect(engine)
            return {t: sorted((c["name"], str(c["type"])) for c in insp.get_columns(t))
                    for t in tables}

        assert _shape(old, tables) == _shape(new, tables)
        assert typed(old) == typed(new)
        assert ("gpu_temp_c", "REAL") in typed(old)["telemetry_samples"]
    finally:
        old.dispose()
        new.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(
                f'DROP DATABASE IF EXISTS "{old.url.database}_new" WITH (FORCE)')
        admin.dispose()


def test_healthctl_ingest_telemetry_rolls_up(tmp_path):
    import json

    from click.testing import CliRunner

    from rsc_health.cli import cli

    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, upgrade=True, create_missing=True)
    try:
        day = datetime.combine(date.today() - timedelta(days=2), datetime.min.time())
        _insert_samples(engine, _sweeps("f1", "gpu_temp_c", day, 24, 50.0))
    finally:
        engine.dispose()
    res = CliRunner().invoke(cli, ["--db", url, "ingest", "telemetry", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["days"] in (1, 2) and report["day_rows"] == 1  # that day (and yesterday)
    again = json.loads(CliRunner().invoke(cli, ["--db", url, "ingest", "telemetry",
                                                "--json"]).output)
    assert again["days"] == 0  # the cursor moved past the closed days


def test_samples_delivered_from_spools_make_the_failslow_detector_find_the_slow_node(
        historian, tmp_path):
    """The contract end to end: eight nodes of one job spool their sweeps' telemetry records
    (the node path's kind), the flush delivers them, and the fail-slow detector, reading them
    through load_samples, names the one whose SM clock sat at 55% of its peers' for 30 min."""
    from rsc_health.historian.failslow import detect

    now = datetime.now().replace(microsecond=0, second=0)
    start = now - timedelta(minutes=50)
    nodes = [f"g{i:03d}" for i in range(8)]
    _job(historian, 31, nodes, start, None)
    records = []
    for k in range(9):
        t = now - timedelta(minutes=45 - 5 * k)
        for node in nodes:
            slow = node == "g005" and k >= 3
            records.append(_record(node, t, {
                "sm_clock_ratio": {"value": 0.52 if slow else 0.95 + 0.001 * int(node[1:]),
                                   "component": "gpu6" if slow else "gpu0"},
                "gpu_temp_c": {"value": 64.0, "component": "gpu1"},
            }))
    deliver(historian, _spool(tmp_path, records))
    found = detect(historian, now, CFG)
    assert {(e.node, e.metric, e.source) for e in found} == {
        ("g005", "sm_clock_ratio", "telemetry")}
    (ev,) = found
    assert ev.value == pytest.approx(0.52, abs=1e-6) and ev.peer_median > 0.9
    assert ev.job_ids == ("31",)


def test_a_metric_constant_over_a_job_is_stored_once_and_read_back_whole(historian):
    """A link ratio at 1.0 and an error rate at 0 the whole job keep their value once (min;
    mean and max NULL, no bytes); read back, mean and max are that value. A metric that moved
    keeps all three, and its worst component either way."""
    rows = (_sweeps("c1", "pcie_link_ratio", DAY, 2, 1.0, "gpu2")
            + _sweeps("c1", "ib_error_rate", DAY, 2, 0.0, "mlx5_0/1")
            + _sweeps("c1", "gpu_temp_c", DAY, 2, lambda i: 60.0 + i % 3)
            + _sweeps("c2", "pcie_link_ratio", DAY, 2, 0.5, "gpu5")
            + _sweeps("c2", "ib_error_rate", DAY, 2, lambda i: 0.5 if i == 3 else 0.0,
                      "mlx5_4/1"))
    _insert_samples(historian, rows)
    _job(historian, 9, ["c1", "c2"], DAY, DAY + timedelta(hours=2))
    rollup(historian, DAY + timedelta(hours=4), CFG)
    jr = schema.telemetry_job_rollups
    with historian.connect() as conn:
        c1 = conn.execute(select(jr).where(jr.c.node == "c1")).one()._mapping
    assert (c1["pcie_link_ratio_min"], c1["pcie_link_ratio_mean"], c1["pcie_link_ratio_max"]) \
        == (1.0, None, None)
    assert c1["ib_error_rate_mean"] is None and c1["gpu_temp_c_max"] == 62.0
    assert (c1["sweeps"], c1["gpu_temp_c_n"], c1["ib_error_rate_n"]) == (24, None, None)
    got = load_rollups(historian, "job", DAY, DAY + timedelta(days=1)).set_index(
        ["node", "metric"])
    assert tuple(got.loc[("c1", "ib_error_rate"), ["n", "mean", "min", "max", "past"]]) == (
        24, 0.0, 0.0, 0.0, 0)
    c2 = got.loc[("c2", "pcie_link_ratio")]
    assert (c2["mean"], c2["max"], c2["past"], c2["worst"]) == (0.5, 0.5, 24, "gpu5")
    moved = got.loc[("c2", "ib_error_rate")]
    assert (moved["min"], moved["max"], moved["worst"]) == (0.0, 0.5, "mlx5_4/1")
    assert moved["mean"] == pytest.approx(0.5 / 24)


def test_a_metric_sampled_in_fewer_sweeps_keeps_its_own_count(historian):
    """NVLink throughput only while a GPU is busy: 6 of the job's 24 sweeps. The row keeps 24
    once (sweeps) and the throughput its own 6; both read back as they were."""
    rows = (_sweeps("d1", "gpu_temp_c", DAY, 2, 60.0)
            + _sweeps("d1", "nvlink_data_rate", DAY, 0.5, lambda i: 4e10 + i, "gpu1")
            + _sweeps("d2", "gpu_temp_c", DAY, 2, 61.0))
    _insert_samples(historian, rows)
    _job(historian, 11, ["d1", "d2"], DAY, DAY + timedelta(hours=2))
    rollup(historian, DAY + timedelta(hours=4), CFG)
    jr = schema.telemetry_job_rollups
    with historian.connect() as conn:
        d1 = conn.execute(select(jr).where(jr.c.node == "d1")).one()._mapping
    assert (d1["sweeps"], d1["gpu_temp_c_n"], d1["nvlink_data_rate_n"]) == (24, None, 6)
    got = load_rollups(historian, "job", DAY, DAY + timedelta(days=1)).set_index(
        ["node", "metric"])
    assert got.loc[("d1", "gpu_temp_c"), "n"] == 24
    assert got.loc[("d1", "nvlink_data_rate"), "n"] == 6
    assert ("d2", "nvlink_data_rate") not in got.index


@pytest.mark.postgres
def test_two_rollups_at_once_take_turns_instead_of_one_failing_on_the_key(pg_url, monkeypatch):
    """Two `healthctl ingest telemetry` runs at once (two ingest timers overlapping, one run by
    hand): the second starts while the first is between its delete and its insert of a job's
    rollup. Both deleted nothing and inserted the same (job, node) keys: the second failed on
    a duplicate key and its run was lost. Now they take turns, and the rows are the job's."""
    import threading

    from rsc_health.historian import telemetry

    engine = db.connect(pg_url, create_missing=True)
    _insert_samples(engine, _sweeps("e1", "gpu_temp_c", DAY + timedelta(hours=2), 2, 70.0)
                    + _sweeps("e2", "gpu_temp_c", DAY + timedelta(hours=2), 2, 72.0))
    _job(engine, 11, ["e1", "e2"], DAY + timedelta(hours=2), DAY + timedelta(hours=4))
    now = DAY + timedelta(days=1, hours=2)
    errors: list[Exception] = []

    def second_run() -> None:  # a process of its own: an engine of its own
        other_engine = db.connect(pg_url, create_missing=True)
        try:
            rollup(other_engine, now, CFG)
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            errors.append(exc)
        finally:
            other_engine.dispose()

    real, other = telemetry._insert, threading.Thread(target=second_run)

    def insert_after_the_other_began(conn, table, rows):
        if not other.is_alive() and other.ident is None:
            other.start()
            other.join(1.5)  # it commits meanwhile (before) or waits its turn (now)
        real(conn, table, rows)

    monkeypatch.setattr(telemetry, "_insert", insert_after_the_other_began)
    try:
        rollup(engine, now, CFG)
    finally:
        other.join(30)
    assert errors == []
    jobs = load_rollups(engine, "job", DAY, DAY + timedelta(days=1)).set_index("node")
    assert sorted(jobs.index) == ["e1", "e2"] and list(jobs["n"]) == [24, 24]
    assert (jobs.loc["e2"]["min"], jobs.loc["e2"].job_pk) == (72.0, 11)
    engine.dispose()


def test_samples_a_node_delivers_late_still_land_in_their_day_and_job_rollups(historian):
    """A node cut off from the historian for a few hours (its flush failing, its network
    down) delivers its spool once back: its samples of a day and a job already rolled up
    (SETTLE after they ended) were in no rollup, for good once retention pruned them. A
    second pass, LATE after the first, rolls each day and job up again with them."""
    from rsc_health.historian.telemetry import LATE, SETTLE

    _job(historian, 21, ["f1", "f2"], DAY + timedelta(hours=20), DAY + timedelta(hours=22))
    on_time = (_sweeps("f1", "gpu_temp_c", DAY, 20, 40.0)  # f1's day before the job
               + _sweeps("h1", "gpu_temp_c", DAY + timedelta(days=1), 30, 30.0)  # the fleet
               + _sweeps("f1", "gpu_temp_c", DAY + timedelta(hours=20), 2, 80.0)
               + _sweeps("f2", "gpu_temp_c", DAY + timedelta(hours=20), 2, 81.0))
    late = (_sweeps("f3", "gpu_temp_c", DAY + timedelta(hours=18), 6, 50.0)  # f3: cut off
            + _sweeps("f2", "gpu_temp_c", DAY + timedelta(hours=22, minutes=5), 1, 99.0)
            + _sweeps("f2", "gpu_temp_c", DAY + timedelta(hours=21, minutes=2), 0.5, 90.0))
    _insert_samples(historian, on_time)
    first = DAY + timedelta(days=1) + SETTLE + timedelta(minutes=5)
    report = rollup(historian, first, CFG)
    assert (report.jobs, report.days, report.late_jobs, report.late_days) == (1, 1, 0, 0)
    _insert_samples(historian, late)  # f3 and f2 flush hours after the first pass
    assert rollup(historian, first + timedelta(hours=3), CFG).late_days == 0  # not yet due
    report = rollup(historian, first + LATE + timedelta(hours=1), CFG)
    assert (report.late_jobs, report.late_days) == (1, 1)
    assert "came late" in report.summary()
    days = load_rollups(historian, "day", DAY.date(), DAY.date() + timedelta(days=1))
    days = days.set_index("node")
    assert sorted(days.index) == ["f1", "f2", "f3"]  # h1 sampled from the day after
    assert (days.loc["f3"].n, days.loc["f3"]["max"]) == (72, 50.0)
    assert (days.loc["f2"].n, days.loc["f2"]["max"]) == (12, 99.0)  # after the job, late
    jobs = load_rollups(historian, "job", DAY, DAY + timedelta(days=1)).set_index("node")
    assert (jobs.loc["f2"].n, jobs.loc["f2"]["max"]) == (24 + 6, 90.0)
    assert (jobs.loc["f1"].n, jobs.loc["f1"]["max"]) == (24, 80.0)
    # Done once: a later run rolls neither up a third time.
    again = rollup(historian, first + LATE + timedelta(hours=2), CFG)
    assert (again.jobs, again.days, again.late_jobs, again.late_days) == (0, 0, 0, 0)


def test_a_clock_jumped_ahead_does_not_move_the_day_cursor_past_days_to_come(historian):
    """The historian host's clock a year ahead for one run (a bad NTP answer, an RTC reset)
    rolled up a year of days that had not happened, empty, and moved the day cursor past
    them: once the clock was right again no day was rolled up for a year, and the samples
    went with retention. No day after the newest sample's is rolled up now (nor passed by
    the second pass's cursors)."""
    _insert_samples(historian, _sweeps("g1", "gpu_temp_c", DAY, 24, 60.0))
    assert rollup(historian, DAY + timedelta(days=400), CFG).days == 1  # DAY only
    _insert_samples(historian, _sweeps("g1", "gpu_temp_c", DAY + timedelta(days=1), 48, 61.0))
    assert rollup(historian, DAY + timedelta(days=2, hours=2), CFG).days == 1
    days = load_rollups(historian, "day", DAY.date(), DAY.date() + timedelta(days=2))
    assert sorted(zip(days["day"], days["min"], strict=True)) == [(DAY.date(), 60.0),
                                                     (DAY.date() + timedelta(days=1), 61.0)]
    # the second pass's cursors did not jump either: samples of the day after, delivered
    # late, still land in it
    _insert_samples(historian, _sweeps("g2", "gpu_temp_c", DAY + timedelta(days=1), 2, 70.0))
    assert rollup(historian, DAY + timedelta(days=3, hours=2), CFG).late_days == 1


def test_the_second_pass_rewrites_and_rereads_nothing_when_nothing_came_late(historian,
                                                                           monkeypatch):
    """The second pass read every job's and day's samples whole once more and deleted and
    rewrote their rollup rows, though almost always nothing came late: twice the rollup's
    reads, and on PostgreSQL a dead version of every rollup row (bench_telemetry_storage, the
    timer's hourly runs at 200 nodes: 34.7 MB/day at 16,000 nodes, over issue 25's 25 MB). It
    counts a job's or day's samples first now, and rolls it up again only when there are more
    than its rows hold: here job 32, one of whose nodes flushed a sample late."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from rsc_health.historian import telemetry
    from rsc_health.historian.telemetry import LATE, SETTLE

    _job(historian, 31, ["k1", "k2"], DAY + timedelta(hours=20), DAY + timedelta(hours=22))
    _job(historian, 32, ["k3", "k4"], DAY + timedelta(hours=10), DAY + timedelta(hours=12))
    _insert_samples(historian, _sweeps("k1", "gpu_temp_c", DAY, 24, 60.0)
                    + _sweeps("k2", "gpu_temp_c", DAY + timedelta(hours=20), 2, 70.0)
                    + _sweeps("k3", "gpu_temp_c", DAY + timedelta(hours=10), 2, 71.0)
                    + _sweeps("k4", "gpu_temp_c", DAY + timedelta(hours=10), 1, 72.0)
                    + _sweeps("k5", "gpu_temp_c", DAY + timedelta(days=1), 30, 30.0))
    first = DAY + timedelta(days=1) + SETTLE + timedelta(minutes=5)
    report = rollup(historian, first, CFG)
    assert (report.jobs, report.days) == (2, 1)
    jobs = load_rollups(historian, "job", DAY, DAY + timedelta(days=1))
    day = load_rollups(historian, "day", DAY.date(), DAY.date() + timedelta(days=1))
    # k4 flushes its second hour of job 32 late
    _insert_samples(historian, _sweeps("k4", "gpu_temp_c", DAY + timedelta(hours=11), 1, 90.0))
    statements: list[str] = []
    second_pass = []  # what the second pass asks of the database, not the first

    def seen(conn, cursor, statement, *args):
        if second_pass:
            statements.append(" ".join(statement.split()))

    def late_pass(*args, inner=telemetry._late_pass):
        second_pass.append(True)
        return inner(*args)

    monkeypatch.setattr(telemetry, "_late_pass", late_pass)
    event.listen(Engine, "before_cursor_execute", seen)
    try:
        report = rollup(historian, first + LATE + timedelta(hours=1), CFG)
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    assert (report.late_jobs, report.late_days) == (1, 0)
    rewrites = [s.split(" WHERE")[0].split(" (")[0] for s in statements
                if s.startswith(("DELETE FROM telemetry_", "INSERT INTO telemetry_"))]
    assert rewrites == ["DELETE FROM telemetry_job_rollups", "INSERT INTO telemetry_job_rollups"]
    # the samples' values read again once (job 32's), the others' counted only
    assert len([s for s in statements if "telemetry_samples.gpu_temp_c" in s]) == 1
    again = load_rollups(historian, "job", DAY, DAY + timedelta(days=1))
    assert again[again["job_pk"] == 31].equals(jobs[jobs["job_pk"] == 31])
    k4 = again[again["node"] == "k4"].iloc[0]
    assert (k4["n"], k4["max"]) == (24, 90.0)
    assert load_rollups(historian, "day", DAY.date(), DAY.date() + timedelta(days=1)).equals(day)
