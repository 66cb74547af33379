"""`qualify cleanup` (the timer runs it before every `qualify auto`) took every reservation
older than [qualify] flow_timeout_s + 5 min for one a flow left: a person's `qualify start
--timeout 7200` still waiting on its job after 75 minutes had its node drained `interrupted`
and its reservation deleted under it, and when the job's pass came the flow said `pass` with
the node left drained. Now the flow records its own deadline (its timeout and the finish
after) with its start, and cleanup leaves a reservation alone until that deadline has passed;
one whose flow recorded none is judged by the cut-off as before, and an explicit --older-than
is taken as given."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert, update

from rsc_health.cli import AppContext
from rsc_health.commands.qualify import qualify
from rsc_health.historian.schema import node_actions, qualify_runs
from rsc_health.model import ActionKind
from rsc_health.policy import parse_reason
from rsc_health.qualify.flow import Flow, HistorianSide, reservation_name
from rsc_health.qualify.judge import PASS
from rsc_health.slurm.api import SlurmCommandError
from rsc_health.slurm.memory import MemorySlurm

CAME_WITH = "rsc_health:qualify:inconclusive:dcgm_r1 tool not found"




def timer_cleanup(url, slurm, tmp_path, *args):
    cfg = tmp_path / "cli.toml"
    cfg.write_text("")  # [qualify] flow_timeout_s as shipped: 4200 s
    obj = AppContext(config_path=str(cfg), db_url=url)
    obj.slurm = slurm
    return CliRunner().invoke(qualify, ["cleanup", *args], obj=obj)


def test_cleanup_leaves_a_flow_alone_within_its_own_longer_timeout(db, tmp_path):
    url, engine = db
    clock = [datetime.now(UTC) - timedelta(seconds=4600)]  # the flow began 4600 s ago
    slurm = MemorySlurm(now=lambda: clock[0])
    slurm.add_node("gpu042", "IDLE+DRAIN", CAME_WITH, when=clock[0] - timedelta(days=1))
    cleaned = []

    def the_timer_cleans_up_while_the_job_runs_then_it_passes():
        jid = max(slurm._jobs)
        slurm.start_job("gpu042", jid, user="root")
        clock[0] = datetime.now(UTC)
        cleaned.append(timer_cleanup(url, slurm, tmp_path))
        ended = datetime.now(UTC).replace(tzinfo=None)
        with engine.begin() as conn:
            conn.execute(insert(qualify_runs).values(
                run_id=uuid.uuid4().hex, node="gpu042", tier="full",
                started=ended - timedelta(minutes=70), ended=ended, verdict=PASS, reason="",
                gpu_model="NVIDIA H100 80GB HBM3", driver="550.54.15", job_id=jid))
        slurm.end_job(jid)

    slurm.after("submit", the_timer_cleans_up_while_the_job_runs_then_it_passes)
    # `qualify start gpu042 --timeout 7200`
    r = Flow(slurm, HistorianSide(engine), command=["healthctl"], tier="full", timeout_s=7200,
             poll_s=0.01).run("gpu042")
    print(cleaned[0].output)
    # The flow's pass, and the node in service by it (not drained `interrupted` under it).
    assert r.result == PASS and not slurm.info["gpu042"].drain_set, (r, slurm.info["gpu042"])
    assert "gpu042" not in cleaned[0].output, cleaned[0].output
    assert not [c for c in slurm.calls if c[0] == "drain"], slurm.calls
    assert not slurm.reservations()


def test_cleanup_takes_a_flow_past_its_own_deadline_or_one_that_recorded_none(db, tmp_path):
    url, engine = db
    t0 = datetime.now(UTC)
    slurm = MemorySlurm(now=lambda: t0 - timedelta(seconds=4600))
    for n in ("short", "unrecorded", "long"):
        slurm.add_node(n, "IDLE")
        slurm.create_reservation(reservation_name(n), n)
    hist = HistorianSide(engine)
    # Each flow's start as Flow.run records it: "short" had 600 s, long ago; "long" 7200 s.
    Flow(slurm, hist, command=["healthctl"], tier="full", timeout_s=600)._started(
        "short", reservation_name("short"), t0 - timedelta(seconds=4590))
    Flow(slurm, hist, command=["healthctl"], tier="full", timeout_s=7200)._started(
        "long", reservation_name("long"), t0 - timedelta(seconds=4590))
    out = timer_cleanup(url, slurm, tmp_path)
    print(out.output)
    assert set(slurm.reservations()) == {reservation_name("long")}
    for n in ("short", "unrecorded"):
        assert parse_reason(slurm.info[n].reason)["code"] == "interrupted"
    assert not slurm.info["long"].drain_set
    # A person's explicit cut-off is taken as given: the long flow's reservation too.
    timer_cleanup(url, slurm, tmp_path, "--older-than", "0")
    assert not slurm.reservations()


def test_an_earlier_flows_long_deadline_does_not_hold_a_later_flows_left_reservation(
        db, tmp_path):
    """Found by helper-130: cleanup took the newest qualify_start of the node since 10 min
    before the reservation began for the flow that made it. A flow refused after making its
    reservation (a person's reservation seen only then), Slurm refusing the delete ("qualify
    cleanup removes it"), writes none: the reservation was left alone until an EARLIER flow's
    deadline, a person's `--timeout 86400` 7 minutes before, and the node sat in our MAINT
    reservation for a day. A flow's start now names its reservation's start."""
    url, engine = db
    now = datetime.now(UTC)
    clock = [now - timedelta(minutes=88)]
    slurm = MemorySlurm(now=lambda: clock[0])
    slurm.add_node("gpu1", "IDLE+DRAIN", CAME_WITH, when=now - timedelta(days=1))
    hist = HistorianSide(engine)

    # Flow A: `qualify start gpu1 --timeout 86400`, 88 min ago; its job ended at once with no
    # result (inconclusive) and A deleted its reservation.
    slurm.after("submit", lambda: slurm.end_job(max(slurm._jobs)))
    a = Flow(slurm, hist, command=["healthctl"], tier="full", timeout_s=86400,
             poll_s=0.01).run("gpu1")
    assert a.result == "inconclusive" and not slurm.reservations(), a
    with engine.begin() as conn:  # written when it ran, 88 min ago
        conn.execute(update(node_actions).where(
            node_actions.c.action == ActionKind.QUALIFY_START.value).values(
            time=clock[0].replace(tzinfo=None)))

    # Flow B, 7 min later: a person's reservation seen only once ours was made, and Slurm
    # refused the delete: ours left for `qualify cleanup`, no qualify_start written.
    clock[0] = now - timedelta(minutes=81)

    def refused(name):
        raise SlurmCommandError(["scontrol", "delete", "reservation"], 1, "in use")

    def persons_reservation_meanwhile():
        slurm.add_reservation("maint_bob", "gpu1")
        slurm.delete_reservation = refused
    slurm.after("create_reservation", persons_reservation_meanwhile)
    b = Flow(slurm, hist, command=["healthctl"], tier="full", timeout_s=4200,
             poll_s=0.01).run("gpu1")
    assert b.result == "refused" and reservation_name("gpu1") in slurm.reservations(), b
    del slurm.delete_reservation
    slurm.delete_reservation("maint_bob")  # bob's maintenance done

    # The timer's cleanup ([qualify] flow_timeout_s 4200 + 300 s = 75 min): B's is 81 min old.
    out = timer_cleanup(url, slurm, tmp_path)
    print(out.output)
    assert not slurm.reservations(), "held until A's deadline, 22 h from now"
    assert parse_reason(slurm.info["gpu1"].reason)["code"] == "interrupted"
