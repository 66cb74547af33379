"""Issue 24's remaining triggers and limits of qualification, on the shipped MemorySlurm and a
real SQLite historian:
- a person's `healthctl resume` of a node with an rsc-health repair drain is refused (sent to
  `qualify start`) unless a qualification pass is stored since the drain, or --force;
- three strikes (Aegis): a node that passed and then was drained in production `strikes` times
  within the window goes to repair (drain rsc_health:qualify:three_strikes + ticket), never
  into qualification; a closed repair ticket starts the count again;
- the mass-drain guard holds back a qualification fail's drain when the partition is at its
  limit: no fail drain, no ticket, a retry code (never a pass: the node stays drained)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.cli import cli
from rsc_health.historian.schema import node_actions, qualify_runs, tickets
from rsc_health.model import ActionKind
from rsc_health.policy import parse_reason
from rsc_health.qualify.flow import (
    RETRY_CODES,
    STRIKES_CODE,
    Flow,
    HistorianSide,
    auto_candidates,
    mass_drain_guard,
    strike_candidates,
)
from rsc_health.qualify.judge import FAIL, PASS
from rsc_health.slurm.memory import MemorySlurm

XID79 = "rsc_health:now:xid79:gpu3 fell off the bus"
LEMON = "rsc_health:lemon:node_fails:node_fails 4 (min 3)"


def naive(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)




def add_run(engine, node, verdict, ended):
    with engine.begin() as conn:
        conn.execute(insert(qualify_runs).values(
            run_id=uuid.uuid4().hex, node=node, tier="full", started=ended - timedelta(minutes=9),
            ended=ended, verdict=verdict, reason="", gpu_model="NVIDIA H100 80GB HBM3",
            driver="550.54.15", job_id="77"))


def add_drain(engine, node, when, kind=ActionKind.DRAIN_NOW):
    with engine.begin() as conn:
        conn.execute(insert(node_actions).values(id=uuid.uuid4().hex, time=when, node=node,
                                                 action=kind.value, reason=XID79))


# ---- a person's resume ------------------------------------------------------------------------
def resume(url, slurm, monkeypatch, *args):
    monkeypatch.setattr("rsc_health.commands.slurm._slurm", lambda ctx: slurm)
    return CliRunner().invoke(cli, ["--db", url, "resume", *args])


@pytest.mark.parametrize("reason", [XID79, LEMON, "rsc_health:qualify:gpu_burn:gflops 5% low",
                                    "rsc_health:qualify:inconclusive:dcgm_r1 tool not found"])
def test_resume_of_a_repair_drain_without_a_pass_is_refused_and_sent_to_qualification(
        db, monkeypatch, reason):
    url, _ = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", reason)
    out = resume(url, slurm, monkeypatch, "gpu042")
    assert out.exit_code == 1, out.output
    assert "qualify start gpu042" in out.output
    assert "DRAIN" in slurm.node("gpu042").state
    assert not [c for c in slurm.calls if c[0] == "resume"]


def test_resume_after_a_stored_pass_since_the_drain_or_with_force_goes_through(db, monkeypatch):
    url, engine = db
    drained = datetime.now(UTC) - timedelta(hours=5)
    slurm = MemorySlurm()
    slurm.add_node("passed", "IDLE+DRAIN", XID79, when=drained)
    slurm.add_node("old_pass", "IDLE+DRAIN", XID79, when=drained)
    slurm.add_node("forced", "IDLE+DRAIN", XID79, when=drained)
    add_run(engine, "passed", PASS, naive(drained) + timedelta(hours=1))
    add_run(engine, "old_pass", PASS, naive(drained) - timedelta(hours=1))  # before the drain
    add_run(engine, "old_pass", FAIL, naive(drained) + timedelta(hours=1))  # a fail is no pass
    out = resume(url, slurm, monkeypatch, "passed,old_pass")
    assert out.exit_code == 1
    assert "passed: resumed" in out.output and "old_pass: refused" in out.output
    assert resume(url, slurm, monkeypatch, "forced", "--force").exit_code == 0
    assert "DRAIN" not in slurm.node("forced").state


def test_a_pass_in_the_drains_own_second_does_not_count(db, monkeypatch):
    """Slurm stamps a drain to the whole second, so a pass that ended within that second may
    be from before it (the node failed again at once, as on the real cluster): refused; a pass
    from the next second on counts."""
    url, engine = db
    drained = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=5)
    slurm = MemorySlurm()
    slurm.add_node("same_second", "IDLE+DRAIN", XID79, when=drained)
    slurm.add_node("next_second", "IDLE+DRAIN", XID79, when=drained)
    add_run(engine, "same_second", PASS, naive(drained) + timedelta(milliseconds=700))
    add_run(engine, "next_second", PASS, naive(drained) + timedelta(seconds=1, milliseconds=1))
    out = resume(url, slurm, monkeypatch, "same_second,next_second")
    assert out.exit_code == 1
    assert "same_second: refused" in out.output and "next_second: resumed" in out.output


def test_resume_of_a_transient_or_a_persons_healthctl_drain_needs_no_qualification(
        db, monkeypatch):
    url, _ = db
    slurm = MemorySlurm()
    slurm.add_node("leftover", "IDLE+DRAIN", "rsc_health:now:leftover_process:gpu0 pid 4242")
    slurm.add_node("manual", "IDLE+DRAIN", "rsc_health:manual:manual:DIMM reseat by bob")
    monkeypatch.setenv("SUDO_USER", "bob")  # bob's own drain: another's needs --force
    out = resume(url, slurm, monkeypatch, "leftover,manual")
    assert out.exit_code == 0, out.output


def test_resume_of_a_repair_drain_with_no_historian_to_ask_is_refused(monkeypatch, tmp_path):
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", XID79)
    monkeypatch.setattr("rsc_health.commands.slurm._slurm", lambda ctx: slurm)
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    out = CliRunner().invoke(cli, ["--config", str(cfg), "resume", "gpu042"])
    assert out.exit_code == 1 and "no historian" in out.output, out.output


# ---- three strikes ----------------------------------------------------------------------------
def test_strikes_count_drains_since_the_last_pass_within_the_window_and_since_a_repair(db):
    _, engine = db
    now = naive(datetime.now(UTC))
    add_run(engine, "n1", PASS, now - timedelta(days=20))
    for d in (15, 10, 5):
        add_drain(engine, "n1", now - timedelta(days=d))
    add_drain(engine, "n1", now - timedelta(days=25))  # before the pass: not a strike
    add_drain(engine, "n1", now - timedelta(days=4), ActionKind.MANUAL_DRAIN)  # a person's
    assert HistorianSide(engine).strikes("n1") == 3
    assert HistorianSide(engine, strikes_window_days=12).strikes("n1") == 2
    assert HistorianSide(engine).strikes("never_passed") == 0
    with engine.begin() as conn:
        conn.execute(insert(tickets).values(node="n1", opened=now - timedelta(days=9),
                                            closed=now - timedelta(days=7), reason="RMA",
                                            source="qualify"))
    assert HistorianSide(engine).strikes("n1") == 1  # the repair started the count again


class History:
    """The flow's historian side, in memory."""

    def __init__(self, strikes=None, result=None):
        self._strikes, self._result = strikes or {}, result
        self.actions, self.tickets = [], []

    def strikes(self, node):
        return self._strikes.get(node, 0)

    def now(self):  # the historian's clock
        return datetime.now(UTC)

    def result(self, node, job_id, since=None):
        return self._result

    def action(self, node, kind, reason):
        self.actions.append((node, kind, reason))

    def repair_ticket(self, node, reason):
        self.tickets.append((node, reason))

    def overrule(self, node, why, *, since, job_id=None):
        return 0


