"""Failure attribution: the paper's window (10 min before the end, 5 after), several causes,
NODE_FAIL through the node's own down event, and the unattributed rest."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert, select

from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.attribute import Window, attribute, cooccurrence
from rsc_health.historian.ingest import checks, db_time, sacct
from rsc_health.historian.lemons.features import lemon_features
from rsc_health.historian.metrics.rates import failure_rate
from rsc_health.historian.triage import triage

END = datetime(2024, 3, 1, 12, 0, 0)
SACCT_HEADER = ("JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|"
                "End|NNodes|NodeList|AllocTRES")
S = timedelta(seconds=1)


def _job(conn, pk: int, state: str, nodes: list[str], end: datetime = END) -> None:
    conn.execute(
        insert(schema.jobs).values(
            id=pk,
            job_id=str(1000 + pk),
            job_id_display=str(1000 + pk),
            state=state,
            submit=end - timedelta(hours=5),
            start=end - timedelta(hours=4),
            end=end,
            nnodes=len(nodes),
            gpus=8 * len(nodes),
            nodelist=",".join(nodes),
            instance_key=f"{1000 + pk}:x:{pk}",
        )
    )
    conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])


def _check(conn, cid, node, time, check="xid", status="fail", severity="drain_now", code=""):
    conn.execute(
        insert(schema.check_results).values(
            id=cid,
            time=time,
            node=node,
            source="sweep",
            check=check,
            component="gpu0",
            status=status,
            severity=severity,
            code=code or check,
            reason="",
        )
    )


def _rows(engine, pk: int) -> list[tuple]:
    a = schema.attributions
    with engine.connect() as conn:
        q = select(a.c.node, a.c.cause, a.c.code, a.c.evidence, a.c.kind).where(a.c.job_pk == pk)
        return sorted(conn.execute(q).all(), key=lambda r: (r[1], r[0] or ""))


def test_window_edges_9_59_before_attributed_10_01_not(historian):
    with historian.begin() as conn:
        _job(conn, 1, "FAILED", ["n1"])
        _job(conn, 2, "FAILED", ["n2"])
        _job(conn, 3, "FAILED", ["n3"])
        _job(conn, 4, "FAILED", ["n4"])
        _check(conn, "in-before", "n1", END - timedelta(minutes=9, seconds=59))
        _check(conn, "out-before", "n2", END - timedelta(minutes=10, seconds=1))
        _check(conn, "in-after", "n3", END + timedelta(minutes=5))  # the edge itself counts
        _check(conn, "out-after", "n4", END + timedelta(minutes=5, seconds=1))
    report = attribute(historian)
    assert _rows(historian, 1) == [("n1", "xid", "xid", "in-before", "check")]
    assert _rows(historian, 2) == []  # FAILED with nothing near its end: not hardware
    assert _rows(historian, 3) == [("n3", "xid", "xid", "in-after", "check")]
    assert _rows(historian, 4) == []
    assert report.jobs == 4 and report.by_kind == {"check": 2}


def test_window_follows_the_config(historian):
    with historian.begin() as conn:
        _job(conn, 1, "FAILED", ["n1"])
        _check(conn, "c", "n1", END - timedelta(minutes=20))
    attribute(historian, window=Window(before_s=1800, after_s=0))
    assert [r[1] for r in _rows(historian, 1)] == ["xid"]


def test_several_causes_and_culprit_nodes_and_their_cooccurrence(historian):
    with historian.begin() as conn:
        _job(conn, 1, "NODE_FAIL", ["n1", "n2", "n3"])
        _check(conn, "x1", "n1", END - 60 * S, code="xid79")
        _check(conn, "x1b", "n1", END - 30 * S, code="xid79")  # same cause twice: one row
        _check(conn, "p1", "n1", END - 50 * S, check="pcie", code="aer_fatal")
        _check(conn, "i2", "n2", END + 60 * S, check="infiniband", code="ib_down")
        # not failing: ok, a warning of a non-xid family, a fail that asks for no drain
        _check(conn, "ok3", "n3", END, check="gpu", status="ok", severity="none")
        _check(conn, "w3", "n3", END, check="ecc", status="warn", severity="warn")
        # an XID warning does count (the paper attributes to XIDs as they are logged), but not
        # an application-class one (13: the program's own error, never the node's)
        _check(conn, "xa3", "n3", END, check="xid", status="warn", severity="warn", code="xid13")
        _check(conn, "xw3", "n3", END, check="xid", status="warn", severity="warn", code="xid70")
        # another job with xid and pcie together, and one with xid alone
        _job(conn, 2, "FAILED", ["n4"], end=END + timedelta(days=1))
        _check(conn, "x4", "n4", END + timedelta(days=1), code="xid79")
        _check(conn, "p4", "n4", END + timedelta(days=1), check="pcie", code="aer_fatal")
        _job(conn, 3, "FAILED", ["n5"], end=END + timedelta(days=2))
        _check(conn, "x5", "n5", END + timedelta(days=2), code="xid48")
    attribute(historian)
    assert _rows(historian, 1) == [
        ("n2", "infiniband", "ib_down", "i2", "check"),
        ("n1", "pcie", "aer_fatal", "p1", "check"),
        ("n1", "xid", "xid79", "x1", "check"),
        ("n3", "xid", "xid70", "xw3", "check"),
    ]
    co = cooccurrence(historian)
    pairs = {(r.cause_a, r.cause_b): r.jobs for r in co.itertuples()}
    assert pairs == {("pcie", "xid"): 2, ("infiniband", "pcie"): 1, ("infiniband", "xid"): 1}
    assert co.iloc[0].tolist() == ["pcie", "xid", 2]


def test_node_fail_without_checks_goes_to_the_node_down_event_else_unattributed(historian):
    with historian.begin() as conn:
        _job(conn, 1, "NODE_FAIL", ["n1", "n2"])
        _job(conn, 2, "NODE_FAIL", ["n3"])
        conn.execute(
            insert(schema.node_events),
            [
                # n2 stopped answering 40 s before Slurm ended the job
                {
                    "id": 7,
                    "node": "n2",
                    "start": END - 40 * S,
                    "end": END + timedelta(hours=3),
                    "state": "DOWN",
                    "reason": "Not responding",
                    "source": "sacctmgr",
                },
                # n1 was down the day before: closed long before the end, not this failure
                {
                    "id": 8,
                    "node": "n1",
                    "start": END - timedelta(days=1),
                    "end": END - timedelta(hours=20),
                    "state": "DOWN",
                    "reason": "x",
                    "source": "sacctmgr",
                },
                # n3's own event starts only after the window
                {
                    "id": 9,
                    "node": "n3",
                    "start": END + timedelta(minutes=6),
                    "end": None,
                    "state": "DOWN",
                    "reason": "late",
                    "source": "sacctmgr",
                },
            ],
        )
    attribute(historian)
    assert _rows(historian, 1) == [("n2", "node_down", "DOWN", "7", "event")]
    assert _rows(historian, 2) == [(None, "unattributed", "", "", "unattributed")]


def test_rerunning_replaces_and_since_limits(historian_url, historian):
    with historian.begin() as conn:
        _job(conn, 1, "FAILED", ["n1"])
        _job(conn, 2, "FAILED", ["n2"], end=END + timedelta(days=2))
        _check(conn, "c1", "n1", END)
        _check(conn, "c2", "n2", END + timedelta(days=2))
    attribute(historian)
    attribute(historian)
    assert len(_rows(historian, 1)) == 1 and len(_rows(historian, 2)) == 1
    # a later run over recent jobs only leaves older rows alone
    with historian.begin() as conn:
        conn.execute(schema.check_results.delete().where(schema.check_results.c.id == "c1"))
        conn.execute(schema.check_results.delete().where(schema.check_results.c.id == "c2"))
    since = db_time(END + timedelta(days=1)).replace(" ", "T").split(".")[0]
    result = CliRunner().invoke(cli, ["--db", historian_url, "attribute", "--since", since])
    assert result.exit_code == 0, result.output
    assert len(_rows(historian, 1)) == 1 and _rows(historian, 2) == []


def test_a_requeued_instance_killed_by_a_failing_check_is_an_infra_failure(historian):
    # rsc-health requeues the jobs of a node it drains now: sacct -D shows the killed instance
    # REQUEUED, not FAILED. With a check on its node it is attributed and counts toward r_f;
    # a user's own requeue (no check nearby) stays unattributed and does not.
    from rsc_health.historian.metrics.rates import failure_rate

    with historian.begin() as conn:
        _job(conn, 1, "REQUEUED", ["n1", "n2"] + [f"x{i}" for i in range(15)])
        _job(conn, 2, "REQUEUED", [f"y{i}" for i in range(17)])
        _check(conn, "xid79", "n2", END - timedelta(minutes=1), code="xid79")
    report = attribute(historian)
    assert _rows(historian, 1) == [("n2", "xid", "xid79", "xid79", "check")]
    assert _rows(historian, 2) == []
    assert report.by_kind == {"check": 1}
    fr = failure_rate(historian)  # both jobs have 17 nodes = 136 GPUs > 128
    assert (fr.jobs, fr.failures) == (2, 1)
    assert fr.node_days == 2 * 17 * 4 / 24


def test_a_users_application_xid_is_no_node_failure_in_r_f_or_the_lemon_features(historian):
    """A user's own program error (an application-class XID: 13, 31, 43...) is never the node's:
    triage calls such a failed job the user's and the XID catalog says the historian never
    counts it against the node. Attribution blamed the node for it all the same, so r_f
    counted the user's bug as a hardware failure and the node's lemon failure features
    climbed. Triage still names the XID, as the job's own error."""
    lines, records = [SACCT_HEADER], []
    for i, day in enumerate((1, 2, 3)):
        # one user's buggy program, run three days on one node: FAILED, exit 1, XID 13 each
        lines.append(f"{100 + i}|{100 + i}|buggy|mallory|gpu|FAILED|1:0|2024-03-0{day}T08:00:00|"
                     f"2024-03-0{day}T08:00:00|2024-03-0{day}T08:00:05|2024-03-0{day}T10:00:00|"
                     "1|gpu007|cpu=96,gres/gpu=8,node=1")
        # as the node path records an application XID (catalog action warn)
        records.append(json.dumps({"time": f"2024-03-0{day}T09:59:30Z", "node": "gpu007",
                                   "check": "xid", "status": "warn", "severity": "warn",
                                   "code": "xid13", "component": "gpu0"}))
    assert sacct.ingest_text(historian, "\n".join(lines) + "\n").bad == []
    assert checks.ingest_lines(historian, records).bad == []
    attribute(historian)

    with historian.connect() as conn:
        assert conn.execute(select(schema.attributions)).all() == []
    assert failure_rate(historian, large_job_gpus=0).failures == 0
    row = lemon_features(historian, datetime(2024, 3, 5)).loc["gpu007"]
    assert row["host_failed_jobs"] == 0  # triage: the user's
    assert (row["single_node_node_fails"], row["node_fails"]) == (0, 0)
    labels = triage(historian, datetime(2024, 3, 1), datetime(2024, 3, 5))
    assert set(labels["label"]) == {"user"}
    assert all("application-class XID" in " ".join(e) for e in labels["evidence"])
