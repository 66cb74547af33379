"""The qualification flow in Slurm, from the management host: a node drained by rsc-health is
proved against its peers before it takes ordinary jobs again.

    1. refuse a person's drain, a DOWN node, a reboot or power change Slurm holds, and a node
       that failed in production three times since its last pass (repair, not qualification:
       Aegis's three strikes) -- nothing in Slurm is touched for those;
    2. a maintenance reservation of the node (rsc_health_qualify_<node>) for the flow's
       own user (root, or the timer's rsc-health: Slurm refuses a job into a reservation
       not naming its user, an Administrator's too), so no
       ordinary job can start there; only then is the node resumed (into it);
    3. the qualification job: sbatch --reservation, -w node, --exclusive, running
       `healthctl qualify run --tier T` on the node, which judges and stores the result;
    4. the stored result of that job decides: a pass deletes the reservation (back in service);
       a fail or no result (inconclusive, job killed, controller gone) drains the node again
       with rsc_health:qualify:<code> BEFORE the reservation goes, so at no moment can an
       ordinary job reach a node without a stored pass.

Shadow mode ([actions] enabled = false) touches nothing and says what it would have done.
Anything left by a flow cut short (the command killed, slurmctld restarted) is a reservation
named rsc_health_qualify_*: `healthctl qualify cleanup` drains its node and removes it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rsc_health.model import QUALIFY_RESERVATION_PREFIX, REASON_PREFIX, ActionKind
from rsc_health.policy import QUALIFY_MODE, is_ours
from rsc_health.qualify.judge import FAIL, INCONCLUSIVE, PASS
from rsc_health.slurm.api import SlurmError

RESERVATION_PREFIX = QUALIFY_RESERVATION_PREFIX
STRIKES = 3  # [qualify] strikes: the default of Flow's `strikes` when no config is at hand
# Proved nothing (or a fail the mass-drain guard held back): qualify again after a back-off.
RETRY_CODES = ("inconclusive", "interrupted", "guard_held")
# A drained node whose runs proved nothing this many times in a row, each for the same reason
# (a tool missing there, a GPU the tool cannot use): broken in a way no run will prove, so a
# repair ticket, not another retry ([qualify] inconclusive_ticket_after; this when no config
# is at hand). Flow.stuck.
INCONCLUSIVE_TICKET_AFTER = 4
# A node that passed and then failed in production `strikes` times: repair, not qualification
# (Aegis's three strikes). Its drain carries this code and a ticket; the ticket's closing is
# what makes it a candidate again (auto_candidates), its strikes counted from then on.
STRIKES_CODE = "three_strikes"
# A qualification run's times are the historian's clock (qualify run stamps them with it), and
# so is the job's submission (history.now()): a result counts as the job's from this long before
# the submission on (the run's start, carried by the node's monotonic clock, and the database
# server's own steps).
RESULT_CLOCK_SLACK = timedelta(minutes=10)
# Slurm's job states that are not an end (slurm.h's job_states and the flags squeue prints as
# a state): any other is one. The flow once listed the ends it knew, and a job that ended
# BOOT_FAIL or DEADLINE, listed by `squeue -t all` for MinJobAge, kept it waiting its whole
# timeout (helper-124).
NOT_ENDED = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING",
                       "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
                       "SIGNALING", "STAGE_OUT", "STOPPED", "RESIZING", "POWER_UP_NODE",
                       "UPDATE_DB"})
# Ends where the node, not the job, failed: the node stopped answering, or never booted for it.
NODE_ENDS = frozenset({"NODE_FAIL", "BOOT_FAIL"})


# How long after its timeout a flow may still hold the node (the job's end, the drain, the
# reservation's delete): a reservation not ours starting within the timeout and this is refused.
FINISH_SLACK_S = 300.0
# How a flow's start (its qualify_start action) says until when it holds the node: its
# timeout and FINISH_SLACK_S from its start. `qualify cleanup` reads it (flow_deadline).
UNTIL_WORDS = "; flow until "
UNTIL_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# And which reservation it made: the reservation's start as Slurm lists it, after the name
# (`full tier in rsc_health_qualify_gpu1 from 2025-01-01T10:00:00Z; flow until ...`). Every
# flow of a node makes a reservation of the same name: a start naming another's is not this
# reservation's flow. One naming no start (an older version's; Slurm did not list it) counts
# only when written at or after the reservation began, this much before allowed for the
# flow host's clock against slurmctld's.
RESERVED_WORDS = " from "
START_CLOCK_SLACK = timedelta(minutes=1)


@dataclass
class FlowResult:
    node: str
    result: str          # pass | fail | inconclusive | refused | would_qualify
    detail: str = ""
    job_id: str | None = None
    actions: tuple[str, ...] = ()


def reservation_name(node: str) -> str:
    return RESERVATION_PREFIX + node


def qualify_reason(code: str, text: str, out_since: datetime | None = None) -> str:
    """`out_since`: when the node, drained before the flow, left service (a fail's re-drain
    says so first in its text, policy.OUT_SINCE_PREFIX: the guard counts it from then). A
    text that starts with its code (a fail's detail: `gpu_burn: gpu-burn/...`) does not say
    it twice: Slurm's reason is 120 characters an operator reads in `sinfo -R`."""
    from rsc_health.policy import MAX_CODE_LEN, MAX_REASON_LEN, OUT_SINCE_PREFIX, sanitize

    text = text.strip()
    if code and text.startswith(f"{code}:"):
        text = text[len(code) + 1:].strip() or text
    if out_since is not None:
        text = f"{OUT_SINCE_PREFIX}{out_since.astimezone(UTC):%Y-%m-%dT%H:%M}Z {text}"
    reason = (f"{REASON_PREFIX}{QUALIFY_MODE}:{sanitize(code).replace(':', '_')[:MAX_CODE_LEN]}:"
              f"{sanitize(text)}")
    return reason[:MAX_REASON_LEN].rstrip()


def out_of_service_since(info) -> datetime | None:
    """When a node that comes to qualification drained left service: its drain's reason time,
    or the time an earlier fail's re-drain already carried (policy.qualify_out_since)."""
    from rsc_health.policy import qualify_out_since

    if not info.drain_set:
        return None
    since = qualify_out_since(info.reason)
    if since is None or info.reason_time is None:
        return info.reason_time if since is None else since
    return min(since, info.reason_time)


def refusal(info, strikes: int, suspect: bool = False, limit: int = STRIKES) -> str | None:
    """Why this node must not be qualified now, or None. A suspect (rsc_health/suspects.py)
    is qualified undrained: the reservation keeps ordinary jobs off it meanwhile."""
    if info.down:
        return f"{info.state}: DOWN is Slurm's or a person's, not ours to touch"
    if info.in_hand:
        return f"Slurm holds a {info.in_hand} for it"
    if not info.drain_set and not suspect:
        return "not drained: drain it first (qualification takes drained nodes back)"
    if not info.drain_set:
        return None
    theirs = _persons_drain(info)
    if theirs:
        return theirs
    if strikes >= limit:
        return (f"{strikes} production failures since its last qualification pass: repair, "
                "not qualification")
    return None


class Flow:
    """One node's qualification. `slurm`: a SlurmAPI with reservations and jobs (CliSlurm);
    `history`: the historian's answers and records (HistorianSide below, or a test's)."""

    # Flows run side by side (run_batches), of one tier or several: the guard's look at Slurm
    # and the drain it allows are one step in the process, so two fails at once cannot both
    # pass a guard that had room for one.
    _drain_lock = threading.Lock()

    def __init__(self, slurm, history, *, command: list[str], tier: str, timeout_s: float,
                 enabled: bool | Callable[[str], bool] = True, poll_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 strikes: int = STRIKES, guard: Callable[[str], str | None] | None = None):
        """`strikes`: production drains since the last pass (within the historian's window)
        that send a node to repair instead; `guard(node)`: why the mass-drain guard holds a
        qualification fail's drain back now (a broken tool or a bad baseline failing the
        fleet), or None to let it go (rsc_health.actions.guard_states: the drains' own)."""
        self.slurm, self.history = slurm, history
        self.command, self.tier, self.timeout_s = command, tier, timeout_s
        self.enabled, self.poll_s, self.clock = enabled, poll_s, clock
        self.strikes, self.guard = strikes, guard

    def writes(self, node: str) -> bool:
        """Whether the flow may change this node in Slurm: `enabled`, a bool for the site or
        (Config.actions_enabled) a node's own `[nodes."GLOB".actions] enabled`."""
        return bool(self.enabled(node) if callable(self.enabled) else self.enabled)

    def repair(self, node: str, info, strikes: int) -> FlowResult:
        """Three strikes: drain with a repair reason (ours already, so no capacity is lost
        and no guard applies) and open a ticket; never qualification."""
        why = (f"{strikes} production failures since its last qualification pass: repair, "
               "not qualification")
        if not self.writes(node):
            return FlowResult(node, "refused", f"shadow mode: would send to repair ({why})")
        # Read again: the caller's listing is older than the strikes it counted since, and a
        # person's drain set meanwhile (or a `healthctl drain` the caller read) is theirs.
        info = self.slurm.node(node)
        theirs = _kept_or_down(info)
        if theirs:
            return FlowResult(node, "refused", f"{theirs}; not sent to repair ({why})")
        lemon = _lemon_drain(info)
        if lemon:
            # A repair drain already, with the lemon verdict's own ticket: its reason is the
            # finding an operator reads, and what `healthctl lemons` completes and keeps.
            return FlowResult(node, "refused", f"{lemon}; not sent to repair again ({why})")
        parsed = _parsed(info.reason)
        if parsed is None or parsed["code"] != STRIKES_CODE:
            reason = qualify_reason(STRIKES_CODE, f"{strikes} failures after a pass: repair",
                                    out_of_service_since(info))
            self.slurm.drain(node, reason)
            self.history.action(node, ActionKind.QUALIFY_DRAIN, reason)
        self.history.repair_ticket(node, why)
        return FlowResult(node, "refused", why, actions=("drained for repair", "ticket"))

    def stuck(self, node: str, info, runs: int, why: str) -> FlowResult:
        """A drained node in the retry loop whose last `runs` runs all proved nothing for the
        same reason `why` (stuck_candidates): open a repair ticket and say so in its drain
        reason (still an inconclusive re-drain: out of service already, so neither capacity
        nor the mass-drain guard's budget is touched); auto_candidates retries it no more
        until a ticket of it closes. Never a fail and never a drain of a node in service: a
        tool or config broken fleet-wide must not take the fleet out."""
        said = f"{runs} inconclusive runs in a row, each: {why}"
        if not self.writes(node):
            return FlowResult(node, "refused", f"shadow mode: would open a repair ticket ({said})")
        info = self.slurm.node(node)  # read again, as repair() does
        theirs = _kept_or_down(info)
        if theirs:
            return FlowResult(node, "refused", f"{theirs}; no ticket opened ({said})")
        # Slurm first: a controller gone here leaves no ticket, so the next `qualify auto`
        # does both (a ticket first would stop it before the reason ever said so).
        reason = qualify_reason("inconclusive", f"repair ticket open after {said}",
                                out_of_service_since(info))
        self.slurm.drain(node, reason)
        self.history.action(node, ActionKind.QUALIFY_DRAIN, reason)
        done = ["drain reason says so"]
        self.history.repair_ticket(node, f"qualification proves nothing: {said}")
        done.append("ticket")
        return FlowResult(node, "refused", f"repair, not another run: {said}",
                          actions=tuple(done))

    def run(self, node: str, *, suspect: bool = False) -> FlowResult:
        """`suspect`: the node is qualified as it is, undrained (an open suspect episode, or
        a driver/firmware change); a run that proves nothing leaves it as it came, never
        drained (only a failed run drains it)."""
        info = self.slurm.node(node)
        strikes = self.history.strikes(node)
        why = refusal(info, strikes, suspect, self.strikes)
        if why:
            if strikes >= self.strikes and info.drain_set \
                    and info.reason.startswith(REASON_PREFIX) and not info.down \
                    and not info.in_hand:
                return self.repair(node, info, strikes)
            return FlowResult(node, "refused", why)
        held = self._held_by_others(node)
        if held:
            return FlowResult(node, "refused", held)
        if not self.writes(node):
            return FlowResult(node, "would_qualify",
                              f"shadow mode: would reserve, resume and run the {self.tier} tier")
        res = reservation_name(node)
        done: list[str] = []
        self.slurm.create_reservation(res, node)
        done.append("reserved")
        # MAINT,IGNORE_JOBS lets ours overlap any reservation: one a person made between the
        # look above and ours is seen only now. The same read gives our reservation's start,
        # which the flow's start names (flow_deadline).
        current = self.slurm.reservations()
        reserved = (current.get(res) or ("", None))[1]
        held = self._held_by_others(node, current)
        if held:
            try:
                self.slurm.delete_reservation(res)
                done.append("reservation removed")
            except SlurmError:
                pass  # `qualify cleanup` removes it
            return FlowResult(node, "refused", held, actions=tuple(done))
        # Read again now that no ordinary job can start there: a person's drain or a DOWN set
        # since the first read (the strikes query, the reservation took time) is theirs, and
        # the resume below would lift it.
        fresh = self.slurm.node(node)
        if (fresh.reason, fresh.drain_set, fresh.down) != (info.reason, info.drain_set,
                                                          info.down):
            try:
                self.slurm.delete_reservation(res)
                done.append("reservation removed")
            except SlurmError:
                pass  # `qualify cleanup` removes it (and keeps a person's drain)
            return FlowResult(node, "refused", f"changed since it was read: now {fresh.state} "
                              f"{fresh.reason[:60]!r}; not qualified", actions=tuple(done))
        job_id = None
        submitted: datetime | None = None
        verdict, detail = INCONCLUSIVE, "the flow stopped before a result"
        undrained = suspect and not info.drain_set
        since = None if undrained else out_of_service_since(info)
        # Whether the node is out of its drain in the reservation: from then on a drain of
        # the node path's or a lemon's is a finding of this run (_found_drain).
        lifted = undrained
        try:
            if not undrained:
                # UNDRAIN, not RESUME: a DOWN a person (or slurmctld) set since the read just
                # above stays, with its reason (refusal() and that read saw none)
                self.slurm.undrain(node)
                lifted = True
                done.append("resumed into the reservation")
            self._started(node, res, reserved=reserved)
            submitted = self.history.now()  # the clock the job's run is stamped by
            job_id = self.slurm.submit(
                [f"--reservation={res}", f"--nodelist={node}", "--nodes=1", "--exclusive",
                 f"--job-name=rsc_health_qualify_{self.tier}", f"--time={_minutes(self.timeout_s)}",
                 # Never a second attempt under the same job id (JobRequeue=1 requeues a job
                 # whose node failed into the reservation that still stands): its pass would
                 # be taken for the job's, and the node that died under the stress released.
                 "--no-requeue", "--output=/dev/null", "--error=/dev/null"],
                [*self.command, "qualify", "run", "--tier", self.tier, "--node", node])
            done.append(f"job {job_id}")
            verdict, detail = self._wait(node, job_id, submitted)
        except SlurmError as exc:
            detail = f"Slurm: {str(exc)[:200]}"
        finally:
            more, verdict, detail = self._finish(node, res, verdict, detail, job_id,
                                                 keep=undrained, out_since=since,
                                                 lifted=lifted, submitted=submitted)
            done += more
        return FlowResult(node, verdict, detail, job_id, tuple(done))

    def _started(self, node: str, res: str, now: datetime | None = None, *,
                 reserved: datetime | None = None) -> None:
        """The flow's start, and until when it may hold the node (its timeout from now, and
        the finish after): `qualify cleanup` leaves its reservation alone until then, however
        long a person's `qualify start --timeout` is (flow_deadline). `reserved`: the
        reservation's start as Slurm lists it, said so that the flow of a later reservation
        of the same name, which said none, is not taken for this one."""
        until = (now or datetime.now(UTC)) + timedelta(seconds=self.timeout_s + FINISH_SLACK_S)
        began = "" if reserved is None else f"{RESERVED_WORDS}{_stamp(reserved)}"
        self.history.action(node, ActionKind.QUALIFY_START,
                            f"{self.tier} tier in {res}{began}{UNTIL_WORDS}"
                            f"{until:{UNTIL_FORMAT}}")

    def _held_by_others(self, node: str, reservations: dict | None = None) -> str | None:
        """Why a reservation not ours keeps qualification off the node, or None: one active,
        or starting before this flow's job could end (its timeout, and the finish after).
        `reservations`: Slurm's, when just read."""
        if reservations is None:
            reservations = self.slurm.reservations()
        held = reserved_by_others(reservations,
                                  horizon_s=self.timeout_s + FINISH_SLACK_S).get(node)
        return f"{held}: a person's reservation, not qualification's to take" if held else None

    def _wait(self, node: str, job_id: str, submitted: datetime) -> tuple[str, str]:
        """The stored result of this job: one stored since its submission (Slurm reuses job
        ids: a fresh StateSaveLocation starts again at FirstJobId, MaxJobId wraps; an old
        pass under the same id is not this job's)."""
        deadline = self.clock() + self.timeout_s
        since = submitted - RESULT_CLOCK_SLACK
        while self.clock() < deadline:
            stored = self.history.result(node, job_id, since=since)
            if stored is not None:
                return self._unless_node_failed(job_id, stored)
            try:
                job = self.slurm.job(job_id)
            except SlurmError:
                job = None  # a controller restarting: ask again
            else:
                if job is None or job.state not in NOT_ENDED:
                    # Ended: its result is stored before it ends, or never.
                    stored = self.history.result(node, job_id, since=since)
                    if job is not None and job.state in NODE_ENDS:
                        return _node_fail(job_id, stored, job.state)
                    if stored is not None:
                        return stored
                    state = job.state if job else "gone"
                    return INCONCLUSIVE, f"job {job_id} ended ({state}) with no stored result"
            time.sleep(self.poll_s)
        try:
            self.slurm.cancel(job_id)
        except SlurmError:
            pass
        return INCONCLUSIVE, f"no result within {self.timeout_s:.0f} s (job {job_id} cancelled)"

    def _unless_node_failed(self, job_id: str, stored: tuple[str, str]) -> tuple[str, str]:
        """A stored result, unless its job ended NODE_FAIL: the node stopped answering Slurm
        while the job held it (a hang under the stress; the run's own process outlived
        slurmd and stored what it had). A fail stands as it is."""
        if stored[0] == FAIL:
            return stored
        try:
            job = self.slurm.job(job_id)
        except SlurmError:
            return stored  # no answer: the stored result, as before
        return _node_fail(job_id, stored, job.state) if job is not None \
            and job.state in NODE_ENDS else stored

    def _delete_when_free(self, res: str, job_id: str | None) -> None:
        """Slurm refuses to delete a reservation a job is still in ("in use"): the job has
        stored its result and is exiting, or completing. Wait for it (cancel it after a
        while), then delete."""
        from rsc_health.slurm.api import SlurmCommandError

        deadline = self.clock() + max(30.0, 15 * self.poll_s)
        cancelled = False
        while True:
            try:
                self.slurm.delete_reservation(res)
                return
            except SlurmCommandError as exc:
                if not _in_use(exc):
                    raise
                if self.clock() >= deadline:
                    if cancelled or job_id is None:
                        raise
                    self.slurm.cancel(job_id)
                    cancelled, deadline = True, self.clock() + max(30.0, 15 * self.poll_s)
            time.sleep(min(self.poll_s, 1.0))

    def _finish(self, node: str, res: str, verdict: str, detail: str,
                job_id: str | None, keep: bool = False,
                out_since: datetime | None = None,
                lifted: bool = False,
                submitted: datetime | None = None) -> tuple[list[str], str, str]:
        """Drain before the reservation goes, unless a pass is stored: the node is never out
        of the reservation and undrained without one. `keep`: an undrained suspect whose run
        proved nothing goes back as it came (still a suspect, kept from big jobs). Returns
        what was done and the verdict as it stands (a fail the guard held is inconclusive).
        `lifted`: the node was out of any drain in the reservation (the flow undrained it, or
        it came undrained), so a node-path or lemon drain on it now came during the run.
        A run judged a fail (a drain found, a NODE_FAIL; the guard may hold its drain back)
        whose job stored a pass: that pass is overruled, never to count as one (`healthctl
        resume` asks for a pass since the drain; strikes count from the last pass)."""
        judged = verdict
        with self._drain_lock:
            done, verdict, detail = self._judge_and_drain(node, verdict, detail, keep,
                                                          out_since, lifted)
            if FAIL in (judged, verdict) and job_id is not None and submitted is not None:
                if self.history.overrule(node, f"the flow's verdict: fail: {detail}",
                                         since=submitted - RESULT_CLOCK_SLACK, job_id=job_id):
                    done.append("its stored pass overruled")
        self._delete_when_free(res, job_id)
        done.append("reservation deleted")
        if verdict == PASS:
            self.history.action(node, ActionKind.QUALIFY_RELEASE,
                                f"{self.tier} pass, job {job_id}")
        return done, verdict, detail

    def _judge_and_drain(self, node: str, verdict: str, detail: str, keep: bool,
                         out_since: datetime | None = None,
                         lifted: bool = False) -> tuple[list[str], str, str]:
        done: list[str] = []
        found = _found_drain(self.slurm.node(node)) if lifted else None
        if found:
            # The node path (a fault the stress raised: an XID 79 drains now) or the lemon
            # verdict drained the node while qualification held it: a finding about the node,
            # whatever the run stored. Its drain stays as it is (a retry code over it would
            # have `qualify auto` run the node again and a flaky pass release it), and a
            # repair ticket; no guard: the drain is made, by its own rules.
            ran = f"; the run: {verdict}" + (f" ({detail[:120]})" if detail else "")
            verdict, detail = FAIL, f"drained during qualification: {found[:120]}{ran}"
            done.append(f"its drain kept ({found[:60]})")
            self.history.repair_ticket(node, detail)
            return done, verdict, detail
        held = self.guard(node) if verdict == FAIL and self.guard is not None else None
        if held:
            # A fleet failing at once is the tool's or the baseline's fault more often than
            # the nodes': no fail drain, no ticket; proved nothing, retried after a back-off.
            self.history.action(node, ActionKind.GUARD_TRIPPED, f"qualify fail held: {held}")
            done.append(f"fail held back ({held})")
            verdict, detail = INCONCLUSIVE, f"held by the {held}: {detail}"
        if keep and verdict == INCONCLUSIVE:
            done.append("left in service as it came (inconclusive: not drained)")
        elif verdict != PASS:
            code = ("guard_held" if held else "inconclusive") if verdict == INCONCLUSIVE \
                else _first_test(detail)
            # A node that came drained is taken out of service by none of these: the drain
            # says since when it is out, and the node path's guard counts a fail from then.
            reason = qualify_reason(code, detail, out_since)
            fresh = self.slurm.node(node)
            theirs = _kept_drain(fresh)
            if fresh.down and not theirs and fresh.reason and not is_ours(fresh.reason):
                # DOWN mid-flow (a person's, or Slurm's "Not responding" under the stress):
                # drained all the same, or Slurm's ReturnToService would bring a node that
                # proved nothing back; their words go first in ours
                reason = qualify_reason(code, f"DOWN by {fresh.reason_user or 'Slurm'}: "
                                        f"{fresh.reason[:48]}; {detail}", out_since)
            if theirs:  # drained by a person mid-flow: out of service already, and theirs
                done.append(f"not drained: {theirs}")
            else:
                self.slurm.drain(node, reason)  # raises: the reservation stays and holds it
                done.append(f"drained ({reason[:60]})")
                self.history.action(node, ActionKind.QUALIFY_DRAIN, reason)
            if verdict == FAIL:
                self.history.repair_ticket(node, reason)
        return done, verdict, detail


def run_batches(jobs: Iterable[tuple[str, Callable[[], FlowResult]]], parallel: int,
                on_done: Callable[[FlowResult], None] | None = None) -> list[FlowResult]:
    """Run flows side by side, at most `parallel` at once (each waits for its own node's job;
    one node's flow never waits for another's), results in the order given. `on_done` sees
    each result as it comes. A flow that raises (Slurm gone mid-flow) raises here once every
    other flow of the batch has run to its end (their reservations and drains settled); one
    after another (`parallel` 1), the flows after it do not start, as before."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    jobs = list(jobs)
    if parallel <= 1 or len(jobs) <= 1:
        out = []
        for _node, fn in jobs:
            r = fn()
            if on_done is not None:
                on_done(r)
            out.append(r)
        return out
    results: dict[int, FlowResult] = {}
    with ThreadPoolExecutor(max_workers=min(parallel, len(jobs)),
                            thread_name_prefix="rsc_health_qualify") as pool:
        futures = {pool.submit(fn): i for i, (_node, fn) in enumerate(jobs)}
        for fut in as_completed(futures):
            r = fut.result()
            results[futures[fut]] = r
            if on_done is not None:
                on_done(r)
    return [results[i] for i in range(len(jobs))]


def _in_use(exc: SlurmError) -> bool:
    return "in use" in str(getattr(exc, "stderr", "") or exc)


def cleanup(slurm, history, *, older_than_s: float = 0.0,
            own_deadlines: bool = False) -> list[FlowResult]:
    """Reservations a flow left behind: drain their node (inconclusive: never back without a
    pass) and remove them. One younger than `older_than_s` may be a flow still running (a
    person's `qualify start`): left alone. `own_deadlines`: so is one whose flow said at its
    start that it holds the node until later than now (history.flow_deadline: its own
    timeout, a person's `--timeout` longer than the cut-off included). Slurm refusing one
    reservation (a job still pends
    in it: "in use"; its node gone from slurm.conf) is said as refused, its node drained where
    Slurm let it be, and the others are cleaned all the same (this runs before every `qualify
    auto`: one stuck reservation must not stop the fleet's qualification); only a controller
    that does not answer stops the pass."""
    from rsc_health.slurm.api import SlurmCommandError

    out = []
    now = datetime.now(UTC)
    for name, (nodes, started) in slurm.reservations().items():
        if not name.startswith(RESERVATION_PREFIX):
            continue
        if started is not None and (now - started).total_seconds() < older_than_s:
            continue
        node = name[len(RESERVATION_PREFIX):]
        if own_deadlines and started is not None:
            until = history.flow_deadline(node, started)
            if until is not None and until > now:
                continue  # its flow is still within its own timeout
        if nodes and nodes != node:
            out.append(FlowResult(node, "refused", f"{name} holds {nodes!r}, not {node}"))
            continue
        done: list[str] = []
        try:
            out.append(_clean_one(slurm, history, name, node, done, started))
        except SlurmCommandError as exc:
            out.append(FlowResult(node, "refused", f"{name} left: Slurm refused: "
                                  f"{str(exc)[-200:]}", actions=tuple(done)))
    return out


def _clean_one(slurm, history, name: str, node: str, done: list[str],
               started: datetime | None = None) -> FlowResult:
    info = slurm.node(node)
    reason = qualify_reason("interrupted", "qualification cut short; qualify again",
                            out_of_service_since(info))
    theirs = _kept_drain(info)
    if theirs:
        slurm.delete_reservation(name)
        return FlowResult(node, INCONCLUSIVE, f"left by an interrupted flow: {theirs}",
                          actions=("reservation deleted",))
    found = _found_drain(info)
    if found:
        # The node path's or a lemon's drain: kept, never written over with `interrupted`
        # (a retry code). Set since the reservation began, it is a finding of the flow that
        # was cut short: the repair ticket the flow did not live to open.
        new = _cut_flows_finding(history, node, info, started, "drained during qualification",
                                 found)
        slurm.delete_reservation(name)
        return FlowResult(node, FAIL if new else INCONCLUSIVE,
                          f"left by an interrupted flow: its drain kept ({found[:60]!r})",
                          actions=(("ticket",) if new else ()) + ("reservation deleted",))
    parsed = _parsed(info.reason) if info.drain_set else None
    if parsed is not None and parsed["mode"] == QUALIFY_MODE \
            and parsed["code"] not in (*RETRY_CODES, STRIKES_CODE):
        # A failed test's drain (the flow's verdict whose answer Slurm lost, or one from
        # before): a repair, never written over with a retry code that `qualify auto` would
        # run again until a flaky pass put the node back. This flow's own (stamped since the
        # reservation began) gets the repair ticket the flow did not live to open.
        ours = _cut_flows_finding(history, node, info, started, "qualification failed",
                                  info.reason)
        slurm.delete_reservation(name)
        return FlowResult(node, FAIL, f"left by an interrupted flow: its fail drain kept "
                          f"({info.reason[:60]!r})",
                          actions=(("ticket",) if ours else ()) + ("reservation deleted",))
    if parsed is not None and parsed["mode"] == QUALIFY_MODE and parsed["code"] == "interrupted":
        # Drained by an earlier cleanup whose delete Slurm refused: once is enough (a drain
        # again would renew its reason time, and the mass-drain guard would count it as new).
        done.append("drained already")
    else:
        slurm.drain(node, reason)
        history.action(node, ActionKind.QUALIFY_DRAIN, reason)
        done.append("drained")
    slurm.delete_reservation(name)
    return FlowResult(node, INCONCLUSIVE, "left by an interrupted flow: drained",
                      actions=("drained", "reservation deleted"))


def _cut_flows_finding(history, node: str, info, started: datetime | None, what: str,
                       reason: str) -> bool:
    """Whether the node's drain was set since the reservation began (`started`): then it is a
    finding of the flow that was cut short, which gets the repair ticket that flow did not
    live to open, and a pass its job stored (after that drain, as like as not) is overruled,
    as the flow would have."""
    if started is None or info.reason_time is None or info.reason_time < started:
        return False
    history.repair_ticket(node, f"{what}: {reason[:200]}")
    history.overrule(node, f"the run's verdict (qualify cleanup): fail: {what}: {reason}",
                     since=started)
    return True


def _persons_drain(info) -> str | None:
    """Why a drain must not be written over this node's: a person (or anyone but rsc-health)
    drained it, so it is out of service already and its reason is theirs."""
    if info.drain_set and not info.reason.startswith(REASON_PREFIX):
        return f"drained by someone else ({info.reason[:60]!r}): a person's drain stays theirs"
    return None


def _found_drain(info) -> str | None:
    """The reason of a drain the node path (drain now, after the job) or the lemon verdict
    set: a finding about the node, never to be replaced with a qualification retry code."""
    from rsc_health.policy import LEMON_MODE, MODE_FOR_LEVEL

    parsed = _parsed(info.reason) if info.drain_set else None
    if parsed is not None and parsed["mode"] in (*MODE_FOR_LEVEL.values(), LEMON_MODE):
        return info.reason
    return None


def _lemon_drain(info) -> str | None:
    """Why a drain is the lemon verdict's (`healthctl lemons --apply`: a repair drain with a
    ticket of its own), never to be written over with three strikes: its reason is the
    finding."""
    from rsc_health.policy import LEMON_MODE

    if info.drain_set and (_parsed(info.reason) or {}).get("mode") == LEMON_MODE:
        return f"drained by the lemon verdict ({info.reason[:60]!r}): a repair drain already"
    return None


def _kept_or_down(info) -> str | None:
    """_kept_drain, or a DOWN (Slurm's or a person's): a node read again before a repair
    drain or ticket that is not ours to write over."""
    return _kept_drain(info) or ("DOWN: Slurm's or a person's" if info.down else None)


def _kept_drain(info) -> str | None:
    """Why a drain that came while a flow held the node must not be written over: a person's
    own, or a person's `healthctl drain` under our prefix (a drain of the qualify mode would
    be retried by `qualify auto`, and a pass would put the node back in service past it)."""
    from rsc_health.policy import MANUAL_MODE

    theirs = _persons_drain(info)
    if theirs is None and info.drain_set and (_parsed(info.reason) or {}).get(
            "mode") == MANUAL_MODE:
        return f"drained with healthctl drain ({info.reason[:60]!r}): a person's drain stays theirs"
    return theirs


def reserved_by_others(reservations: dict, *, horizon_s: float,
                       now: datetime | None = None) -> dict[str, str]:
    """{node: what holds it} for every node in a reservation not a qualification flow's
    (rsc_health_qualify_*) that is active or starts within `horizon_s`: a person's maintenance,
    a customer's or a debug session's. Slurm 22.05 shows such a node IDLE, and our
    MAINT,IGNORE_JOBS reservation would be accepted over it. `reservations`: the Slurm
    backend's {name: (Nodes= hostlist, start, aware UTC or None)}."""
    from rsc_health.hostlist import HostlistError, expand

    now = now or datetime.now(UTC)
    until = now + timedelta(seconds=horizon_s)
    out: dict[str, str] = {}
    for name, (nodelist, start) in sorted(reservations.items()):
        if name.startswith(RESERVATION_PREFIX) or (start is not None and start > until):
            continue
        text = (nodelist or "").strip()
        if text in ("", "(null)"):
            continue
        try:
            names = expand(text)
        except HostlistError:
            names = [t for t in text.split(",") if t]
        when = "active" if start is None or start <= now else f"starts {start:%Y-%m-%d %H:%M}Z"
        for n in names:
            out.setdefault(n, f"in reservation {name} ({when})")
    return out


def auto_candidates(nodes, history, now: datetime, *, retry_min: float, retry_max_min: float,
                    limit: int, stuck_after: int = 0,
                    reserved: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Nodes to qualify without a person asking, with why, at most `limit`:
    - drained by rsc-health (any mode but a person's `healthctl drain`) and a repair ticket of
      the node closed after the drain: repaired, so prove it;
    - drained by qualification because it proved nothing: again once a back-off has passed
      (retry_min doubling per inconclusive run in a row, at most retry_max_min), or at once
      when a repair ticket of it closed after its last run; with `stuck_after`, not one whose
      last `stuck_after` runs proved nothing for the same reason (stuck_candidates: a ticket,
      and no more runs until a ticket of it closes).
    A person's drain, DOWN, a reboot Slurm holds and a node in `reserved` (reserved_by_others:
    a reservation not ours) are never candidates."""
    from datetime import timedelta

    from rsc_health.policy import MANUAL_MODE, parse_reason

    out = []
    for info in nodes:
        if len(out) >= limit:
            break
        parsed = parse_reason(info.reason) if info.drain_set else None
        if parsed is None or info.down or info.in_hand or parsed["mode"] == MANUAL_MODE \
                or info.name in (reserved or {}):
            continue
        drained_at = info.reason_time.astimezone(UTC).replace(tzinfo=None) \
            if info.reason_time else None
        if parsed["mode"] == QUALIFY_MODE and parsed["code"] in RETRY_CODES:
            streak, last = history.inconclusive_streak(info.name)
            if stuck_after > 0 and history.inconclusive_reason_streak(info.name)[0] \
                    >= stuck_after:
                continue  # a repair's, not another run's (Flow.stuck)
            closed = history.ticket_closed_after(info.name, last) if last is not None else None
            if closed is not None:
                out.append((info.name, f"repair ticket closed {closed:%Y-%m-%d %H:%M}"))
                continue
            wait = min(retry_min * 2 ** max(0, streak - 1), retry_max_min)
            if last is None or now - last >= timedelta(minutes=wait):
                out.append((info.name, f"retry after {streak} inconclusive run(s)"))
            continue
        closed = history.ticket_closed_after(info.name, drained_at)
        if closed is not None:
            out.append((info.name, f"repair ticket closed {closed:%Y-%m-%d %H:%M}"))
    return out


def stuck_candidates(nodes, history, *, after: int) -> list[tuple[str, int, str]]:
    """Drained nodes in qualification's retry loop (our qualify drain of a retry code) whose
    last `after` or more runs, since a ticket of the node last closed, all proved nothing for
    the same reason, with no ticket of the node open: (node, runs, reason) for Flow.stuck.
    0: never. Runs the flow never got a result from (a job killed, a controller gone) are not
    stored and count for nothing: only what the node itself kept proving nothing about."""
    if after <= 0:
        return []
    out: list[tuple[str, int, str]] = []
    for info in nodes:
        parsed = _parsed(info.reason) if info.drain_set else None
        if parsed is None or info.down or info.in_hand or parsed["mode"] != QUALIFY_MODE \
                or parsed["code"] not in RETRY_CODES:
            continue
        runs, reason, ticket_open = history.inconclusive_reason_streak(info.name)
        if runs >= after and not ticket_open:
            out.append((info.name, runs, reason))
    return out


def suspect_candidates(nodes, episodes, history, now: datetime, *, retry_min: float,
                       retry_max_min: float, limit: int,
                       reserved: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Open suspect episodes to qualify (issue 24's suspect trigger), at most `limit`: the
    node idle (no job to wait for), neither drained, DOWN nor held for a reboot, in no
    reservation not ours (`reserved`: reserved_by_others; Slurm shows such a node IDLE), and
    not qualified inconclusively within the back-off.

    Never an episode the tier's guard held ([suspects] max_share of a partition): evidence may
    be a job's own step files (untrusted: enough for a suspect, never a drain), and what it
    costs in idle nodes taken into reservations stays within the guard's bound. A held episode
    waits its turn: the tier applies the next in line when one ends, and then it is due."""
    from rsc_health.historian.failslow.evidence import STEPS
    from rsc_health.model import TIER_HELD

    info = {n.name: n for n in nodes}
    out: list[tuple[str, str]] = []
    # The node's own telemetry before a job's step files (whose deviation is what the job
    # wrote), as the tier's guard orders them; then the strongest evidence.
    for ep in sorted(episodes, key=lambda e: (e.source == STEPS, -(e.deviation or 0.0),
                                              e.node)):
        if len(out) >= limit:
            break
        if ep.tier == TIER_HELD:
            continue
        n = info.get(ep.node)
        if n is None or n.drain_set or n.down or n.in_hand or n.flags != {"IDLE"} \
                or ep.node in (reserved or {}):
            continue
        if _backing_off(history, ep.node, ep.since, now, retry_min, retry_max_min):
            continue
        out.append((ep.node, f"suspect since {ep.since:%Y-%m-%d %H:%M}: {ep.metric}"))
    return out


def driver_candidates(nodes, changed, history, now: datetime, *, retry_min: float,
                      retry_max_min: float, limit: int,
                      reserved: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Nodes whose driver or GPU firmware changed since their last qualification pass
    ([qualify] on_driver_change), at most `limit`, oldest change first. `changed`: {node:
    (since, previous, versions)} (rsc_health.historian.versions.changes). Like a suspect, the
    node is taken undrained and only when idle (no job to wait for), never drained, DOWN, held
    for a reboot or in a reservation (`reserved`: reserved_by_others), and not again within
    the back-off of an inconclusive run after the change."""

    info = {n.name: n for n in nodes}
    out: list[tuple[str, str]] = []
    for node, (since, previous, current) in sorted(changed.items(), key=lambda kv: kv[1][0]):
        if len(out) >= limit:
            break
        n = info.get(node)
        if n is None or n.drain_set or n.down or n.in_hand or n.flags != {"IDLE"} \
                or node in (reserved or {}):
            continue
        if history.passed_since(node, since):
            continue
        if _backing_off(history, node, since, now, retry_min, retry_max_min):
            continue
        out.append((node, f"driver/firmware changed {since:%Y-%m-%d %H:%M}: "
                          f"{previous[:120]} -> {current[:120]}"))
    return out


def _backing_off(history, node: str, since: datetime, now: datetime, retry_min: float,
                 retry_max_min: float) -> bool:
    """Whether an undrained node (a suspect, a driver change) waits: a run since `since` left
    it due (it proved nothing, or failed with its drain held back by the guard: both leave the
    node in service as it came), so it waits retry_min doubling per inconclusive run in a row
    (at most retry_max_min) from that run's end, not the next `qualify auto`."""
    streak, last = history.inconclusive_streak(node)
    if last is None or last <= since:
        return False
    wait = min(retry_min * 2 ** max(0, streak - 1), retry_max_min)
    return now - last < timedelta(minutes=wait)


def strike_candidates(nodes, history, *, strikes: int, limit: int) -> list[tuple[str, int]]:
    """Nodes rsc-health drained (not a person's, not DOWN or held for a reboot, not already a
    repair drain of three strikes or of the lemon verdict) that failed in production `strikes`
    times since their last pass: they go to repair (Flow.repair), at most `limit`."""
    from rsc_health.policy import LEMON_MODE, MANUAL_MODE

    out: list[tuple[str, int]] = []
    for info in nodes:
        if len(out) >= limit:
            break
        parsed = _parsed(info.reason) if info.drain_set else None
        if parsed is None or info.down or info.in_hand \
                or parsed["mode"] in (MANUAL_MODE, LEMON_MODE) or parsed["code"] == STRIKES_CODE:
            continue
        n = history.strikes(info.name)
        if n >= strikes:
            out.append((info.name, n))
    return out


def mass_drain_guard(slurm, cfg, now: datetime | None = None) -> Callable[[str], str | None]:
    """The action layer's mass-drain guard (rsc_health.actions.guard_states, [actions]
    guard_max_share within guard_window_min, read from Slurm's own view of our drains) for a
    qualification fail's drain: why it is held now, or None. Asked when the fail is known, so
    the fails of this very run (drained already) count against the next ones."""
    from datetime import timedelta

    from rsc_health.actions import guard_states

    def held(node: str) -> str | None:
        fleet = slurm.nodes()
        me = next((n for n in fleet if n.name == node), None)
        if me is None:
            return None
        states = guard_states(fleet, sorted(me.partitions),
                              max_share=float(cfg.get("actions.guard_max_share")),
                              window=timedelta(minutes=float(cfg.get("actions.guard_window_min"))),
                              now=now or datetime.now(UTC), exclude=node,
                              fails_at_their_time=True)
        full = [g for g in states if g.tripped]
        if not full:
            return None
        g = full[0]
        return (f"mass-drain guard: {len(g.recent_ours)}/{g.total} nodes of partition "
                f"{g.partition} drained by rsc-health within the window")

    return held


def _parsed(reason: str | None) -> dict | None:
    from rsc_health.policy import parse_reason

    return parse_reason(reason)


# A qualification job that ended NODE_FAIL: the node stopped answering Slurm under the
# qualification's stress. A finding (a fail: drained with this code, a repair ticket), never a
# retry code: `qualify auto` takes the node back only once a ticket of it closes.
NODE_FAIL_CODE = "node_fail"


def _node_fail(job_id: str, stored: tuple[str, str] | None,
               state: str = "NODE_FAIL") -> tuple[str, str]:
    if stored is not None and stored[0] == FAIL:
        return stored
    said = f"; its run had stored {stored[0]}" if stored is not None else ""
    what = ("the node failed to boot or launch it" if state == "BOOT_FAIL"
            else "the node stopped answering Slurm")
    return FAIL, (f"{NODE_FAIL_CODE}: job {job_id} ended {state}: {what} during "
                  f"qualification{said}")


def _first_test(detail: str) -> str:
    return (detail.split(":", 1)[0] or "failed")[:24]


def _stamp(when: datetime) -> str:
    """A time as a flow's start says it: UTC, to the second."""
    return f"{when.astimezone(UTC):{UNTIL_FORMAT}}"


def _minutes(seconds: float) -> int:
    return max(1, int(seconds // 60) + 1)


class HistorianSide:
    """The flow's questions to the historian and its records there."""

    def __init__(self, engine, strikes_window_days: float = 0.0):
        """`strikes_window_days`: production drains older than this do not count as strikes
        (0: every drain since the last pass)."""
        self.engine = engine
        self.strikes_window_days = strikes_window_days

    def now(self) -> datetime:
        """The historian's clock, aware UTC: what a qualification run's times are stamped by
        (PostgreSQL's now(); on SQLite this host's), so a job's result is looked for from its
        submission by the same clock, whatever this host's own says."""
        from rsc_health.historian.db import historian_now

        with self.engine.connect() as conn:
            return historian_now(conn).replace(tzinfo=UTC)

    def result(self, node: str, job_id: str, *,
               since: datetime | None = None) -> tuple[str, str] | None:
        """The newest run of `node` stored under `job_id` (ended at `since` or later)."""
        from sqlalchemy import select

        from rsc_health.historian.schema import qualify_runs as r

        q = select(r.c.verdict, r.c.reason).where(r.c.node == node, r.c.job_id == job_id)
        if since is not None:
            q = q.where(r.c.ended >= since.astimezone(UTC).replace(tzinfo=None))
        with self.engine.connect() as conn:
            row = conn.execute(q.order_by(r.c.ended.desc())).first()
        return (row.verdict, row.reason) if row else None

    def flow_deadline(self, node: str, started: datetime) -> datetime | None:
        """Until when the flow that made the node's reservation (begun at `started`, Slurm's
        clock) said it holds the node, aware UTC: the newest qualify_start of the node that is
        this reservation's: one naming its start, or one naming none written since it began
        (START_CLOCK_SLACK before: the flow host's clock). None when that flow said none
        (killed before its job was sent, refused after making the reservation, or a version
        that did not say): an earlier flow's start, whose reservation of the same name was
        deleted since, is never taken for it, however long that flow's `--timeout`."""
        from sqlalchemy import select

        from rsc_health.historian.schema import node_actions as a

        began = _stamp(started)
        floor = (started - RESULT_CLOCK_SLACK).astimezone(UTC).replace(tzinfo=None)
        since = (started - START_CLOCK_SLACK).astimezone(UTC).replace(tzinfo=None)
        named = f" in {reservation_name(node)}"
        with self.engine.connect() as conn:
            rows = conn.execute(select(a.c.time, a.c.reason).where(
                a.c.node == node, a.c.action == ActionKind.QUALIFY_START.value,
                a.c.time >= floor).order_by(a.c.time.desc()).limit(64)).all()
        for written, reason in rows:
            said, _, until = (reason or "").partition(UNTIL_WORDS)
            if named not in said:
                continue
            if RESERVED_WORDS in said.split(named, 1)[1]:
                if said.rsplit(RESERVED_WORDS, 1)[1].strip() != began:
                    continue  # another reservation's flow
            elif written < since:
                continue  # before this reservation: an earlier flow's
            if not until:
                return None
            try:
                return datetime.strptime(until.strip(), UNTIL_FORMAT).replace(tzinfo=UTC)
            except ValueError:
                return None
        return None

    def overrule(self, node: str, why: str, *, since: datetime,
                 job_id: str | None = None) -> int:
        """Mark the node's stored passes (of `job_id`, or any) that ended at `since` or later
        a fail, `why` first in their reason: a run the flow judged a fail (the node path or
        the lemon verdict drained the node under it, its job ended NODE_FAIL) never counts as
        a pass (resume's pass since the drain, strikes since the last pass, a suspect
        cleared). The per-test results stay as measured. How many were overruled."""
        from sqlalchemy import literal, update

        from rsc_health.historian.db import writer
        from rsc_health.historian.schema import qualify_runs as r

        said = f"overruled: {why}"[:900] + "; stored: "
        q = update(r).where(r.c.node == node, r.c.verdict == PASS,
                            r.c.ended >= since.astimezone(UTC).replace(tzinfo=None))
        if job_id is not None:
            q = q.where(r.c.job_id == job_id)
        with writer(self.engine).begin() as conn:
            return conn.execute(q.values(verdict=FAIL,
                                         reason=literal(said) + r.c.reason)).rowcount or 0

    def strikes(self, node: str) -> int:
        """Drains of the node by rsc-health's own checks in production since its last pass,
        within the window, and since a repair ticket of the node last closed (a repair
        starts the count again). A node that never passed has none."""
        from datetime import timedelta

        from sqlalchemy import func, select

        from rsc_health.historian.schema import node_actions as a
        from rsc_health.historian.schema import qualify_runs as r
        from rsc_health.historian.schema import tickets as t

        with self.engine.connect() as conn:
            last = conn.execute(select(func.max(r.c.ended)).where(
                r.c.node == node, r.c.verdict == PASS)).scalar()
            if last is None:
                return 0
            repaired = conn.execute(select(func.max(t.c.closed)).where(
                t.c.node == node)).scalar()
            if repaired is not None and repaired > last:
                last = repaired
            if self.strikes_window_days > 0:
                floor = datetime.now(UTC).replace(tzinfo=None) - timedelta(
                    days=self.strikes_window_days)
                last = max(last, floor)
            return conn.execute(select(func.count()).select_from(a).where(
                a.c.node == node, a.c.time > last,
                a.c.action.in_([ActionKind.DRAIN_NOW.value, ActionKind.DRAIN_AFTER_JOB.value])
            )).scalar() or 0

    def action(self, node: str, kind: ActionKind, reason: str) -> None:
        from sqlalchemy import insert

        from rsc_health.historian.db import writer
        from rsc_health.historian.schema import node_actions

        now = datetime.now(UTC).replace(tzinfo=None)
        aid = hashlib.sha256(f"{node}|{kind}|{reason}|{now.isoformat()}".encode()).hexdigest()
        with writer(self.engine).begin() as conn:
            conn.execute(insert(node_actions).values(id=aid[:32], time=now, node=node,
                                                     action=kind.value, reason=reason[:1000]))

    def inconclusive_streak(self, node: str) -> tuple[int, datetime | None]:
        """Inconclusive runs in a row, newest first, and when the newest ended."""
        from sqlalchemy import select

        from rsc_health.historian.schema import qualify_runs as r

        with self.engine.connect() as conn:
            rows = conn.execute(select(r.c.verdict, r.c.ended).where(r.c.node == node)
                                .order_by(r.c.ended.desc()).limit(16)).all()
        streak = 0
        for verdict, _ended in rows:
            if verdict != INCONCLUSIVE:
                break
            streak += 1
        return streak, rows[0].ended if rows else None

    def inconclusive_reason_streak(self, node: str) -> tuple[int, str, bool]:
        """Inconclusive runs in a row, newest first, that give the newest one's reason,
        counted since a ticket of the node last closed (a repair starts the count again);
        that reason; and whether a ticket of the node is open."""
        from sqlalchemy import func, select

        from rsc_health.historian.schema import qualify_runs as r
        from rsc_health.historian.schema import tickets as t

        with self.engine.connect() as conn:
            closed = conn.execute(select(func.max(t.c.closed)).where(t.c.node == node)).scalar()
            ticket_open = conn.execute(select(t.c.id).where(
                t.c.node == node, t.c.closed.is_(None)).limit(1)).first() is not None
            q = select(r.c.verdict, r.c.reason).where(r.c.node == node)
            if closed is not None:
                q = q.where(r.c.ended > closed)
            rows = conn.execute(q.order_by(r.c.ended.desc()).limit(64)).all()
        runs, first = 0, None
        for verdict, reason in rows:
            if verdict != INCONCLUSIVE or (first is not None and reason != first):
                break
            first = reason
            runs += 1
        return runs, first or "", ticket_open

    def passed_since(self, node: str, since: datetime | None) -> bool:
        """A stored qualification pass of the node that ended after `since` (naive UTC, or
        aware: made naive UTC); any pass when `since` is None."""
        from sqlalchemy import select

        from rsc_health.historian.schema import qualify_runs as r

        q = select(r.c.ended).where(r.c.node == node, r.c.verdict == PASS)
        if since is not None:
            if since.tzinfo is not None:
                since = since.astimezone(UTC).replace(tzinfo=None)
            q = q.where(r.c.ended > since)
        with self.engine.connect() as conn:
            return conn.execute(q.limit(1)).first() is not None

    def ticket_closed_after(self, node: str, since: datetime | None) -> datetime | None:
        from sqlalchemy import func, select

        from rsc_health.historian.schema import tickets

        if since is None:
            return None
        with self.engine.connect() as conn:
            return conn.execute(select(func.max(tickets.c.closed)).where(
                tickets.c.node == node, tickets.c.closed > since)).scalar()

    def repair_ticket(self, node: str, reason: str) -> None:
        from sqlalchemy import insert, select

        from rsc_health.historian.db import writer
        from rsc_health.historian.schema import tickets

        now = datetime.now(UTC).replace(tzinfo=None)
        with writer(self.engine).begin() as conn:
            open_one = conn.execute(select(tickets.c.id).where(
                tickets.c.node == node, tickets.c.closed.is_(None),
                tickets.c.source == "qualify")).first()
            if open_one is None:
                conn.execute(insert(tickets).values(node=node, opened=now, reason=reason,
                                                    source="qualify"))