def flow(slurm, hist, **kw):
    return Flow(slurm, hist, command=["healthctl"], tier="full", timeout_s=5, poll_s=0.01, **kw)


def test_a_node_with_three_strikes_goes_to_repair_not_into_qualification():
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", XID79)
    hist = History(strikes={"gpu042": 3})
    r = flow(slurm, hist).run("gpu042")
    assert r.result == "refused" and "repair" in r.detail
    info = slurm.node("gpu042")
    assert "DRAIN" in info.state and parse_reason(info.reason)["code"] == STRIKES_CODE
    assert hist.tickets and not slurm.reservations()
    assert not [c for c in slurm.calls if c[0] in ("resume", "submit", "create_reservation")]
    # Asked again: the ticket stays one, the drain is not rewritten.
    drains = len([c for c in slurm.calls if c[0] == "drain"])
    flow(slurm, hist).run("gpu042")
    assert len([c for c in slurm.calls if c[0] == "drain"]) == drains


def test_strikes_limit_is_the_configured_one_and_a_persons_drain_is_never_rewritten():
    slurm = MemorySlurm()
    slurm.add_node("a", "IDLE+DRAIN", XID79)
    slurm.add_node("p", "IDLE+DRAIN", "alice: BIOS update")
    slurm.add_node("d", "DOWN+DRAIN", XID79)
    hist = History(strikes={"a": 2, "p": 5, "d": 5})
    assert flow(slurm, hist, strikes=2).run("a").actions == ("drained for repair", "ticket")
    for n in ("p", "d"):
        assert flow(slurm, hist, strikes=2).run(n).result == "refused"
    assert slurm.node("p").reason == "alice: BIOS update"
    assert [t[0] for t in hist.tickets] == ["a"]


