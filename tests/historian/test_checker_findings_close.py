"""Findings close when the fault is gone, checker errors included (issue 21, "Loud, then
stale"): a checker error opens a `checker` interval; the next runs of the same entry point
that report no such error close it. On main it stayed open for ever: a clean run spools no
`checker` record at all (checker errors are the only findings of that family), so the fold
never looked at the family again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import select

from rsc_health import nodepath, spool
from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.intervals import open_failures
from rsc_health.model import Finding, Severity, Status, new_record_id
from rsc_health.node import sinks
from tests.fixtures.nodes.node_copy import NODE_STATE
from tests.node.test_nodepath_faults import node_env  # noqa: F401 - the fixture
from tests.node.test_state_dir_read_only import node01_slurm

C = schema.check_results
T0 = datetime(2024, 3, 1, 0, 0, tzinfo=UTC)


def _sweep() -> int:
    return nodepath.run_stage("sweep", slurm_factory=lambda cfg, deadline: node01_slurm())


def _flush(url: str, root) -> None:
    """`healthctl spool flush`, as the node's timer runs it."""
    result = CliRunner().invoke(
        cli, ["--db", url, "spool", "flush", "--dir", str(root / NODE_STATE / "spool")])
    assert result.exit_code == 0, result.output


def _open_checker(url: str) -> list[tuple[str, str]]:
    from rsc_health.historian.db import connect

    engine = connect(url, create_missing=True)
    try:
        with engine.connect() as conn:
            return sorted((r["code"], r["source"]) for r in open_failures(conn)
                          if r["check"] == "checker")
    finally:
        engine.dispose()


def test_a_garbled_ring_buffer_read_opens_a_finding_that_closes_once_reads_are_clean(
        node_env, historian_url):  # noqa: F811
    """The real sweep, the real spool and `healthctl spool flush`: records the kernel
    overwrote before the sweep read them (a jump in the sequence numbers) are a checker error
    of the xid family. The next sweep reads cleanly; its flush must close the finding."""
    assert _sweep() == 0
    _flush(historian_url, node_env)
    with (node_env / "dev/kmsg").open("a") as fh:  # seq 1311..1999 overwritten unread
        fh.write("6,2000,36500000000,-;eth0: link up\n")
    assert _sweep() == 0
    _flush(historian_url, node_env)
    assert _open_checker(historian_url) == [("xid_error", "sweep")]

    assert _sweep() == 0
    _flush(historian_url, node_env)

    assert _open_checker(historian_url) == []


def test_a_bad_config_opens_a_finding_that_closes_once_the_config_is_fixed(
        node_env, historian_url, monkeypatch):  # noqa: F811
    site = node_env / "site.toml"
    good = site.read_text()
    assert _sweep() == 0
    site.write_text(good + "\n[gpu]\ncuont = 8\n")  # a typo pushed to the fleet
    assert nodepath.run_stage("prolog", slurm_factory=lambda cfg, deadline: node01_slurm()) == 0
    assert _sweep() == 0
    _flush(historian_url, node_env)
    assert _open_checker(historian_url) == [("config_error", "prolog")]  # one, seen by both

    site.write_text(good)
    assert _sweep() == 0
    _flush(historian_url, node_env)

    assert _open_checker(historian_url) == []


# ---- the fold's rule, run by run -----------------------------------------------------------------

GPU_OK = Finding("gpu", "gpu0", Status.OK, Severity.NONE, "fine")
XID_OK = Finding("xid", "kernel log", Status.OK, Severity.NONE, "no new XID events")
IB_OK = Finding("infiniband", "mlx5_0/1", Status.OK, Severity.NONE, "ACTIVE")
KMSG_ERROR = Finding("checker", "kernel log", Status.ERROR, Severity.NONE,
                     "xid: cannot read kernel log: 5 records overwritten", "xid_error")
IB_ERROR = Finding("checker", "sysfs", Status.ERROR, Severity.NONE,
                   "infiniband: cannot read sysfs", "infiniband_error")


