"""Issue 23 item 6: every failed job labelled host, user or unknown with its evidence, on the
real formats (sacct --parsable2, check JSON Lines, sacctmgr events), on both databases."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.ingest import checks, events, sacct
from rsc_health.historian.triage import HOST, UNKNOWN, USER, host_failed_jobs, summary, triage
from rsc_health.model import REASON_PREFIX, ActionKind

HEADER = ("JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|End|"
          "NNodes|NodeList|AllocTRES")
END = "2024-03-01T10:00:00"


def _job(jid: int, state: str, exit_code: str, node: str, user: str = "alice") -> str:
    return (f"{jid}|{jid}|train|{user}|gpu|{state}|{exit_code}|2024-03-01T08:00:00|"
            f"2024-03-01T08:00:00|2024-03-01T08:00:05|{END}|1|{node}|"
            "billing=8,cpu=96,gres/gpu=8,mem=1000G,node=1")


JOBS = {
    # job: (state, exit code, node, the label wanted)
    1: ("FAILED", "1:0", "n1", HOST),  # XID 79 on its node
    2: ("FAILED", "1:0", "n2", USER),  # XID 13 only: the program's own error
    3: ("NODE_FAIL", "0:0", "n3", HOST),  # Slurm says so, and the node went DOWN
    4: ("OUT_OF_MEMORY", "0:125", "n4", USER),
    5: ("FAILED", "0:9", "n5", UNKNOWN),  # SIGKILL: nothing says who
    6: ("FAILED", "139:11", "n6", USER),  # SIGSEGV
    7: ("CANCELLED", "0:15", "n7", UNKNOWN),
    8: ("FAILED", "1:0", "n8", HOST),  # rsc-health drained its node
    9: ("FAILED", "2:0", "n9", HOST),  # planned maintenance took the node: not the node's
    10: ("TIMEOUT", "0:0", "n10", USER),
    11: ("COMPLETED", "0:0", "n11", None),
    12: ("FAILED", "1:0", "n12", HOST),  # XID 79 and XID 13: the host's evidence wins
    13: ("FAILED", "1:0", "n13", USER),  # an XID 79 an hour after the end: outside the window
}


def _load(engine) -> None:
    lines = [HEADER] + [_job(j, s, e, n) for j, (s, e, n, _) in JOBS.items()]
    report = sacct.ingest_text(engine, "\n".join(lines) + "\n")
    assert report.bad == []

    def xid(node, code, t):
        return json.dumps({"time": t, "node": node, "check": "xid", "status": "fail",
                           "severity": "drain_now", "code": code, "component": "gpu0"})

    report = checks.ingest_lines(engine, [
        xid("n1", "xid79", "2024-03-01T09:59:00Z"),
        xid("n2", "xid13", "2024-03-01T09:59:30Z"),
        xid("n12", "xid79", "2024-03-01T09:59:00Z"),
        xid("n12", "xid13", "2024-03-01T09:58:00Z"),
        xid("n13", "xid79", "2024-03-01T11:00:00Z"),
    ])
    assert report.bad == []
    events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                       "n3|2024-03-01T09:59:50|2024-03-01T12:00:00|DOWN|Not responding\n"
                       "n9|2024-03-01T09:59:00|2024-03-01T12:00:00|DOWN|scheduled maint\n")
    with engine.begin() as conn:
        conn.execute(insert(schema.node_actions).values(
            id="a8", time=datetime(2024, 3, 1, 9, 59, 40), node="n8",
            action=ActionKind.DRAIN_NOW.value,
            reason=f"{REASON_PREFIX}now:row_remap_failure:gpu0 row remap failed"))


def test_every_failed_job_is_labelled_host_user_or_unknown_with_its_evidence(historian):
    _load(historian)
    df = triage(historian, datetime(2024, 3, 1), datetime(2024, 3, 2)).set_index("job_id")
    wanted = {str(j): label for j, (_, _, _, label) in JOBS.items() if label}
    assert df["label"].to_dict() == wanted
    assert df.loc["1", "nodes"] == ["n1"] and "xid79 on n1" in " ".join(df.loc["1", "evidence"])
    assert df.loc["2", "nodes"] == [] and "application-class XID" in df.loc["2", "evidence"][0]
    assert df.loc["3", "evidence"][0] == "Slurm: NODE_FAIL" and df.loc["3", "nodes"] == ["n3"]
    assert df.loc["8", "nodes"] == ["n8"] and "rsc-health drain_now n8" in df.loc["8",
                                                                                  "evidence"][0]
    assert df.loc["9", "nodes"] == [] and "planned maintenance" in df.loc["9", "evidence"][0]
    assert df.loc["12", "nodes"] == ["n12"]
    assert any("xid13" in e for e in df.loc["12", "evidence"])  # listed, not the verdict
    assert "exit code 1" in df.loc["13", "evidence"][0]
    assert "SIGKILL" in df.loc["5", "evidence"][0] and "SIGSEGV" in df.loc["6", "evidence"][0]
    assert summary(df) == {HOST: 5, USER: 5, UNKNOWN: 2}
    # the lemon features count the host labels per node, never an application XID's node
    counts = host_failed_jobs(df)
    assert counts.to_dict() == {"n1": 1.0, "n3": 1.0, "n8": 1.0, "n12": 1.0}


def test_triage_command_says_the_labels_in_text_and_json(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    from rsc_health.historian import db

    engine = db.connect(url, upgrade=True, create_missing=True)
    try:
        _load(engine)
    finally:
        engine.dispose()
    runner = CliRunner()
    args = ["--db", url, "triage", "--since", "2024-03-01", "--until", "2024-03-02"]
    out = runner.invoke(cli, [*args, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["labels"] == {HOST: 5, USER: 5, UNKNOWN: 2}
    assert {j["job_id"]: j["label"] for j in doc["jobs"]}["2"] == USER
    host_only = json.loads(runner.invoke(cli, [*args, "--label", "host", "--json"]).output)
    assert sorted(j["job_id"] for j in host_only["jobs"]) == ["1", "12", "3", "8", "9"]
    text = runner.invoke(cli, [*args, "--node", "n1"]).output
    assert text.startswith("1 failed job(s)") and "host 1" in text and "[n1]" in text


@pytest.mark.parametrize("code", ["", "garbled", "x:y"])
def test_an_unreadable_exit_code_is_unknown_not_a_crash(code):
    from rsc_health.historian.triage import _by_state

    label, evidence = _by_state("FAILED", code)
    assert label == UNKNOWN and "unreadable" in evidence[0]


def test_host_labels_feed_the_lemon_features_and_application_xids_do_not(historian):
    from rsc_health.historian.lemons.features import lemon_features

    _load(historian)
    frame = lemon_features(historian, datetime(2024, 3, 2))
    counts = frame["host_failed_jobs"]
    assert counts.get("n1") == 1 and counts.get("n12") == 1 and counts.get("n8") == 1
    assert counts.get("n2", 0) == 0 and counts.get("n9", 0) == 0  # XID 13; maintenance


def test_the_node_view_shows_its_failed_jobs_triaged(tmp_path):
    from rsc_health.historian import db

    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, upgrade=True, create_missing=True)
    try:
        _load(engine)
    finally:
        engine.dispose()
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nbin_dir = "/nonexistent"\n')
    base = ["--config", str(site), "--db", url, "node"]
    doc = json.loads(CliRunner().invoke(cli, [*base, "n12", "--as-of", "2024-03-02",
                                              "--json"]).output)
    tri = doc["historian"]["triage"]
    assert tri["labels"] == {HOST: 1, USER: 0, UNKNOWN: 0}
    assert tri["jobs"][0]["job_id"] == "12" and tri["jobs"][0]["blamed"]
    text = CliRunner().invoke(cli, [*base, "n2", "--as-of", "2024-03-02"]).output
    assert "triage    failed jobs since 2024-02-03 00:00: host 0, user 1, unknown 0" in text
    assert "application-class XID" in text