def test_qualify_auto_sends_struck_nodes_to_repair_first_and_their_closed_ticket_back():
    now = datetime(2026, 11, 26, 12, 0)
    slurm = MemorySlurm()
    slurm.add_node("s", "IDLE+DRAIN", XID79)
    slurm.add_node("t", "IDLE+DRAIN", "rsc_health:qualify:three_strikes:3 failures after a pass")
    slurm.add_node("m", "IDLE+DRAIN", "rsc_health:manual:manual:PSU swap by bob")
    hist = History(strikes={"s": 3, "t": 3, "m": 9})
    assert strike_candidates(slurm.nodes(), hist, strikes=3, limit=4) == [("s", 3)]

    class Closed:
        def ticket_closed_after(self, node, since):
            return datetime(2026, 11, 26, 11, 0)

        def inconclusive_streak(self, node):
            return 0, None

    due = auto_candidates([slurm.node("t")], Closed(), now, retry_min=30, retry_max_min=720,
                          limit=4)
    assert [n for n, _ in due] == ["t"]


# ---- the mass-drain guard over qualification fails --------------------------------------------
def fleet(n_drained: int, total: int = 20) -> MemorySlurm:
    slurm = MemorySlurm()
    for i in range(total):
        if i < n_drained:
            slurm.add_node(f"n{i:02d}", "IDLE+DRAIN",
                           "rsc_health:qualify:gpu_burn:gflops 9% under peers")
        else:
            slurm.add_node(f"n{i:02d}", "IDLE+DRAIN" if i == total - 1 else "IDLE",
                           XID79 if i == total - 1 else "",
                           when=datetime.now(UTC) - timedelta(days=2))
    return slurm


class Cfg(dict):
    def get(self, key, default=None):
        return self[key]


CFG = Cfg({"actions.guard_max_share": 0.10, "actions.guard_window_min": 15})


def run_to_a_fail(slurm, node, guard, suspect=False):
    hist = History(result=(FAIL, "gpu_burn: gflops[3] 9% under the peers' median"))

    def job_runs():
        for jid, job in list(slurm._jobs.items()):
            if job.state == "PENDING":
                slurm.start_job(node, jid)

    slurm.after("submit", job_runs)
    return flow(slurm, hist, guard=guard).run(node, suspect=suspect), hist


def test_a_qualification_fail_under_the_partitions_limit_drains_with_a_ticket():
    slurm = fleet(1)  # 1 of 20 drained within the window: the limit is 2
    r, hist = run_to_a_fail(slurm, "n19", mass_drain_guard(slurm, CFG))
    assert r.result == FAIL and hist.tickets
    assert parse_reason(slurm.node("n19").reason)["code"] == "gpu_burn"
    assert not slurm.reservations()


def test_a_qualification_fail_past_the_limit_is_held_drained_retryable_and_unticketed():
    slurm = fleet(2)  # a broken tool failed two nodes already: the partition is at its limit
    r, hist = run_to_a_fail(slurm, "n19", mass_drain_guard(slurm, CFG))
    assert r.result == "inconclusive" and "mass-drain guard: 2/20" in r.detail
    info = slurm.node("n19")
    assert "DRAIN" in info.state  # never back in service without a pass
    assert parse_reason(info.reason)["code"] in RETRY_CODES
    assert not hist.tickets
    assert [k for _, k, _ in hist.actions].count(ActionKind.GUARD_TRIPPED) == 1
    assert not slurm.reservations()


