"""`healthctl lemons --apply` against the real cluster: a lemon is drained in Slurm with the
`rsc_health:lemon:` reason and a repair ticket, a person's drain is left alone, and the node's own
sweep never resumes the lemon drain; `healthctl resume` after the repair does, and the next run
leaves the repaired node in service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert, select

from rsc_health.historian import db
from rsc_health.historian.schema import (
    check_results,
    node_actions,
    node_events,
    node_inventory,
    tickets,
)

pytestmark = pytest.mark.slurm

DAY = timedelta(days=1)
HUMAN_REASON = "bad dimm, ticket 1234 -- bob"


def seed_lemon_history(engine, node: str, now: datetime) -> None:
    """A node that keeps going to repair: three tickets in 90 days (two before the 28-day window)
    with the outages and XID events that sent it there."""
    with engine.begin() as conn:
        for k, days in enumerate((75, 40, 12)):
            opened = now - days * DAY
            conn.execute(insert(tickets).values(
                node=node, opened=opened, closed=opened + DAY, reason="node_down: node_down",
                source="csv"))
            conn.execute(insert(node_events).values(
                node=node, start=opened - timedelta(hours=1), end=opened + DAY, state="DOWN",
                reason="Not responding", source="sacctmgr"))
            conn.execute(insert(check_results).values(
                id=f"{node}-xid-{k}", time=opened - timedelta(hours=2), node=node,
                source="sweep", check="xid", component="gpu3", status="fail",
                severity="drain_now", code="xid79", reason="gpu3 fell off the bus"))


def seed_fleet(engine, now: datetime, nodes: int = 128, extra: tuple[str, ...] = ()) -> None:
    """The fleet the lemons are judged against (issue 23: a node is a lemon when its failures
    are unusual at its peers' own rate): 128 nodes in service for a year, the six of the test
    cluster among them. Without it the peer group is only the few nodes the test touches, and
    two bad nodes of three are no surprise."""
    names = ([f"node{i:02d}" for i in range(1, 7)] + [f"gpu{i:03d}" for i in range(nodes - 6)]
             + list(extra))
    with engine.begin() as conn:
        conn.execute(insert(node_inventory), [
            {"node": n, "cluster": "", "partition": "gpu", "start": now - 365 * DAY,
             "end": None, "source": "csv"} for n in names])


def healthctl(cluster, db_url: str, root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(cluster.env, RSC_HEALTH_CONFIG=os.devnull)
    argv = [sys.executable, "-m", "rsc_health.cli", "--db", db_url, "--root", str(root)]
    return subprocess.run([*argv, *args], env=env, capture_output=True, text=True, timeout=60)


def test_lemon_is_drained_ticketed_and_never_auto_resumed(slurm_cluster, tmp_path):
    c = slurm_cluster
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    engine = create_engine(url)
    db.create(engine)
    seed_fleet(engine, now)
    seed_lemon_history(engine, "node02", now)  # the lemon
    seed_lemon_history(engine, "node04", now)  # just as bad, but a person drained it already
    with engine.begin() as conn:  # one repair in 90 days is ordinary wear, not a lemon
        conn.execute(insert(tickets).values(
            node="node05", opened=now - 20 * DAY, closed=now - 19 * DAY, reason="psu",
            source="csv"))
    c.run(["scontrol", "update", "NodeName=node04", "State=DRAIN", f"Reason={HUMAN_REASON}"])
    # scontrol shows the reason with " [user@time]" appended: compare with what it showed before.
    human_before = c.node("node04")["Reason"]
    assert human_before.startswith(HUMAN_REASON)
    try:
        dry = healthctl(c, url, tmp_path, "lemons", "--json")
        assert dry.returncode == 0, dry.stderr
        doc = json.loads(dry.stdout)
        assert {v["node"] for v in doc["verdicts"]} == {"node02", "node04"}
        assert all("DRAIN" not in c.node_state(n) for n in ("node02", "node05"))

        out = healthctl(c, url, tmp_path, "lemons", "--apply", "--json")
        assert out.returncode == 0, out.stderr
        actions = {v["node"]: v["action"]["action"] for v in json.loads(out.stdout)["verdicts"]}
        assert actions == {"node02": "drain", "node04": "skip"}

        lemon = c.node("node02")
        assert "DRAIN" in lemon["State"]
        assert lemon["Reason"].startswith("rsc_health:lemon:"), lemon["Reason"]
        human = c.node("node04")
        assert "DRAIN" in human["State"] and human["Reason"] == human_before
        assert "DRAIN" not in c.node_state("node05")
        with engine.connect() as conn:
            opened = conn.execute(
                select(tickets.c.node, tickets.c.closed).where(tickets.c.source == "lemon")
            ).all()
            drains = conn.execute(select(node_actions.c.node, node_actions.c.action)).all()
        assert opened == [("node02", None)]
        assert drains == [("node02", "lemon_drain")]

        # The node itself is healthy (a clean fixture root): its sweeps find nothing wrong, and
        # more clean sweeps than [actions] resume_after_clean_sweeps still leave the drain on.
        for _ in range(3):
            sweep = c.sweep("node02")
            assert sweep.returncode == 0, sweep.stderr
        after = c.node("node02")
        assert "DRAIN" in after["State"] and after["Reason"] == lemon["Reason"]
        spooled = c.spool("node02")
        sweeps = [r for r in spooled if r["kind"] == "check" and r["source"] == "sweep"]
        assert sweeps and all(r["status"] == "ok" for r in sweeps)  # it ran and found it clean
        assert not [r for r in spooled if r["kind"] == "action"]  # and did nothing about it

        # Repair closes the loop: close the lemon ticket, resume; its old history no longer
        # counts, so the next nightly run leaves it in service.
        with engine.connect() as conn:
            ticket_id = conn.execute(
                select(tickets.c.id).where(tickets.c.source == "lemon")
            ).scalar_one()
        closed = healthctl(c, url, tmp_path, "ticket", "close", str(ticket_id))
        assert closed.returncode == 0, closed.stderr
        # A lemon drain is a repair drain: a plain resume is refused until a stored
        # qualification pass (issue 24); a person's --force is the one way around it.
        refused = healthctl(c, url, tmp_path, "resume", "node02")
        assert refused.returncode == 1 and "qualify start node02" in refused.stdout, \
            refused.stdout + refused.stderr
        resumed = healthctl(c, url, tmp_path, "resume", "node02", "--force")
        assert resumed.returncode == 0, resumed.stderr
        again = healthctl(c, url, tmp_path, "lemons", "--apply", "--json")
        assert again.returncode == 0, again.stderr
        assert [v["node"] for v in json.loads(again.stdout)["verdicts"]] == ["node04"]
        assert "DRAIN" not in c.node_state("node02")
    finally:
        engine.dispose()
        for node in ("node02", "node04"):
            c.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


@pytest.mark.parametrize("name", ["node[01-06]", "node01,node03", "node0[1-2],node05"])
def test_a_node_name_in_the_historian_that_names_many_nodes_never_drains_them(
    slurm_cluster, tmp_path, name
):
    """A node name is whatever an import wrote (checks JSONL, a ticket CSV, a tool's export).
    One that is a hostlist expression used to reach `scontrol update NodeName=...` whole: Slurm
    expanded it and drained every node it named, past the mass-drain guard (which counted one
    node) and over a person's drain on any but the first. It is now refused before any Slurm
    call, and the run still drains the real lemon beside it."""
    c = slurm_cluster
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    engine = create_engine(url)
    db.create(engine)
    seed_fleet(engine, now, extra=(name,))  # an inventory file can hold such a name too
    seed_lemon_history(engine, name, now)
    seed_lemon_history(engine, "node02", now)  # a real lemon in the same run
    c.run(["scontrol", "update", "NodeName=node03", "State=DRAIN", f"Reason={HUMAN_REASON}"])
    human_before = c.node("node03")["Reason"]
    try:
        out = healthctl(c, url, tmp_path, "lemons", "--apply", "--json")
        assert out.returncode == 0, out.stderr
        actions = {v["node"]: v["action"] for v in json.loads(out.stdout)["verdicts"]}
        assert actions[name]["action"] == "skip"
        assert "not one Slurm node name" in actions[name]["why"]
        assert actions["node02"]["action"] == "drain"
        drained = {n for n in c.node_names if "DRAIN" in c.node_state(n)}
        assert drained == {"node02", "node03"}
        assert c.node("node03")["Reason"] == human_before
        with engine.connect() as conn:
            lemon_tickets = conn.execute(
                select(tickets.c.node).where(tickets.c.source == "lemon")).scalars().all()
        assert lemon_tickets == ["node02"]
    finally:
        engine.dispose()
        for node in c.node_names:
            c.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


def test_shadow_mode_lemons_apply_changes_nothing_in_slurm(slurm_cluster, tmp_path):
    """[actions] enabled = false: the nightly `lemons --apply` (the README enables its timer
    before going live) drains nothing and opens no ticket; it records the would-have drain."""
    c = slurm_cluster
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    engine = create_engine(url)
    db.create(engine)
    seed_fleet(engine, now)
    seed_lemon_history(engine, "node02", now)
    shadow = tmp_path / "shadow.toml"
    shadow.write_text("[actions]\nenabled = false\n")
    before = {n: (c.node(n)["State"], c.node(n).get("Reason", "")) for n in c.node_names}
    try:
        out = healthctl(c, url, tmp_path, "--config", str(shadow), "lemons", "--apply", "--json")
        assert out.returncode == 0, out.stderr
        after = {n: (c.node(n)["State"], c.node(n).get("Reason", "")) for n in c.node_names}
        assert after == before
        doc = json.loads(out.stdout)
        assert doc["shadow"] is True and doc["applied"] is False
        assert {v["node"]: v["action"]["action"] for v in doc["verdicts"]} == {
            "node02": "would_drain"}
        text = healthctl(c, url, tmp_path, "--config", str(shadow), "lemons", "--apply")
        assert "shadow mode" in text.stdout, text.stdout
        assert after == {n: (c.node(n)["State"], c.node(n).get("Reason", ""))
                         for n in c.node_names}
        with engine.connect() as conn:
            assert conn.execute(select(tickets).where(tickets.c.source == "lemon")).all() == []
            rows = conn.execute(select(node_actions.c.node, node_actions.c.action)).all()
        assert rows == [("node02", "would_drain")]
    finally:
        engine.dispose()
        c.run(["scontrol", "update", "NodeName=node02", "State=RESUME"], check=False)


def test_a_person_who_resumes_a_lemon_with_scontrol_keeps_it_in_service_until_new_evidence(
        slurm_cluster, tmp_path):
    """A lemon drained while a job runs; a person lifts the drain with a raw `scontrol update
    State=RESUME`, the lemon ticket still open. The next nightly --apply drained it again on
    the same evidence, every night, with no record of the re-drain. Now the lift is theirs:
    recorded as the node's return from repair, so the nights after leave it in service, and
    only a new failure since drains it again, recorded as a drain of its own."""
    import time

    from rsc_health.historian.schema import job_nodes, jobs

    c = slurm_cluster
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    engine = create_engine(url)
    db.create(engine)
    seed_fleet(engine, now)
    seed_lemon_history(engine, "node02", now)

    def apply() -> dict:
        out = healthctl(c, url, tmp_path, "lemons", "--apply", "--json")
        assert out.returncode == 0, out.stderr
        return {v["node"]: v["action"] for v in json.loads(out.stdout)["verdicts"]}

    def actions() -> list[tuple[str, str]]:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(
                select(node_actions.c.action, node_actions.c.reason)
                .where(node_actions.c.node == "node02").order_by(node_actions.c.time))]

    try:
        job = c.sbatch("-w", "node02", "--wrap", "sleep 120")
        c.wait_for(lambda: c.job_state(job) == "RUNNING", 30)
        assert apply()["node02"]["action"] == "drain"
        assert c.job_state(job) == "RUNNING"  # drained after the job, not killed
        c.run(["scontrol", "update", "NodeName=node02", "State=RESUME"])  # the person
        assert "DRAIN" not in c.node_state("node02")

        second = apply()["node02"]
        assert second["action"] == "skip" and "lifted outside healthctl" in second["why"]
        assert "DRAIN" not in c.node_state("node02")
        recorded = actions()
        assert [a for a, _ in recorded] == ["lemon_drain", "resume"]
        assert recorded[1][1].startswith(recorded[0][1] + " (lifted outside healthctl")
        with engine.connect() as conn:
            assert conn.execute(select(tickets.c.closed).where(tickets.c.source == "lemon")
                                ).scalars().all() == [None]  # the person's to close

        assert "node02" not in apply()  # its windows start at the return: nothing new
        assert "DRAIN" not in c.node_state("node02")
        assert len(actions()) == 2

        # New evidence: a single-node NODE_FAIL on it since the return (a repeat offender).
        with engine.connect() as conn:
            back = conn.execute(select(node_actions.c.time).where(
                node_actions.c.action == "resume")).scalar_one()
        with engine.begin() as conn:
            conn.execute(insert(jobs).values(
                id=900001, job_id="900001", job_id_display="900001", state="NODE_FAIL",
                submit=back, start=back, end=back + timedelta(seconds=1), nnodes=1, gpus=8,
                nodelist="node02", instance_key="900001:new"))
            conn.execute(insert(job_nodes).values(job_pk=900001, node="node02"))
        while datetime.now(UTC).replace(tzinfo=None) <= back + timedelta(seconds=2):
            time.sleep(0.2)
        assert apply()["node02"]["action"] == "drain"
        assert "DRAIN" in c.node_state("node02")
        assert [a for a, _ in actions()] == ["lemon_drain", "resume", "lemon_drain"]
    finally:
        engine.dispose()
        c.run(["scancel", "-w", "node02"], check=False)
        c.run(["scontrol", "update", "NodeName=node02", "State=RESUME"], check=False)
