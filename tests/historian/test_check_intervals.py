"""Check results as state: sweeps that see the same state extend one interval, a change closes
it and opens the next, and redelivered or late runs change nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import select

from rsc_health import spool
from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.attribute import attribute
from rsc_health.historian.freshness import node_freshness
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.retention import Retention, prune
from rsc_health.model import Finding, Severity, Status, new_record_id

T0 = datetime(2024, 3, 1, 0, 0, tzinfo=UTC)
OK_IB = Finding("infiniband", "mlx5_0/1", Status.OK, Severity.NONE, "ACTIVE")
IB_DOWN = Finding("infiniband", "mlx5_0/1", Status.FAIL, Severity.DRAIN_NOW, "port DOWN",
                  code="ib_down")
ECC_OK = Finding("ecc", "gpu0", Status.OK, Severity.NONE, "clean")


def _sweep(node: str, i: int, findings: list[Finding], level: str = "ok") -> list[dict]:
    t = T0 + timedelta(minutes=5 * i)
    recs = spool.check_records(findings, node=node, source="sweep", time=t, job_id=None)
    recs.append({"kind": "heartbeat", "id": new_record_id(), "time": t.isoformat(),
                 "node": node, "source": "sweep",
                 "level": level, "checker_errors": 0, "duration_s": 0.2, "families": {},
                 "version": "test"})
    return recs


def _rows(engine):
    c = schema.check_results
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            select(c).order_by(c.c.node, c.c.check, c.c.time, c.c.component))]


def _deliver(engine, tmp_path, records):
    spool.append(tmp_path, records)
    return deliver(engine, tmp_path)


def test_a_day_of_unchanged_sweeps_is_one_interval_per_family(historian, tmp_path):
    records = [r for i in range(288) for r in _sweep("gpu001", i, [OK_IB, ECC_OK])]
    report = _deliver(historian, tmp_path, records)
    rows = _rows(historian)
    assert len(rows) == 2  # ecc "*" and infiniband "*" all-clear intervals, not 576 rows
    assert all(r["is_open"] and r["status"] == "ok" for r in rows)
    last = (T0 + timedelta(minutes=5 * 287)).replace(tzinfo=None)
    assert {r["last_seen"] for r in rows} == {last}
    assert report.delivered["check"] == 576 and report.opened == 2


def test_a_change_closes_the_interval_and_opens_the_next(historian, tmp_path):
    seq = [[OK_IB], [OK_IB], [IB_DOWN], [IB_DOWN], [IB_DOWN], [OK_IB]]
    _deliver(historian, tmp_path, [r for i, f in enumerate(seq) for r in _sweep("n1", i, f)])
    rows = _rows(historian)
    states = [(r["component"], r["status"], r["time"].minute, r["last_seen"].minute,
               r["is_open"]) for r in rows]
    assert states == [
        ("*", "ok", 0, 5, False),
        ("mlx5_0/1", "fail", 10, 20, False),
        ("*", "ok", 25, 25, True),
    ]


def test_redelivered_and_late_runs_change_nothing(historian, tmp_path):
    first = [r for i in range(3) for r in _sweep("n1", i, [IB_DOWN])]
    later = [r for i in range(3, 5) for r in _sweep("n1", i, [OK_IB])]
    _deliver(historian, tmp_path, first + later)
    before = _rows(historian)
    # the whole batch again (a flush killed after its commit), and an old run arriving late
    _deliver(historian, tmp_path, first + later)
    _deliver(historian, tmp_path, _sweep("n1", 1, [IB_DOWN]))
    assert _rows(historian) == before
    with historian.connect() as conn:
        runs = conn.execute(select(schema.heartbeat_days.c.runs)).scalar()
    assert runs == 5  # heartbeats counted once each


def test_chunked_delivery_gives_the_same_intervals_as_one_chunk(historian, tmp_path):
    seq = [[OK_IB]] * 7 + [[IB_DOWN]] * 5 + [[OK_IB, ECC_OK]] * 9
    records = [r for i, f in enumerate(seq) for r in _sweep("n1", i, f)]
    spool.append(tmp_path, records)
    deliver(historian, tmp_path, chunk_lines=3)
    chunked = [(r["check"], r["component"], r["status"], r["time"], r["last_seen"], r["is_open"])
               for r in _rows(historian)]
    assert len(chunked) == 4
    assert chunked[0][:3] == ("ecc", "*", "ok")


def test_attribution_sees_a_failure_that_began_before_the_window(historian, tmp_path):
    # ib down from 00:10 to 02:00 (sweeps every 5 min); a job fails at 01:30.
    seq = [[OK_IB]] * 2 + [[IB_DOWN]] * 23 + [[OK_IB]]
    _deliver(historian, tmp_path, [r for i, f in enumerate(seq) for r in _sweep("n1", i, f)])
    end = datetime(2024, 3, 1, 1, 30)
    with historian.begin() as conn:
        pk = conn.execute(schema.jobs.insert().values(
            job_id="7", job_id_display="7", state="FAILED", submit=end - timedelta(hours=2),
            start=end - timedelta(hours=1), end=end, nnodes=1, gpus=8, nodelist="n1",
            instance_key="7:x:y")).inserted_primary_key[0]
        conn.execute(schema.job_nodes.insert().values(job_pk=pk, node="n1"))
    report = attribute(historian)
    assert report.by_kind == {"check": 1}


def test_freshness_names_a_node_that_stopped_and_one_that_cannot_look(historian, tmp_path):
    records = [r for i in range(3) for r in _sweep("alive", i, [OK_IB])]
    records += _sweep("broken", 2, [], level="checker_error")
    records += _sweep("gone", 0, [OK_IB])
    _deliver(historian, tmp_path, records)
    now = T0 + timedelta(minutes=12)
    fresh = {f.node: f for f in node_freshness(historian, now, stale_after_s=600)}
    assert not fresh["alive"].stale and fresh["alive"].last_level == "ok"
    assert fresh["broken"].broken and not fresh["broken"].stale
    assert fresh["gone"].stale


def test_freshness_of_nodes_without_heartbeats_comes_from_their_newest_check(
        historian, tmp_path):
    """Nodes from before heartbeats (and imported checks) fall back to their newest result,
    found per node through the index, for the whole fleet and for one node asked by name."""
    records = [r for i in range(3) for r in _sweep("alive", i, [OK_IB])]
    for i, node in enumerate(["legacy-a", "legacy-b", "zz-legacy"]):
        records += spool.check_records([OK_IB], node=node, source="sweep",
                                       time=T0 + timedelta(minutes=5 * i), job_id=None)
    _deliver(historian, tmp_path, records)
    now = T0 + timedelta(minutes=12)
    fleet = {f.node: f for f in node_freshness(historian, now, stale_after_s=600)}
    assert sorted(fleet) == ["alive", "legacy-a", "legacy-b", "zz-legacy"]
    assert fleet["alive"].last_source == "sweep" and not fleet["alive"].stale
    assert {fleet[n].last_source for n in ("legacy-a", "legacy-b", "zz-legacy")} == {"checks"}
    assert fleet["legacy-a"].stale and not fleet["zz-legacy"].stale
    assert fleet["zz-legacy"].last_seen == (T0 + timedelta(minutes=10)).replace(tzinfo=None)
    asked = node_freshness(historian, now, 600, nodes=["legacy-b", "never-heard", "alive"])
    assert [(f.node, f.last_source, f.stale) for f in asked] == [
        ("alive", "sweep", False), ("legacy-b", "checks", False), ("never-heard", "", True)]


def test_prune_keeps_open_state_and_recent_rows(historian, tmp_path):
    seq = [[IB_DOWN], [OK_IB]]
    _deliver(historian, tmp_path, [r for i, f in enumerate(seq) for r in _sweep("n1", i, f)])
    now = T0.replace(tzinfo=None) + timedelta(days=30)
    assert prune(historian, now, Retention(days=10), dry_run=True)["check_results"] == 1
    assert len(_rows(historian)) == 2
    assert prune(historian, now, Retention(days=10))["check_results"] == 1
    rows = _rows(historian)
    assert [(r["status"], r["is_open"]) for r in rows] == [("ok", True)]


def test_imported_ids_are_kept_whole(historian, tmp_path):
    path = tmp_path / "checks.jsonl"
    lines = [
        f'{{"id": "{"x" * 40}-{i}", "time": "2024-03-01T00:00:00", "node": "n1",'
        ' "check": "xid", "status": "warn"}'
        for i in range(12)
    ]
    path.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["--db", str(historian.url.render_as_string(
        hide_password=False)), "ingest", "checks", "--file", str(path)])
    assert result.exit_code == 0, result.output
    assert len(_rows(historian)) == 12


def test_flush_of_a_missing_spool_directory_fails_with_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["--db", f"sqlite:///{tmp_path / 'h.db'}", "spool", "flush",
                                      "--dir", str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert "no spool directory" in result.output and "Traceback" not in result.output


def test_an_xid_read_again_by_later_sweeps_counts_once_in_the_daily_rollup(historian, tmp_path):
    """A cursor that could not be saved makes five sweeps report the same XID under the same
    record id: one event row and one failure in check_days, also when the batch comes again."""
    xid = Finding("xid", "GPU0", Status.FAIL, Severity.DRAIN_NOW, "XID 79", code="xid79")
    records = []
    for i in range(5):
        recs = _sweep("n1", i, [xid])
        for r in recs:
            if r["kind"] == "check":
                r["id"] = "xid-n1-boot1-seq5000"  # what event_key gives the same kernel line
        records += recs
    _deliver(historian, tmp_path, records)
    _deliver(historian, tmp_path, records)

    days = schema.check_days
    with historian.connect() as conn:
        fail = conn.execute(select(days.c.fail).where(days.c.check == "xid")).scalar()
    assert [r["id"] for r in _rows(historian)] == ["xid-n1-boot1-seq5000"]
    assert fail == 1


def test_an_imported_check_with_an_escaped_lone_surrogate_lands(historian, tmp_path):
    import json

    from rsc_health.historian.ingest import checks

    path = tmp_path / "other-tool.jsonl"
    path.write_text(json.dumps({"time": "2026-11-20T10:00:00+00:00", "node": "n1",
                                "check": "mount", "component": "/scr\udce9", "status": "fail"})
                    + "\n")
    report = checks.ingest_file(historian, path)
    assert report.bad == [] and report.written == 1
    assert [r["component"] for r in _rows(historian)] == ["/scr\ufffd"]


def test_a_batch_redelivered_after_the_nodes_last_run_saw_an_xid_changes_nothing(
    historian, tmp_path
):
    """An XID event closes the family's all-clear interval and opens none, so a node whose
    latest run was an event (drained on that XID and never swept again) had no open interval
    to tell a redelivered run from a new one: the batch again (a flush killed after its
    commit, a kill mid-load and the rerun) reopened all-clear intervals and moved the
    last_seen of closed ones backwards. Runs no newer than the latest event are stale too."""
    xid = Finding("xid", "GPU0", Status.FAIL, Severity.DRAIN_NOW, "XID 79", code="xid79")
    xid_ok = Finding("xid", "GPU0", Status.OK, Severity.NONE, "clean")
    seq = [[xid_ok]] * 4 + [[xid]] + [[xid_ok]] * 3 + [[xid]]
    runs = [_sweep("n1", i, f) for i, f in enumerate(seq)]
    _deliver(historian, tmp_path, [r for run in runs for r in run])
    before = _rows(historian)
    assert [(r["status"], r["is_open"]) for r in before] == [
        ("ok", False), ("fail", False), ("ok", False), ("fail", False)]
    for start in (0, 2, 6):  # the batches the node's flushes cut, each delivered again
        _deliver(historian, tmp_path, [r for run in runs[start:] for r in run])
        assert _rows(historian) == before, start