def test_a_held_fail_of_an_undrained_suspect_leaves_it_a_suspect_not_drained():
    slurm = fleet(2)
    slurm.set_state("n19", "IDLE", "")
    r, hist = run_to_a_fail(slurm, "n19", mass_drain_guard(slurm, CFG), suspect=True)
    assert r.result == "inconclusive"
    r2 = slurm.node("n19")
    assert "DRAIN" not in r2.state and not hist.tickets


def test_the_guard_reads_slurms_own_view_so_fails_of_one_run_count_against_the_next():
    slurm = fleet(1)
    slurm.add_node("n18", "IDLE+DRAIN", XID79, when=datetime.now(UTC) - timedelta(days=2))
    guard = mass_drain_guard(slurm, CFG)
    r1, _ = run_to_a_fail(slurm, "n18", guard)
    assert r1.result == FAIL
    slurm.add_node("n17", "IDLE+DRAIN", XID79, when=datetime.now(UTC) - timedelta(days=2))
    r2, _ = run_to_a_fail(slurm, "n17", guard)
    assert r2.result == "inconclusive" and "guard" in r2.detail



def test_a_lemon_verdicts_drain_is_qualified_once_its_repair_ticket_closes():
    """The lemon trigger: `healthctl lemons --apply` drains rsc_health:lemon:... with a ticket;
    the ticket's closing (the repair) makes the node due, never before."""
    now = datetime(2026, 11, 26, 12, 0)
    slurm = MemorySlurm()
    slurm.add_node("lemon", "IDLE+DRAIN", LEMON, when=datetime(2026, 11, 20, tzinfo=UTC))

    class Tickets:
        def __init__(self, closed):
            self.closed = closed

        def ticket_closed_after(self, node, since):
            return self.closed if self.closed and self.closed > since else None

        def inconclusive_streak(self, node):
            return 0, None

    kw = dict(retry_min=30, retry_max_min=720, limit=4)
    assert auto_candidates(slurm.nodes(), Tickets(None), now, **kw) == []
    assert auto_candidates(slurm.nodes(), Tickets(datetime(2026, 11, 19)), now, **kw) == []
    assert [n for n, _ in auto_candidates(slurm.nodes(), Tickets(datetime(2026, 11, 25)), now,
                                          **kw)] == ["lemon"]


def test_healthctl_qualify_auto_drains_a_struck_node_for_repair_with_a_ticket(db, tmp_path):
    """The command end to end on MemorySlurm and the SQLite historian: a node that passed, then
    was drained three times by our checks, is sent to repair (not qualified: no reservation, no
    job), with one ticket; a dry run touches nothing."""
    from rsc_health.cli import AppContext
    from rsc_health.commands.qualify import qualify

    url, engine = db
    now = naive(datetime.now(UTC))
    add_run(engine, "gpu042", PASS, now - timedelta(days=6))
    for d in (5, 3, 1):
        add_drain(engine, "gpu042", now - timedelta(days=d))
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", XID79)
    config = tmp_path / "cli.toml"
    config.write_text("")

    def obj():
        o = AppContext(config_path=str(config), db_url=url)
        o.slurm = slurm
        return o

    dry = CliRunner().invoke(qualify, ["auto", "--dry-run"], obj=obj())
    assert dry.exit_code == 0 and "gpu042: 3 production failures" in dry.output, dry.output
    assert slurm.node("gpu042").reason == XID79
    out = CliRunner().invoke(qualify, ["auto"], obj=obj())
    assert out.exit_code == 0, out.output
    assert "-> repair" in out.output
    assert parse_reason(slurm.node("gpu042").reason)["code"] == STRIKES_CODE
    assert not [c for c in slurm.calls if c[0] in ("create_reservation", "submit", "resume")]
    with engine.connect() as conn:
        rows = conn.execute(tickets.select().where(tickets.c.node == "gpu042")).all()
    assert len(rows) == 1 and rows[0].source == "qualify"
    CliRunner().invoke(qualify, ["auto"], obj=obj())  # the next timer run: still one ticket
    with engine.connect() as conn:
        assert len(conn.execute(tickets.select()).all()) == 1