def _run(node: str, minute: int, source: str, findings: list[Finding]) -> list[dict]:
    t = T0 + timedelta(minutes=minute)
    recs = spool.check_records(findings, node=node, source=source, time=t,
                               job_id="7" if source == "prolog" else None)
    errors = sum(f.status is Status.ERROR for f in findings)
    recs.append({"kind": "heartbeat", "id": new_record_id(), "time": t.isoformat(),
                 "node": node, "source": source, "level": "checker_error" if errors else "ok",
                 "checker_errors": errors, "duration_s": 0.2,
                 "families": sinks.family_status(findings), "version": "test"})
    return recs


def _checker_rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        rows = conn.execute(select(C.c.code, C.c.source, C.c.time, C.c.last_seen, C.c.is_open)
                            .where(C.c.check == "checker").order_by(C.c.time, C.c.code))
        return [(code, src, t.minute, seen.minute, bool(is_open))
                for code, src, t, seen, is_open in rows]


def _deliver(engine, tmp_path, records) -> None:
    spool.append(tmp_path, records)
    deliver(engine, tmp_path)


def test_a_clean_run_of_the_same_entry_point_closes_a_checker_error(historian, tmp_path):
    _deliver(historian, tmp_path,
             _run("n1", 0, "sweep", [GPU_OK, XID_OK, KMSG_ERROR])
             + _run("n1", 5, "sweep", [GPU_OK, XID_OK, KMSG_ERROR])
             + _run("n1", 10, "sweep", [GPU_OK, XID_OK]))
    assert _checker_rows(historian) == [("xid_error", "sweep", 0, 5, False)]


def test_a_prolog_that_does_not_look_leaves_a_sweeps_checker_error_open(historian, tmp_path):
    """A prolog runs fewer families than the sweep: its clean run says nothing of the sweep's
    InfiniBand read, so the finding neither closes nor flaps (a new interval every sweep)."""
    _deliver(historian, tmp_path,
             _run("n1", 0, "sweep", [GPU_OK, IB_OK, IB_ERROR])
             + _run("n1", 2, "prolog", [GPU_OK])
             + _run("n1", 5, "sweep", [GPU_OK, IB_OK, IB_ERROR])
             + _run("n1", 7, "prolog", [GPU_OK, KMSG_ERROR]))
    assert _checker_rows(historian) == [("infiniband_error", "sweep", 0, 5, True),
                                        ("xid_error", "prolog", 7, 7, True)]
    _deliver(historian, tmp_path,
             _run("n1", 9, "prolog", [GPU_OK])
             + _run("n1", 10, "sweep", [GPU_OK, IB_OK]))
    assert _checker_rows(historian) == [("infiniband_error", "sweep", 0, 5, False),
                                        ("xid_error", "prolog", 7, 7, False)]


def test_a_late_clean_run_does_not_close_a_newer_checker_error(historian, tmp_path):
    _deliver(historian, tmp_path, _run("n1", 5, "sweep", [GPU_OK, KMSG_ERROR]))
    _deliver(historian, tmp_path, _run("n1", 0, "sweep", [GPU_OK]))  # arrives late
    assert _checker_rows(historian) == [("xid_error", "sweep", 5, 5, True)]


def test_the_same_checker_error_seen_by_two_entry_points_is_one_interval(historian, tmp_path):
    _deliver(historian, tmp_path,
             _run("n1", 0, "sweep", [GPU_OK, XID_OK, KMSG_ERROR])
             + _run("n1", 2, "prolog", [GPU_OK, XID_OK, KMSG_ERROR])
             + _run("n1", 5, "sweep", [GPU_OK, XID_OK]))
    assert _checker_rows(historian) == [("xid_error", "sweep", 0, 2, False)]


CONFIG_ERROR = Finding("checker", "config", Status.ERROR, Severity.NONE,
                       "bad config: [gpu] cuont: unknown key", "config_error")


def test_a_bad_config_seen_by_a_prolog_closes_at_the_next_clean_sweep(historian, tmp_path):
    """One config file for every entry point: a node whose config was fixed must not show the
    prolog's config_error until its next job starts (hours on an idle node)."""
    _deliver(historian, tmp_path,
             _run("n1", 0, "prolog", [CONFIG_ERROR])
             + _run("n1", 5, "sweep", [GPU_OK, XID_OK]))
    assert _checker_rows(historian) == [("config_error", "prolog", 0, 0, False)]
