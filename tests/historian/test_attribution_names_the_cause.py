"""Attribution names the finding that caused the action (issue 26, true answers 1): the code
of rsc-health's own drain wins; without one, the most severe finding, then the earliest; never
the alphabetically smallest code. On a historian filled as the operator fills it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.db import connect
from tests.historian.operator_history import (
    flush,
    healthctl,
    ingest_sacct,
    run_records,
    sacct_row,
    xid_findings,
    xid_line,
)

T = datetime(2026, 11, 20, 12, 0, 0)
MIN = timedelta(minutes=1)
GPUS = {f"00000000:{b}:00.0": i for i, b in enumerate(("18", "1A", "3B", "5D"))}


def _blamed(url: str, job: str) -> list[tuple[str, str, str]]:
    engine = connect(url, create_missing=True)
    try:
        a, j = schema.attributions, schema.jobs
        with engine.connect() as conn:
            rows = conn.execute(select(a.c.node, a.c.cause, a.c.code)
                                .select_from(a.join(j, a.c.job_pk == j.c.id))
                                .where(j.c.job_id == job)).all()
        return sorted((str(n), str(c), str(k)) for n, c, k in rows)
    finally:
        engine.dispose()


def test_a_job_requeued_by_our_xid79_drain_is_blamed_on_xid79_not_an_earlier_xid48(
        historian_url, tmp_path):
    spool_dir = tmp_path / "spool"
    # 8 minutes before the end: XID 48 (double-bit ECC) on gpu1; the mass-drain guard held
    # the drain back (another rack was going out at the same time).
    x48 = xid_findings([xid_line("0000:1a:00", 48, "An uncorrectable double bit error")], GPUS)
    flush(historian_url, spool_dir,
          run_records("gpu007", T - 8 * MIN, "sweep", x48, guard_held=True))
    # At the end: XID 79 on gpu3; the guard lets this one through: drain now, requeue 4242.
    x79 = xid_findings([xid_line("0000:5d:00", 79, "GPU has fallen off the bus.")], GPUS)
    recs = run_records("gpu007", T, "sweep", x79, job_ids=("4242",))
    assert [r["reason"].split(":")[2] for r in recs if r["kind"] == "action"] == ["xid79"] * 2
    flush(historian_url, spool_dir, recs)
    ingest_sacct(historian_url, tmp_path, [
        sacct_row("4242", "REQUEUED", T - timedelta(hours=3), T, "gpu[007-008]", 2, 16)])
    healthctl(historian_url, "attribute")

    assert _blamed(historian_url, "4242") == [("gpu007", "xid", "xid79")]


def test_without_our_action_the_most_severe_finding_wins_then_the_earliest(
        historian_url, tmp_path):
    spool_dir = tmp_path / "spool"
    # Shadow mode ([actions] enabled = false): rsc-health drained nothing, so no action
    # names a code. gpu002's XID 13 (a warning) came first, XID 94 (drain after the job) later.
    flush(historian_url, spool_dir, run_records("gpu002", T - 9 * MIN, "sweep", xid_findings(
        [xid_line("0000:18:00", 13, "Graphics SM Warp Exception")], GPUS), shadow=True))
    flush(historian_url, spool_dir, run_records("gpu002", T - 2 * MIN, "sweep", xid_findings(
        [xid_line("0000:3b:00", 94, "Contained ECC error")], GPUS), shadow=True))
    # gpu003: two drain-now XIDs, XID 95 first, XID 48 three minutes later.
    flush(historian_url, spool_dir, run_records("gpu003", T - 5 * MIN, "sweep", xid_findings(
        [xid_line("0000:1a:00", 95, "Uncontained ECC error")], GPUS), shadow=True))
    flush(historian_url, spool_dir, run_records("gpu003", T - 2 * MIN, "sweep", xid_findings(
        [xid_line("0000:5d:00", 48, "An uncorrectable double bit error")], GPUS), shadow=True))
    ingest_sacct(historian_url, tmp_path, [
        sacct_row("5001", "FAILED", T - timedelta(hours=1), T, "gpu002", 1, 8),
        sacct_row("5002", "FAILED", T - timedelta(hours=1), T, "gpu003", 1, 8)])
    healthctl(historian_url, "attribute")

    assert _blamed(historian_url, "5001") == [("gpu002", "xid", "xid94")]  # not "xid13"
    assert _blamed(historian_url, "5002") == [("gpu003", "xid", "xid95")]  # not "xid48"
    healthctl(historian_url, "attribute")  # a rerun picks the same findings
    assert _blamed(historian_url, "5002") == [("gpu003", "xid", "xid95")]


def test_the_node_view_names_the_gpu_the_failure_is_blamed_on_and_links_the_node(
        historian_url, tmp_path):
    """`healthctl node` is where an RMA is decided: the failed job's cause, code and GPU are
    the drain's own (xid79 on gpu3), and the node links where the nightly report does."""
    test_a_job_requeued_by_our_xid79_drain_is_blamed_on_xid79_not_an_earlier_xid48(
        historian_url, tmp_path)
    config = tmp_path / "site.toml"
    config.write_text('[report]\nnode_url = "https://grafana.example/d/node?var-node={node}"\n')
    doc = json.loads(healthctl(historian_url, "node", "gpu007", "--as-of",
                               T.strftime("%Y-%m-%dT%H:%M:%S"), "--json", config=config))
    jobs = doc["historian"]["failed_jobs"]
    assert [(j["job_id"], j["cause"], j["code"], j["component"]) for j in jobs] == [
        ("4242", "xid", "xid79", "gpu3")]
    assert doc["links"] == {"story": "healthctl node gpu007",
                            "node_url": "https://grafana.example/d/node?var-node=gpu007",
                            "dashboard_url": ""}
    text = healthctl(historian_url, "node", "gpu007", "--as-of",
                     T.strftime("%Y-%m-%dT%H:%M:%S"), config=config)
    assert "xid xid79 on gpu3" in text
    assert "node page https://grafana.example/d/node?var-node=gpu007" in text


def test_a_node_fail_without_a_check_is_blamed_on_the_outage_that_began_last(
        historian_url, tmp_path):
    """A person drained gpu009 after its job (DRAIN, still open); 40 s before the end the
    node stopped answering (DOWN): the job died of the DOWN."""
    from tests.historian.operator_history import ingest_events, iso

    ingest_events(historian_url, tmp_path, [
        f"rsc|gpu009|{iso(T - timedelta(hours=1))}|Unknown|DRAIN|fan check after job|"
        "jdoe(1001)",
        f"rsc|gpu009|{iso(T - timedelta(seconds=40))}|Unknown|DOWN|Not responding|"
        "slurm(64030)",
    ])
    ingest_sacct(historian_url, tmp_path, [
        sacct_row("6001", "NODE_FAIL", T - timedelta(hours=3), T, "gpu009", 1, 8)])
    healthctl(historian_url, "attribute")
    assert _blamed(historian_url, "6001") == [("gpu009", "node_down", "DOWN")]