def test_a_pass_stored_under_the_same_job_id_long_ago_does_not_release_the_node(db):
    """Slurm reuses job ids (a slurmctld started on a fresh StateSaveLocation begins again at
    FirstJobId; MaxJobId wraps): a pass of this node stored 40 days ago under the id the new
    qualification job gets was taken as that job's result at once, and the node went back
    into service without running anything. Only a result stored since the job's submission
    is its own."""
    _, engine = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", XID79)
    next_id = str(slurm._next_job + 1)  # the id the flow's sbatch will get
    with engine.begin() as conn:
        conn.execute(insert(qualify_runs).values(
            run_id=uuid.uuid4().hex, node="gpu042", tier="full",
            started=naive(datetime.now(UTC)) - timedelta(days=40, minutes=9),
            ended=naive(datetime.now(UTC)) - timedelta(days=40), verdict=PASS, reason="",
            gpu_model="NVIDIA H100 80GB HBM3", driver="550.54.15", job_id=next_id))
    r = Flow(slurm, HistorianSide(engine), command=["healthctl"], tier="full", timeout_s=0.3,
             poll_s=0.01).run("gpu042")
    assert r.job_id == next_id
    assert r.result == "inconclusive", r
    info = slurm.node("gpu042")
    assert "DRAIN" in info.state and parse_reason(info.reason)["mode"] == "qualify"
    assert not slurm.reservations()


def test_a_management_clock_ahead_of_the_historians_still_finds_the_jobs_result(
        db, monkeypatch):
    """`qualify run` stamps its run by the historian's clock (PostgreSQL's now()), and the
    flow looked for it from its submission by this host's clock: a management host 20 minutes
    fast never found the pass its job stored, and every qualification ended inconclusive and
    drained the node again. The submission is stamped by the historian's clock too."""
    _, engine = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", XID79)
    next_id = str(slurm._next_job + 1)

    def store():  # the job's `qualify run`, stamped by the historian (here: the true time)
        ended = naive(datetime.now(UTC))
        with engine.begin() as conn:
            conn.execute(insert(qualify_runs).values(
                run_id=uuid.uuid4().hex, node="gpu042", tier="full",
                started=ended - timedelta(minutes=9), ended=ended, verdict=PASS, reason="",
                gpu_model="NVIDIA H100 80GB HBM3", driver="550.54.15", job_id=next_id))

    class Fast(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + timedelta(minutes=20)

    monkeypatch.setattr("rsc_health.qualify.flow.datetime", Fast)
    slurm.after("submit", store)
    r = Flow(slurm, HistorianSide(engine), command=["healthctl"], tier="full", timeout_s=0.5,
             poll_s=0.01).run("gpu042")
    assert r.job_id == next_id
    assert r.result == PASS, r
    assert not slurm.node("gpu042").drain_set and not slurm.reservations()


def test_qualify_start_naming_a_node_twice_runs_one_flow_for_it(db, tmp_path):
    """`qualify start gpu[041-042],gpu042`: hostlists keep repeats, so gpu042 got two flows.
    One after another (here), the second found it resumed by the first: refused, and the
    command exited 1 though every node passed; side by side, the second's reservation could be
    refused as a duplicate and the command die with a traceback once the first had finished."""
    from rsc_health.cli import AppContext
    from rsc_health.commands.qualify import qualify

    url, engine = db
    slurm = MemorySlurm()
    for name in ("gpu041", "gpu042"):
        slurm.add_node(name, "IDLE+DRAIN", XID79)

    stored: set[str] = set()

    def passes():  # each qualification job stores its pass as `qualify run` does
        for job_id in [c[1] for c in slurm.calls if c[0] == "submit"]:
            if job_id in stored:
                continue
            stored.add(job_id)
            node = next(o.split("=", 1)[1] for o in slurm._jobs[job_id].options
                        if o.startswith("--nodelist="))
            ended = naive(datetime.now(UTC))
            with engine.begin() as conn:
                conn.execute(insert(qualify_runs).values(
                    run_id=uuid.uuid4().hex, node=node, tier="full", started=ended,
                    ended=ended, verdict=PASS, reason="", gpu_model="H100", driver="550",
                    job_id=job_id))
        slurm.after("submit", passes)  # the next submission's too

    config = tmp_path / "c.toml"
    config.write_text("[qualify]\nparallel = 1\n")
    obj = AppContext(config_path=str(config), db_url=url)
    obj.slurm = slurm
    slurm.after("submit", passes)
    out = CliRunner().invoke(qualify, ["start", "gpu[041-042],gpu042", "--json",
                                       "--timeout", "20"], obj=obj)
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    results = json.loads(out.output)
    assert [(r["node"], r["result"]) for r in results] == [("gpu041", PASS), ("gpu042", PASS)]
    assert len([c for c in slurm.calls if c[0] == "submit"]) == 2
