"""`healthctl suspects job JOB` (issue 25's operator surface): why a slow job's nodes were, or
were not, flagged. Each node and metric of the job judged over its run as a detector pass
judges its window: a node off its peers long enough is the suspect, one off for a sweep is
short of persist_sweeps, a sweep the whole job moved in is the job's, a group under
min_nodes is not judged at all; a job the historian lacks, a one-node job, a job with no
telemetry, and a historian that cannot be read each say so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.historian import db, schema

SWEEPS = 10
SLOW = "a03"  # PCIe link at x8 from sweep 4 on
BLIP = "a05"  # one sweep at x8 (sweep 2)
CHECKPOINT = 6  # every node of job A congested in this sweep


def _historian(url: str, now: datetime) -> datetime:
    """Job A (8 nodes, running; hostile name), job B (3 nodes: under min_nodes, b01 at x8
    throughout), job S (one node), job E (4 nodes, no telemetry)."""
    # on the detector's slot grid (300 s): each sweep's samples (7 s apart) in one slot,
    # whatever the clock's phase when the test runs
    back = (now - timedelta(seconds=300 * SWEEPS + 300)).replace(tzinfo=UTC)
    t0 = datetime.fromtimestamp(int(back.timestamp()) // 300 * 300, UTC).replace(tzinfo=None)
    jobs = {"1001": [f"a{i:02d}" for i in range(8)], "1002": ["b00", "b01", "b02"],
            "1003": ["s00"], "1004": [f"e{i:02d}" for i in range(4)]}
    engine = db.connect(url, upgrade=True, create_missing=True)
    try:
        with engine.begin() as conn:
            for pk, (job, nodes) in enumerate(jobs.items(), start=1):
                conn.execute(schema.jobs.insert().values(
                    id=pk, job_id=job, job_id_display=job, state="RUNNING", submit=t0,
                    start=t0, end=None, nnodes=len(nodes), gpus=8 * len(nodes),
                    name="<script>alert(1)</script>\n\x1b[2J", nodelist=",".join(nodes),
                    instance_key=f"{job}:{t0}:{t0}"))
                conn.execute(schema.job_nodes.insert(),
                             [{"job_pk": pk, "node": n} for n in nodes])
            rows = []
            for job in ("1001", "1002", "1003"):
                for i, node in enumerate(jobs[job]):
                    for s in range(SWEEPS):
                        x8 = (node == SLOW and s >= 4) or (node == BLIP and s == 2) \
                            or node == "b01"
                        wait = 1e6 * (1 + 0.03 * ((i + s) % 5))
                        if job == "1001" and s == CHECKPOINT:
                            wait *= 8
                        rows.append({"time": t0 + timedelta(seconds=60 + 300 * s + 7 * i),
                                     "node": node,
                                     "pcie_link_ratio": 0.5 if x8 else 1.0,
                                     "pcie_link_ratio_c": "gpu2" if x8 else "gpu0",
                                     "ib_xmit_wait_rate": wait,
                                     "ib_xmit_wait_rate_c": "mlx5_1:1"})
            conn.execute(schema.telemetry_samples.insert(), rows)
    finally:
        engine.dispose()
    return t0


def _run(url: str, *args: str):
    return CliRunner().invoke(cli, ["--db", url, "suspects", "job", *args])


@pytest.fixture
def url(historian_url):
    _historian(historian_url, datetime.now(UTC).replace(tzinfo=None))
    return historian_url


def test_a_slow_nodes_run_a_blip_and_the_jobs_own_move_are_told_apart(url):
    res = _run(url, "1001", "--json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["job_id"] == "1001" and len(got["nodes"]) == 8
    rows = {(r["node"], r["metric"]): r for r in got["rows"]}
    slow = rows[(SLOW, "pcie_link_ratio")]
    assert slow["suspect"] and slow["longest"] >= 5 and slow["needed"] == 2
    assert slow["worst_value"] == 0.5 and slow["worst_median"] == 1.0
    assert slow["why"].startswith("suspect")
    blip = rows[(BLIP, "pcie_link_ratio")]
    assert not blip["suspect"] and (blip["outlying"], blip["longest"]) == (1, 1)
    assert "at most 1 in a row (needs 2)" in blip["why"]
    # the checkpoint moved every node: the job's, not a node's
    wait = [r for (n, m), r in rows.items() if m == "ib_xmit_wait_rate"]
    assert len(wait) == 8 and not any(r["suspect"] or r["outlying"] for r in wait)
    quiet = rows[("a00", "pcie_link_ratio")]
    assert quiet["outlying"] == 0 and quiet["judged"] == quiet["sampled"] == SWEEPS
    assert "in line with its peers" in quiet["why"]
    # the text: the slow node and the blip are named, the quiet ones counted, not listed
    text = _run(url, "1001")
    assert text.exit_code == 0, text.output
    assert f"{SLOW} pcie_link_ratio: suspect" in text.output
    assert f"{BLIP} pcie_link_ratio: off its peers in 1 sweeps" in text.output
    assert "a00 pcie_link_ratio" not in text.output and "--all lists them" in text.output
    assert "a00 pcie_link_ratio" in _run(url, "1001", "--all").output


def test_a_group_under_min_nodes_is_said_not_judged(url):
    got = json.loads(_run(url, "1002", "--json").output)
    rows = {(r["node"], r["metric"]): r for r in got["rows"]}
    b01 = rows[("b01", "pcie_link_ratio")]
    assert b01["judged"] == 0 and b01["sampled"] == SWEEPS and not b01["suspect"]
    assert "not judged" in b01["why"] and "min_nodes 4" in b01["why"]
    assert "no node of the job was off its peers" in _run(url, "1002").output


@pytest.mark.parametrize("job, says", [
    ("1003", "one-node jobs have no peers"),
    ("1004", "nothing to judge"),
    ("9999", "not in the historian"),
    ("1001'; DROP TABLE jobs; --", "not in the historian"),
])
def test_a_job_with_nothing_to_judge_says_why(url, job, says):
    res = _run(url, job)
    assert res.exit_code == 0, res.output
    assert says in res.output
    assert json.loads(_run(url, job, "--json").output)["rows"] == []


def test_an_unreadable_historian_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "dir.db").mkdir()
    res = _run(f"sqlite:///{tmp_path / 'dir.db'}", "1001")
    assert res.exit_code == 1 and "historian database" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
    assert _run(f"sqlite:///{tmp_path / 'x.db'}", "x" * 65).exit_code != 0
