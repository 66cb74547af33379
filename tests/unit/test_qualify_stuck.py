"""A drained node whose qualification keeps proving nothing for the same reason gets a repair
ticket from `healthctl qualify auto`, not endless retries; an in-service node never gets a
drain for it; a repair starts the count again (the command on MemorySlurm and the SQLite
historian; tests/slurm/test_qualify_flow.py runs it on the real Slurm)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert, update

from rsc_health.cli import AppContext
from rsc_health.commands.qualify import qualify
from rsc_health.historian.schema import qualify_runs, tickets
from rsc_health.policy import parse_reason
from rsc_health.qualify.flow import HistorianSide, stuck_candidates
from rsc_health.qualify.judge import INCONCLUSIVE, PASS
from rsc_health.slurm.memory import MemorySlurm

STUCK = "rsc_health:qualify:inconclusive:burn: tool not found"
NO_GPU_BURN = "burn: tool not found: ['gpu_burn']"
NOW = datetime.now(UTC).replace(tzinfo=None)




def runs(engine, node, *reasons, verdict=INCONCLUSIVE, last=NOW - timedelta(hours=13)):
    """Stored runs, the last reason the newest."""
    with engine.begin() as conn:
        for i, reason in enumerate(reversed(reasons)):
            ended = last - timedelta(hours=i)
            conn.execute(insert(qualify_runs).values(
                run_id=uuid.uuid4().hex, node=node, tier="full",
                started=ended - timedelta(minutes=9), ended=ended, verdict=verdict,
                reason=reason, gpu_model="NVIDIA H100 80GB HBM3", driver="550.54.15",
                job_id=str(100 + i)))


def auto(url, slurm, tmp_path, *args, config=""):
    cfg = tmp_path / "cli.toml"
    cfg.write_text(config)
    obj = AppContext(config_path=str(cfg), db_url=url)
    obj.slurm = slurm
    return CliRunner().invoke(qualify, ["auto", *args], obj=obj)


def open_tickets(engine, node):
    with engine.connect() as conn:
        return conn.execute(tickets.select().where(tickets.c.node == node,
                                                   tickets.c.closed.is_(None))).all()


def test_a_drained_node_proving_nothing_four_times_for_one_reason_gets_one_ticket(db, tmp_path):
    url, engine = db
    runs(engine, "gpu042", *[NO_GPU_BURN] * 4)
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", STUCK)
    dry = auto(url, slurm, tmp_path, "--dry-run")
    assert "gpu042: 4 inconclusive runs in a row" in dry.output, dry.output
    assert slurm.node("gpu042").reason == STUCK and not open_tickets(engine, "gpu042")

    out = auto(url, slurm, tmp_path)
    assert out.exit_code == 0, out.output
    [ticket] = open_tickets(engine, "gpu042")
    assert ticket.source == "qualify" and NO_GPU_BURN in ticket.reason
    reason = parse_reason(slurm.node("gpu042").reason)
    assert reason["mode"] == "qualify" and reason["code"] == "inconclusive"  # still a re-drain
    assert "repair ticket open after 4 inconclusive runs" in reason["text"]
    assert "DRAIN" in slurm.node("gpu042").state
    assert not [c for c in slurm.calls if c[0] in ("create_reservation", "submit", "resume")]
    auto(url, slurm, tmp_path)  # the next timer run: no second ticket, no run
    assert len(open_tickets(engine, "gpu042")) == 1
    assert not [c for c in slurm.calls if c[0] in ("create_reservation", "submit", "resume")]

    with engine.begin() as conn:  # repaired: due at once, the back-off is not the repair's
        conn.execute(update(tickets).values(closed=NOW))
    assert HistorianSide(engine).inconclusive_reason_streak("gpu042") == (0, "", False)
    out = auto(url, slurm, tmp_path, "--dry-run")
    assert "gpu042: repair ticket closed" in out.output, out.output


def test_runs_proving_nothing_for_different_reasons_or_too_few_are_retried_unticketed(db,
                                                                                     tmp_path):
    url, engine = db
    runs(engine, "a", NO_GPU_BURN, "dcgm: timed out after 600 s", NO_GPU_BURN, NO_GPU_BURN)
    runs(engine, "b", *[NO_GPU_BURN] * 3)
    runs(engine, "c", *[NO_GPU_BURN] * 5, verdict=PASS)
    slurm = MemorySlurm()
    for node in ("a", "b", "c"):
        slurm.add_node(node, "IDLE+DRAIN", STUCK)
    hist = HistorianSide(engine)
    assert hist.inconclusive_reason_streak("a") == (2, NO_GPU_BURN, False)
    assert stuck_candidates(slurm.nodes(), hist, after=4) == []
    assert stuck_candidates(slurm.nodes(), hist, after=0) == []
    out = auto(url, slurm, tmp_path, "--dry-run")
    assert "inconclusive runs in a row" not in out.output, out.output
    assert {"a", "b", "c"} <= {line.split(":")[0] for line in out.output.splitlines()}


def test_an_in_service_node_or_a_persons_drain_is_never_ticketed_or_drained_for_it(db, tmp_path):
    url, engine = db
    for node in ("suspect", "person", "ours_off"):  # within the back-off: no run is due
        runs(engine, node, *[NO_GPU_BURN] * 6, last=NOW - timedelta(minutes=1))
    slurm = MemorySlurm()
    slurm.add_node("suspect", "IDLE", "")
    slurm.add_node("person", "IDLE+DRAIN", "alice: PSU swap")
    slurm.add_node("ours_off", "IDLE+DRAIN", STUCK)
    auto(url, slurm, tmp_path, config="[qualify]\ninconclusive_ticket_after = 0\n")
    auto(url, slurm, tmp_path, config="[actions]\nenabled = false\n")  # shadow mode
    assert slurm.node("suspect").state == "IDLE"
    assert slurm.node("person").reason == "alice: PSU swap"
    assert slurm.node("ours_off").reason == STUCK
    assert not [c for c in slurm.calls if c[0] == "drain"]
    assert not any(open_tickets(engine, n) for n in ("suspect", "person", "ours_off"))


def test_a_controller_gone_as_the_ticket_is_due_leaves_it_for_the_next_auto_run(db, tmp_path):
    """slurmctld vanishing at the reason's update: the ticket is not opened either, so the
    next `qualify auto` does both; opened first, the reason would never have said so."""
    from rsc_health.slurm.api import SlurmUnavailable

    url, engine = db
    runs(engine, "gpu042", *[NO_GPU_BURN] * 4)
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", STUCK)
    real_drain = slurm.drain

    def gone(node, reason):
        raise SlurmUnavailable("Unable to contact slurm controller")

    slurm.drain = gone
    out = auto(url, slurm, tmp_path)
    assert out.exit_code != 0 and not open_tickets(engine, "gpu042")
    slurm.drain = real_drain
    out = auto(url, slurm, tmp_path)
    assert out.exit_code == 0, out.output
    assert len(open_tickets(engine, "gpu042")) == 1
    assert "repair ticket open" in slurm.node("gpu042").reason
