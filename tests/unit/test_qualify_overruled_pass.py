"""A pass stored by a run the flow judged a fail never counts as a pass. The node path drained
the node under the burn (an XID 79: kept, the run a fail, a repair ticket), yet the run's own
process stored `pass` after that drain: once the ticket was closed, `healthctl resume` found
"a qualification pass since the drain" and put the node back in service unproved, the XID 79
never qualified away. The same for a job that ended NODE_FAIL (its surviving process stored a
pass) and for `qualify cleanup` of a flow cut short whose node the node path drained. Now the
flow (and cleanup) marks such a stored pass a fail, overruled, its reason saying why."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert, select, update

from rsc_health.cli import cli
from rsc_health.historian.schema import qualify_runs, tickets
from rsc_health.qualify.flow import Flow, HistorianSide, cleanup, reservation_name
from rsc_health.qualify.judge import FAIL, PASS
from rsc_health.slurm.memory import MemorySlurm

CAME_WITH = "rsc_health:qualify:inconclusive:dcgm_r1 tool not found"
MID = "rsc_health:now:xid79:gpu5 fell off the bus"




def store(engine, node, job_id, verdict=PASS, ended=None):
    """What `qualify run` in the job stores, by the historian's clock."""
    ended = (ended or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None)
    with engine.begin() as conn:
        conn.execute(insert(qualify_runs).values(
            run_id=uuid.uuid4().hex, node=node, tier="full",
            started=ended - timedelta(minutes=9), ended=ended, verdict=verdict, reason="",
            gpu_model="NVIDIA H100 80GB HBM3", driver="550.54.15", job_id=job_id))


def close_tickets(engine):
    with engine.begin() as conn:
        conn.execute(update(tickets).values(closed=datetime.now(UTC).replace(tzinfo=None)
                                            + timedelta(seconds=5)))


def resume(url, slurm, monkeypatch, node):
    monkeypatch.setattr("rsc_health.commands.slurm._slurm", lambda ctx: slurm)
    return CliRunner().invoke(cli, ["--db", url, "resume", node])


def flow(slurm, engine):
    return Flow(slurm, HistorianSide(engine), command=["healthctl"], tier="full",
                timeout_s=20, poll_s=0.01)


def test_a_pass_stored_after_the_node_path_drained_the_node_mid_run_never_resumes_it(
        db, monkeypatch):
    url, engine = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", CAME_WITH,
                   when=datetime.now(UTC) - timedelta(days=1))

    def burn_raises_xid79_then_the_run_stores_its_pass():
        jid = max(slurm._jobs)
        slurm.start_job("gpu042", jid, user="root")
        slurm.drain("gpu042", MID)  # the node path, under the burn
        store(engine, "gpu042", jid, PASS, datetime.now(UTC) + timedelta(seconds=2))
        slurm.end_job(jid)

    slurm.after("submit", burn_raises_xid79_then_the_run_stores_its_pass)
    r = flow(slurm, engine).run("gpu042")
    assert r.result == FAIL and slurm.info["gpu042"].reason == MID, r
    close_tickets(engine)  # the repair ticket the fail opened, closed by whoever repaired
    out = resume(url, slurm, monkeypatch, "gpu042")
    print(out.output)
    assert out.exit_code == 1 and "gpu042: refused" in out.output, out.output
    assert slurm.info["gpu042"].drain_set and slurm.info["gpu042"].reason == MID
    with engine.connect() as conn:
        [(verdict, reason)] = conn.execute(select(qualify_runs.c.verdict,
                                                  qualify_runs.c.reason)).all()
    assert verdict == FAIL and "xid79" in reason, reason


def test_a_pass_stored_by_a_job_that_ended_node_fail_is_no_pass(db):
    _, engine = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", CAME_WITH)

    def node_dies_its_run_stores_a_pass():
        jid = max(slurm._jobs)
        slurm.start_job("gpu042", jid, user="root")
        store(engine, "gpu042", jid, PASS)
        slurm.set_state("gpu042", "DOWN*", "Not responding", user="slurm")
        slurm.end_job(jid, "NODE_FAIL", listed=True)

    slurm.after("submit", node_dies_its_run_stores_a_pass)
    r = flow(slurm, engine).run("gpu042")
    assert r.result == FAIL and "NODE_FAIL" in r.detail, r
    assert not HistorianSide(engine).passed_since("gpu042", None)


def test_cleanup_overrules_a_pass_stored_after_the_node_path_drained_the_cut_short_flow(
        db, monkeypatch):
    url, engine = db
    t0 = datetime.now(UTC)
    slurm = MemorySlurm(now=lambda: t0)
    slurm.add_node("gpu042", "IDLE")  # resumed into its reservation, then the flow was killed
    slurm.create_reservation(reservation_name("gpu042"), "gpu042")
    slurm.drain("gpu042", MID)
    store(engine, "gpu042", "4242", PASS, t0 + timedelta(seconds=3))
    [r] = cleanup(slurm, HistorianSide(engine))
    assert r.result == FAIL and slurm.info["gpu042"].reason == MID, r
    close_tickets(engine)
    out = resume(url, slurm, monkeypatch, "gpu042")
    assert out.exit_code == 1 and "gpu042: refused" in out.output, out.output
