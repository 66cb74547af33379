"""The simulator's files: deterministic, in the real Slurm formats, and self-consistent."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from rsc_health.hostlist import expand
from rsc_health.sim import FILES, SimConfig, simulate
from rsc_health.sim.writers import EVENT_FIELDS, SACCT_FIELDS

# The --format the historian runs `sacct -a -X -D --parsable2` with (common.md).
SACCT_FORMAT = ("JobIDRaw,JobID,JobName,User,Partition,State,ExitCode,Submit,Eligible,Start,End,"
                "NNodes,NodeList,AllocTRES")
FAMILIES = {"gpu", "xid", "ecc", "remap", "nvlink", "pcie", "infiniband", "mount", "checker"}
SEVERITIES = {"none", "warn", "drain_after_job", "drain_now"}
STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "PREEMPTED",
          "NODE_FAIL", "REQUEUED", "RUNNING"}


def ts(text: str) -> datetime:
    # Slurm's format exactly: no zone, no fraction.
    assert len(text) == 19 and text[10] == "T", text
    return datetime.fromisoformat(text)


def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(tmp_path):
    cfg = SimConfig(nodes=24, days=8, seed=5, lemon_share=0.1)
    simulate(cfg, tmp_path / "a")
    simulate(cfg, tmp_path / "b")
    simulate(SimConfig(nodes=24, days=8, seed=6, lemon_share=0.1), tmp_path / "c")
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a/sacct.txt").read_bytes() != (tmp_path / "c/sacct.txt").read_bytes()


def test_sacct_header_is_the_requested_format_in_names_the_real_sacct_knows(fleet):
    header = (fleet["dir"] / "sacct.txt").read_text().split("\n", 1)[0]
    assert header == SACCT_FORMAT.replace(",", "|")
    assert "|".join(SACCT_FIELDS) == header
    binary = Path("/usr/bin/sacct")
    if not binary.exists():
        pytest.skip("sacct is not installed")
    data = binary.read_bytes()
    # sacct prints its own spelling of each field as the header; it is in its string table.
    for name in SACCT_FIELDS:
        assert name.encode() + b"\0" in data, name


def test_sacct_rows_parse_with_a_plain_parsable2_reader(fleet):
    text = (fleet["dir"] / "sacct.txt").read_text()
    lines = text.splitlines()
    assert all(line.count("|") == len(SACCT_FIELDS) - 1 for line in lines)
    for row in fleet["rows"][:5000]:
        assert row["JobIDRaw"] == row["JobID"] and row["JobID"].isdigit()
        state = row["State"]
        assert state.split(" ")[0] in STATES
        if state.startswith("CANCELLED"):
            assert state.split(" by ")[1].isdigit()
        assert row["ExitCode"].count(":") == 1
        for col in ("Submit", "Eligible", "Start"):
            ts(row[col])
        assert row["End"] == "Unknown" if state == "RUNNING" else ts(row["End"]) >= ts(row["Start"])
        assert ts(row["Submit"]) <= ts(row["Eligible"]) <= ts(row["Start"])


def test_nodelists_are_valid_hostlists_that_agree_with_nnodes_and_tres(fleet):
    names = {f"node{i:04d}" for i in range(1, 257)}
    for row in fleet["rows"]:
        nodes = expand(row["NodeList"])
        assert len(nodes) == int(row["NNodes"]) and set(nodes) <= names
        tres = dict(kv.split("=") for kv in row["AllocTRES"].split(","))
        assert list(tres) == ["billing", "cpu", "gres/gpu", "mem", "node"]
        assert int(tres["node"]) == len(nodes)
        gpus = int(tres["gres/gpu"])
        assert (len(nodes) - 1) * 8 < gpus <= len(nodes) * 8


def test_events_are_sacctmgr_show_event_output(fleet):
    lines = (fleet["dir"] / "events.txt").read_text().splitlines()
    assert lines[0] == "|".join(EVENT_FIELDS) == "NodeName|TimeStart|TimeEnd|State|Reason|User"
    assert len(lines) - 1 == len(fleet["truth"]["failures"])
    for line in lines[1:]:
        node, start, end, state, reason, user = line.split("|")
        assert state in {"DRAIN", "DOWN"}
        if state == "DRAIN":
            assert reason.startswith("rsc_health:now:") and user == "root(0)"
        else:
            assert reason == "Not responding"
        assert end == "Unknown" or ts(end) > ts(start)


def test_no_job_starts_on_a_node_while_it_is_out_for_repair(fleet):
    starts: dict[str, list[datetime]] = {}
    for row in fleet["rows"]:
        for node in expand(row["NodeList"]):
            starts.setdefault(node, []).append(ts(row["Start"]))
    horizon = ts("2024-01-01T00:00:00") + timedelta(days=60)
    for failure in fleet["truth"]["failures"]:
        t0 = ts(failure["time"])
        t1 = horizon if failure["repair_end"] == "Unknown" else ts(failure["repair_end"])
        assert not [s for s in starts.get(failure["node"], []) if t0 <= s < t1], failure


def test_each_failure_ends_the_jobs_running_on_its_node(fleet):
    by_id: dict[str, list[dict]] = {}
    for row in fleet["rows"]:
        by_id.setdefault(row["JobIDRaw"], []).append(row)
    killed = 0
    for failure in fleet["truth"]["failures"]:
        t = ts(failure["time"])
        for job_id in failure["jobs"]:
            ended = [r for r in by_id[str(job_id)] if r["End"] != "Unknown"
                     and timedelta(0) <= ts(r["End"]) - t <= timedelta(minutes=5)
                     and failure["node"] in expand(r["NodeList"])]
            assert ended and ended[0]["State"] in {"NODE_FAIL", "FAILED", "REQUEUED"}
            killed += 1
    assert killed > 0


def test_check_rows_follow_the_ingest_contract(fleet):
    every = [json.loads(line) for line in (fleet["dir"] / "checks.jsonl").open()]
    rows = [r for r in every if r["status"] != "ok"]
    assert rows
    for row in rows:
        assert set(row) == {"time", "node", "check", "status", "severity", "component", "detail",
                            "code"}
        assert row["check"] in FAMILIES and row["severity"] in SEVERITIES
        assert row["status"] in {"warn", "fail"} and row["code"]
        ts(row["time"])
    # PCIe failures co-occur with XID 79 at the same time on the same node (Sec. III).
    pcie = [(r["node"], r["time"]) for r in rows if r["check"] == "pcie" and r["status"] == "fail"]
    xid79 = {(r["node"], r["time"]) for r in rows if r["code"] == "xid79"}
    assert pcie and 0.2 < sum(p in xid79 for p in pcie) / len(pcie) < 0.7


def test_sweeps_appear_as_all_clear_intervals_broken_by_failures(fleet):
    """Issue 13 point 8: the node path's stream in interval form, one all-clear interval per
    (node, family) from the first sweep to the last before a failure of that family."""
    every = [json.loads(line) for line in (fleet["dir"] / "checks.jsonl").open()]
    ok = [r for r in every if r["status"] == "ok"]
    assert ok and all(r["component"] == "*" and r["check"] in FAMILIES for r in ok)
    assert all(ts(r["last_seen"]) >= ts(r["time"]) for r in ok)
    # Every node is swept from the start, in every family.
    first = {(r["node"], r["check"]) for r in ok if ts(r["time"]) == min(ts(x["time"]) for x in ok)}
    nodes = {r["node"] for r in every}
    assert len(first) == len(nodes) * len(FAMILIES - {"checker"})
    # No all-clear interval of a family spans a failure of that family on that node.
    fails = [(r["node"], r["check"], ts(r["time"])) for r in every if r["status"] == "fail"]
    spans: dict = {}
    for r in ok:
        spans.setdefault((r["node"], r["check"]), []).append((ts(r["time"]), ts(r["last_seen"])))
    for node, fam, t in fails:
        assert not any(a <= t <= b for a, b in spans.get((node, fam), ()))


def test_tickets_and_exclusions_name_real_nodes_and_jobs(fleet):
    job_ids = {r["JobIDRaw"] for r in fleet["rows"]}
    with (fleet["dir"] / "tickets.csv").open(newline="") as fh:
        tickets = list(csv.DictReader(fh))
    assert tickets and set(tickets[0]) == {"node", "opened", "closed", "reason"}
    for t in tickets:
        assert t["closed"] == "" or ts(t["closed"]) >= ts(t["opened"])
    excl = [json.loads(line) for line in (fleet["dir"] / "exclusions.jsonl").open()]
    assert excl and all(e["job_id"] in job_ids for e in excl)


def test_the_simulator_writes_the_last_heartbeats_of_the_nodes_that_are_up(tmp_path):
    """spool/pending.jsonl: the node path's heartbeats of the last hours, in the spool's own
    format, so a demo historian knows each node's last run (a node down at the end has none)."""
    import json

    from rsc_health.historian import db
    from rsc_health.historian.freshness import node_freshness
    from rsc_health.historian.ingest.delivery import deliver
    from rsc_health.sim.config import SimConfig
    from rsc_health.sim.core import simulate

    sim = simulate(SimConfig(nodes=24, days=5, seed=4), tmp_path / "sim")
    lines = [json.loads(x) for x in sim.files["spool/pending.jsonl"].read_text().splitlines()]
    assert lines and {r["kind"] for r in lines} == {"heartbeat"}
    assert len({r["node"] for r in lines}) <= 24

    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    report = deliver(engine, sim.files["spool/pending.jsonl"].parent)
    assert report.delivered["heartbeat"] == len(lines)
    truth = json.loads(sim.files["truth.json"].read_text())
    from datetime import datetime, timedelta

    end = datetime.fromisoformat(truth["start"]) + timedelta(days=truth["days"])
    fresh = node_freshness(engine, end, 900)
    assert {f.node for f in fresh if not f.stale} == {r["node"] for r in lines}
    engine.dispose()
