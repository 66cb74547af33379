"""Turn a node's verdict into Slurm actions: drain, requeue, resume, or refuse (the guard).

Rules (issue 3):
- DRAIN_NOW: drain with our reason, then requeue every job on the node so it restarts
  elsewhere with the same Job ID; a job that refuses requeue is reported (`requeue_refused`),
  once per job (also under a lemon's or a person's drain, retried after each back-off).
- DRAIN_AFTER_JOB: drain; the running job finishes and the node then leaves service.
- A node whose reason is not ours (a person's, or Slurm's own) is never touched; a drain verdict
  meeting it is reported held (`held_under_drain`) and the caller keeps it pending.
- Resume only a drain that was ours and auto-resumable, after N clean sweeps in a row. What we
  drained for is kept in node-local state, because the reason string alone is clipped.
- Mass-drain guard: once rsc-health drained `guard_max_share` of a partition within the window,
  refuse further drains. Read from Slurm (our prefix + reason time), so every node sees the same.
  Only automatic drains count: an operator's `healthctl drain` (manual) does not, nor a
  qualification's re-drain of a node already out of service (policy.QUALIFY_REDRAIN_CODES).

Every action is appended to the node's spool. Standard library only (the prolog imports this).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

from rsc_health import spool
from rsc_health.compat import aware_time
from rsc_health.config import Config
from rsc_health.durable import load_state_json, remove, write_atomic
from rsc_health.model import ActionKind, Level, Verdict, utcnow
from rsc_health.policy import (
    MANUAL_MODE,
    MODE_FOR_LEVEL,
    QUALIFY_MODE,
    QUALIFY_REDRAIN_CODES,
    format_reason,
    is_ours,
    parse_reason,
    qualify_out_since,
)
from rsc_health.record import asdict, dataclass, field, record_fields
from rsc_health.slurm.api import JobGone, NodeInfo, SlurmAPI, SlurmCommandError, SlurmError

DRAIN_STATE_FILE = "slurm_drain.json"
# Jobs said to refuse requeue while no drain of ours is on record (a verdict held under a
# lemon's or a person's `healthctl drain` still requeues, on every back-off retry): said once
# per job, the newest REFUSALS_KEPT kept.
REFUSALS_FILE = "requeue_refused.json"
REFUSALS_KEPT = 256


@dataclass
class Action:
    """One thing done (or refused) in Slurm; also the spool record's fields."""

    action: str  # an ActionKind
    node: str
    reason: str = ""
    job_id: str | None = None
    detail: str = ""


@dataclass
class DrainState:
    """What we drained this node for; survives across sweeps on the node's own disk."""

    reason: str
    codes: list[str]
    auto_resumable: bool
    time: str
    clean_sweeps: int = 0
    # Jobs already reported as refusing requeue under this drain: a sweep every five minutes
    # on a drained node would otherwise report (and spool) the same refusal again each time.
    refused_jobs: list[str] = field(default_factory=list)
    # False while the mass-drain guard's look after this drain is owed (Slurm did not answer
    # it): the next run with a drain verdict looks, and steps back if past the limit.
    settled: bool = True
    # A reboot someone asked Slurm for with nextstate=RESUME stands over this drain, one that
    # is never auto-resumed: Slurm lifts the drain when the node registers again (22.05: IDLE,
    # no reason). The clean sweep that then finds the node undrained drains it again.
    reboot_resumes: bool = False
    # Slurm's BootTime of the node (ISO, UTC) when a run last saw this drain, one never
    # auto-resumed, in place, and when the first run on that boot saw it (the node's clock,
    # ISO); "" when none did or a person's drain took it over. A drain gone with the node
    # booted after that sighting was lifted by the reboot (`scontrol reboot nextstate=RESUME`
    # with no run there to see it pending), or by a person before any run saw the node back:
    # drained again.
    boot: str = ""
    boot_seen: str = ""
    # The kernel's id of the boot that sighting was on (/proc/sys/kernel/random/boot_id; ""
    # when it could not be read). A run on another boot that finds the drain gone knows a
    # reboot came after the sighting without comparing clocks: a node clock ahead of
    # slurmctld's would put the sighting after a reboot that followed it within that skew.
    boot_id: str = ""


# What Slurm 22.05 adds to the node's reason when it issues a reboot (and leaves there after):
# "<our reason> : reboot issued".
_REBOOT_SUFFIX = " : reboot"
# A pending reboot's next state that lifts a drain when the node comes back.
_LIFTING = frozenset({"RESUME", "UNDRAIN"})
# slurmd registers its uptime in whole seconds, so the BootTime Slurm shows moves by a second
# or two when slurmd registers again without a reboot (a slurmd or slurmctld restart). A boot
# later than a run that saw our drain in place by more than this is a reboot after it (slurmd
# starts many seconds after the kernel, so no run sees a drain within this of a boot).
_BOOT_SLACK = timedelta(seconds=2)


def _boot_text(info: NodeInfo) -> str:
    return info.boot_time.isoformat() if info.boot_time is not None else ""


def _shows(record: str, reason: str) -> bool:
    """Whether the node's `reason` is our record's, as Slurm keeps it (stripped, and with its
    own " : reboot issued" after it once a reboot was issued over our drain)."""
    rec, shown = record.strip(), reason.strip()
    return shown == rec or (shown.startswith(rec + _REBOOT_SUFFIX) and is_ours(shown))


@dataclass
class GuardState:
    partition: str
    total: int
    recent_ours: list[str] = field(default_factory=list)
    limit: int = 0

    @property
    def tripped(self) -> bool:
        return len(self.recent_ours) >= self.limit


def guard_limit(total: int, max_share: float) -> int:
    """Drains allowed per window; at least one so a tiny partition can still drain a bad node."""
    return max(1, math.floor(total * max_share + 1e-9))


def drain_time(node: NodeInfo, *, own_time: bool = False) -> datetime | None:
    """When the drain `node` shows took it out of service, as the guard counts it: the reason
    time Slurm stamped, or, for a qualification fail of a node that came to it drained, when
    it left service (policy.qualify_out_since; never later than the reason time). `own_time`:
    the fail's own time (the qualification guard's count: a broken tool failing many)."""
    since = None if own_time else qualify_out_since(node.reason)
    if since is None or node.reason_time is None:
        return node.reason_time
    return min(since, node.reason_time)


def guard_states(
    nodes: list[NodeInfo], partitions: list[str], *, max_share: float, window: timedelta,
    now: datetime, exclude: str | None = None, fails_at_their_time: bool = False,
) -> list[GuardState]:
    """For each partition: nodes we drained within the window, read from Slurm's own state.
    `fails_at_their_time`: qualification fails count from their own drain (drain_time)."""
    out = []
    for part in partitions:
        members = [n for n in nodes if part in n.partitions]
        recent = [
            n.name
            for n in members
            if n.name != exclude
            and n.drain_set
            and automatic(n.reason)
            and _within(drain_time(n, own_time=fails_at_their_time), now, window)
        ]
        out.append(GuardState(part, len(members), recent, guard_limit(len(members), max_share)))
    return out


def shadow_guard_held(
    attempts: list[tuple[datetime, str, bool]], partitions: dict[str, list[str]], *,
    max_share: float, window: timedelta,
) -> set[int]:
    """The mass-drain guard's arithmetic over drains that were not made (shadow mode's
    would_drain, which never asks Slurm, so no node sees another's): which of `attempts`
    ((time, node, done): done = a drain that did happen, which counts and is never held) the
    live guard would have held, by index. Oldest first (then node name), per partition of
    `partitions` (node -> its partitions; a node in none is not guarded, as live): held once
    one of its partitions has guard_limit drains within `window`. A node counts once: its
    later attempts (another reason, a new interval) find it drained already, as live they
    would (never held, not counted again); a held one's later attempt is its retry."""
    totals: dict[str, int] = {}
    for parts in partitions.values():
        for p in parts:
            totals[p] = totals.get(p, 0) + 1
    granted: dict[str, list[datetime]] = {p: [] for p in totals}
    held: set[int] = set()
    drained: set[str] = set()
    for i in sorted(range(len(attempts)), key=lambda i: attempts[i][:2]):
        when, node, done = attempts[i]
        if node in drained:
            continue
        parts = partitions.get(node, [])
        if not done and any(
                sum(1 for t in granted[p] if when - t <= window)
                >= guard_limit(totals[p], max_share) for p in parts):
            held.add(i)
            continue
        drained.add(node)
        for p in parts:
            granted[p].append(when)
    return held


def _within(when: datetime | None, now: datetime, window: timedelta) -> bool:
    return when is not None and now - when <= window


def automatic(reason: str | None) -> bool:
    """A drain rsc-health made by itself (node path or lemons), the kind the mass-drain guard
    counts. An operator's `healthctl drain` carries our prefix too, but is a person's decision:
    a DIMM reseat must not use up the budget that holds back a broken node's automatic drain.
    Nor does a qualification's drain of a node that was out of service already
    (policy.QUALIFY_REDRAIN_CODES): its fresh reason time takes nothing out of service."""
    parsed = parse_reason(reason)
    if parsed is None or parsed["mode"] == MANUAL_MODE:
        return False
    return not (parsed["mode"] == QUALIFY_MODE and parsed["code"] in QUALIFY_REDRAIN_CODES)


class Actor:
    def __init__(
        self,
        slurm: SlurmAPI,
        cfg: Config,
        node: str,
        state_dir: str | os.PathLike,
        *,
        now: Callable[[], datetime] = utcnow,
        log: Callable[[str], None] | None = None,
        boot_id: Callable[[], str] = str,
        deadline: float | None = None,
    ):
        self.slurm = slurm
        # time.monotonic() by which the run must be done (the node path's budget): the
        # guard's second look waits no more than a quarter of what is left, so the requeue
        # and the records after it still fit.
        self.deadline = deadline
        self.cfg = cfg
        self.node = node
        self.state_dir = Path(state_dir)
        self.now = now
        # This boot's kernel id (collect.kmsg.boot_id), read when a sighting is noted or
        # judged; "" (the default) where it cannot be told.
        self.boot_id = boot_id
        # Messages carry no prefix: the node path's log adds "rsc_health: " (and syslogs).
        self.log = log or (lambda msg: print(f"rsc_health: {msg}", file=sys.stderr))
        self.enabled = bool(cfg.get("actions.enabled"))
        self.resume_after = int(cfg.get("actions.resume_after_clean_sweeps"))
        self.never_resume = set(cfg.get("actions.never_resume_codes"))
        self.max_share = float(cfg.get("actions.guard_max_share"))
        self.window = timedelta(minutes=float(cfg.get("actions.guard_window_min")))
        self.settle_s = float(cfg.get("actions.guard_settle_s"))
        self.sleep = time.sleep
        # The last apply() left our drain record saying less than its drain verdict found (a
        # write refused): the caller keeps the verdict pending, its events unconsumed if that
        # fails too, as for any verdict not yet carried out in full.
        self.unrecorded = False

    # ---- entry point -----------------------------------------------------------------------
    def apply(
        self,
        verdict: Verdict,
        *,
        requeue: bool = True,
        clean_sweep: bool = False,
        skip_jobs: set[str] | None = None,
    ) -> list[Action]:
        """Act on one verdict. requeue: a drain now requeues the node's jobs; clean_sweep=True
        when this verdict came from a periodic sweep, the only thing that counts towards
        auto-resume; skip_jobs are never requeued (the prolog's own job, which Slurm requeues
        when the prolog fails, and the epilog's, already ending). Raises SlurmError when Slurm
        is away."""
        self.unrecorded = False
        if verdict.drains:
            verdict = Verdict(verdict.level, self._led(verdict), verdict.causes,
                              verdict.auto_resumable)
        if not self.enabled:
            # Shadow mode ([actions] enabled = false): Slurm is never asked or changed; what
            # would have been drained is recorded, so a pilot next to NHC can be judged.
            if not verdict.drains:
                return []
            shadow = [Action(ActionKind.WOULD_DRAIN, self.node, verdict.reason,
                             detail=verdict.level.label)]
            self._spool(shadow)
            return shadow
        listing = None
        if verdict.drains and not self._state_path.exists():
            # A first drain: the guard reads the whole node table anyway, and this node's own
            # record is in it. One read, not two: on Slurm 22.05 `scontrol show node ONE`
            # costs slurmctld the whole table too (benchmarks/bench_guard_load.py), and in a
            # fleet-wide outage every node comes here.
            # A person's drain landing between this read and our `scontrol update` is
            # overwritten by ours: scontrol has no compare-and-set. A re-read of this one node
            # just before the drain would not narrow that: on the 22.05 test cluster 0.5 ms
            # pass from this read's end to the drain's start (a scontrol call: 13-40 ms), the
            # window a re-read would leave too, for one more table read
            # (benchmarks/bench_drain_read_gap.py).
            listing = self.slurm.nodes()
            mine = next((n for n in listing if n.name == self.node), None)
            info = mine if mine is not None else self.slurm.node(self.node)
        else:
            info = self.slurm.node(self.node)
        if verdict.drains:
            actions = self._drain(verdict, info, requeue=requeue, skip=skip_jobs or set(),
                                  listing=listing)
        elif clean_sweep and verdict.level in (Level.OK, Level.WARN):
            actions = self._clean(info)
        else:
            actions = self._lifted_by_reboot(info, requeue=requeue, skip=skip_jobs or set())
        self._spool(actions)
        return actions

    # ---- drain -----------------------------------------------------------------------------
    def _drain(
        self, verdict: Verdict, info: NodeInfo, *, requeue: bool, skip: set[str],
        listing: list[NodeInfo] | None = None,
    ) -> list[Action]:
        now_mode = verdict.level is Level.DRAIN_NOW
        kind = ActionKind.DRAIN_NOW if now_mode else ActionKind.DRAIN_AFTER_JOB
        if (info.drain_set or info.down) and not is_ours(info.reason):
            # A person's drain or DOWN ("bob: dead PSU, RMA 123"), or Slurm's own ("Not
            # responding", "Prolog error"), or NHC's: theirs to manage, never drained over nor
            # later resumed by us. The verdict is not theirs to drop: the caller keeps it
            # pending, and it is carried out once that drain is lifted (the XID behind it is
            # already consumed, so nothing else would ever drain the node for it).
            msg = (f"{self.node} is {info.state} for someone else ({info.reason!r}); "
                   f"verdict {verdict.reason} kept pending until that is lifted")
            self.log(msg)
            return [Action(ActionKind.HELD_UNDER_DRAIN, self.node, msg)]
        actions: list[Action] = []
        ours = parse_reason(info.reason) if info.drain_set else None
        if ours is not None and ours["mode"] not in MODE_FOR_LEVEL.values():
            # An operator's drain (healthctl drain) or a lemon drain: our prefix, but a
            # person's decision that only a person lifts (a DIMM reseat, a repair). As under a
            # person's own drain, the verdict waits for that; a drain-now still requeues.
            msg = (f"{self.node} is {info.state} by a person ({info.reason!r}); "
                   f"verdict {verdict.reason} kept pending until that is lifted")
            self.log(msg)
            actions.append(Action(ActionKind.HELD_UNDER_DRAIN, self.node, msg))
            if now_mode and requeue:
                self._requeue_jobs(verdict.reason, skip, actions)
            return actions
        # Only our own after-job drain is made a drain-now.
        escalate = ours is not None and ours["mode"] == "job" and now_mode
        node_path_drain = ours is not None
        if ours is None or escalate:
            # Our never-resumed drain lifted by a reboot, met by a new fault before the sweep
            # that would set it again: restored here, past the guard (it let it through once),
            # and what it was for carried into the new record.
            prior = self.load_state() if ours is None else None
            lifted = prior is not None and not info.drain_set and (
                prior.reboot_resumes or self._reboot_lifted(prior, info))
            if ours is None and not lifted:
                tripped = self._guard_tripped(info, listing)
                if tripped is not None:
                    return [tripped]
            self.slurm.drain(self.node, verdict.reason)
            drained = Action(kind, self.node, verdict.reason)
            over = (self._settled_over_the_limit(verdict, drained)
                    if ours is None and not lifted else None)
            if over is not None:
                return [over]
            # Not carried without a lift: a stale record of a drain lifted by a person.
            before = self.load_state() if escalate else prior if lifted else None
            self._save_state(verdict)
            if before is not None:
                # Escalated from our after-job drain: what that one was for still stands.
                self._note_verdict(verdict, before)
            actions.append(drained)
        elif node_path_drain and not self._state_path.exists():
            # Our drain, and no record of it: a drain call that timed out and that slurmctld
            # applied later, never looked at by the guard. Looked at now; then recorded once,
            # as Slurm holds it.
            over = self._over_the_limit(listing)
            if over is not None:
                return [over]
            actions.extend(self._adopt(verdict, info))
        else:
            # Already drained by us: keep it so, and restart the clean-sweep count; first the
            # guard's look after it, if Slurm did not answer that one.
            state = self.load_state()
            if state is not None and not state.settled:
                over = self._over_the_limit()
                if over is not None:
                    self._clear_state()
                    return [over]
                state.settled = True
                self._write_state(state)
            self._note_verdict(verdict)
        self._watch_reboot(info)
        if now_mode and requeue:
            self._requeue_jobs(verdict.reason, skip, actions)
        return actions

    def _watch_reboot(self, info: NodeInfo, state: DrainState | None = None, *,
                      ours: bool = True) -> None:
        """With our drain in place (`info`: the node as read before or after it landed): note
        in our record whether a reboot with nextstate=RESUME stands over it, when the drain is
        one never auto-resumed. A reboot done or cancelled with the drain still there ends
        the note."""
        state = state or self.load_state()
        if state is None:
            return
        lifting = (info.in_hand.startswith("REBOOT") and info.next_state in _LIFTING
                   and not self._resumable(state))
        # Noted while our drain is what the node shows; a person's drain over it (`ours`
        # False) makes the node theirs: a reboot under it and their resume are theirs too.
        # A BootTime within the slack of the one noted is the same boot (slurmd registered
        # again: nothing to write), and none shown (BootTime=None) tells nothing: the note
        # stays.
        boot = ""
        if ours and not self._resumable(state):
            noted = aware_time(state.boot)
            boot = state.boot if info.boot_time is None or (
                noted is not None and abs(info.boot_time - noted) <= _BOOT_SLACK) \
                else _boot_text(info)
        # A sighting on another kernel boot than the one noted is a new sighting too (the
        # node came back with our drain kept, before slurmd registered its new BootTime); an
        # id that cannot be read tells nothing, as BootTime=None.
        kernel = ""
        if boot:
            kernel = self._kernel_boot() or (state.boot_id if boot == state.boot else "")
        if (lifting, boot, kernel) != (state.reboot_resumes, state.boot, state.boot_id):
            state.reboot_resumes, state.boot, state.boot_id = lifting, boot, kernel
            state.boot_seen = self.now().isoformat() if boot else ""
            self._write_state(state)
            if lifting:
                self.log(f"{self.node}: a reboot with NextState={info.next_state} stands over "
                         f"our drain ({state.reason}); when Slurm lifts it, rsc_health drains "
                         "the node again")

    def _resumable(self, state: DrainState) -> bool:
        return state.auto_resumable and not self.never_resume & set(state.codes)

    def _lifted_by_reboot(self, info: NodeInfo, *, requeue: bool,
                          skip: set[str]) -> list[Action]:
        """A run that does not count towards a resume (a job start): our drain drained
        again if a reboot with nextstate=RESUME lifted it; nothing else."""
        state = self.load_state()
        if state is None or info.drain_set or info.down or not self._reboot_lifted(state, info):
            return []
        return self._drain_again(state, info, requeue=requeue, skip=skip)

    def _reboot_lifted(self, state: DrainState, info: NodeInfo) -> bool:
        """Our never-resumed drain, gone from `info`, was lifted by a reboot: one a run saw
        pending with nextstate=RESUME, or one no run saw (the node booted after the last run
        that saw our drain in place: on a site whose sweep runs from the timer alone, the node
        is back within one period). Slurm keeps a drain across a reboot unless it was asked to
        lift it; a person who resumes the node within minutes of a reboot, before any run
        saw it, is drained again, and their next resume stands."""
        noted = aware_time(state.boot)
        if state.reboot_resumes:
            # Seen pending; unless Slurm still shows the boot noted with it: then no reboot
            # came (cancelled), and the drain went by a person's resume. (Not the kernel's
            # boot id: the sweep slurmd runs as it starts sees the reboot still pending on
            # the new kernel, and the lift comes after it on the same one.)
            return (noted is None or info.boot_time is None
                    or info.boot_time > noted + _BOOT_SLACK)
        if info.boot_time is None or self._resumable(state):
            return False
        # Both: a boot later than the one noted (slurmctld's clock on both sides) and later
        # than the run that saw our drain on it (the node's clock, which may lag slurmctld's
        # by minutes: munge allows 5; alone it would take a repair reboot a run saw for an
        # unseen one). The second keeps a run that read the old BootTime after the reboot,
        # before slurmd registered, from counting that reboot as one after it.
        seen = aware_time(state.boot_seen)
        if noted is None or seen is None:
            return False
        # The node's own word first: the kernel boot the drain was last seen on is another
        # (a reboot since, whatever the clocks say) or this one (none since, whatever
        # BootTime says: a clock stepped). Unknown where either id is "".
        kernel = self._kernel_boot()
        if state.boot_id and kernel:
            return kernel != state.boot_id
        return info.boot_time > max(noted, seen) + _BOOT_SLACK

    def _kernel_boot(self) -> str:
        try:
            return str(self.boot_id() or "")
        except Exception:  # noqa: BLE001 - an unreadable boot id tells nothing
            return ""

    def _drain_again(self, state: DrainState, info: NodeInfo, *,
                     requeue: bool = True, skip: set[str] | None = None) -> list[Action]:
        """Our drain, never auto-resumed, lifted by Slurm when a reboot someone asked for
        with nextstate=RESUME completed: set again, with our reason, and jobs that started
        since requeued for a drain-now (never one in `skip`: the prolog's own job, which
        Slurm requeues when the prolog fails, helper-123). Not the guard's to weigh: it let
        this drain through once, and this restores it."""
        seen = state.reboot_resumes
        self.slurm.drain(self.node, state.reason)
        state.reboot_resumes, state.clean_sweeps = False, 0
        state.boot = _boot_text(info)
        state.time = state.boot_seen = self.now().isoformat()
        state.boot_id = self._kernel_boot()
        self._write_state(state)
        mode = (parse_reason(state.reason) or {}).get("mode")
        kind = ActionKind.DRAIN_NOW if mode == "now" else ActionKind.DRAIN_AFTER_JOB
        if seen:
            msg = (f"our drain ({', '.join(state.codes)}: never auto-resumed) was lifted by "
                   f"Slurm at the end of a reboot asked with NextState=RESUME; drained again")
        else:
            msg = (f"our drain ({', '.join(state.codes)}: never auto-resumed) was gone after "
                   f"the node rebooted (a reboot asked with NextState=RESUME, or a resume "
                   f"before any run saw the node back); drained again: a person's resume "
                   f"from here on stands")
        self.log(f"{self.node}: {msg}")
        actions = [Action(kind, self.node, state.reason, detail=msg)]
        if mode == "now" and requeue:
            self._requeue_jobs(state.reason, skip or set(), actions)
        return actions

    def _settled_over_the_limit(self, verdict: Verdict, drained: Action) -> Action | None:
        """After a fresh drain of ours: the guard's step back if this node is past the limit.
        Looked at twice: a node that drained a moment before the others sees too few at
        first. After guard_settle_s every racing drain has landed, and every node ranks the
        same final set the same way, so exactly those past the limit step back."""
        try:
            over = self._over_the_limit()
            wait = self.settle_s
            if self.deadline is not None:
                wait = min(wait, max(0.0, (self.deadline - time.monotonic()) / 4))
            if over is None and wait > 0:
                self.sleep(wait)
                over = self._over_the_limit()
        except SlurmError:
            # The drain landed and Slurm stopped answering before the guard's look: what is
            # true goes on record (our drain, resumable as any other, its look still owed),
            # and the caller still hears Slurm is away, so the verdict stays pending: the next
            # run looks (and steps back if past the limit), then requeues.
            self._save_state(verdict, settled=False)
            self._spool([drained])
            raise
        return over

    def _adopt(self, verdict: Verdict, info: NodeInfo) -> list[Action]:
        """Record our drain found in place with no record of it. Nothing is spooled unless
        the record was written, so a state dir that refuses writes does not repeat the action
        on every run."""
        if not self._save_state(verdict, info.reason):
            return []
        mode = (parse_reason(info.reason) or {}).get("mode")
        kind = ActionKind.DRAIN_NOW if mode == "now" else ActionKind.DRAIN_AFTER_JOB
        return [Action(kind, self.node, info.reason,
                       detail="our drain found in place with no record of it "
                              "(Slurm answered late)")]

    def _guard_tripped(self, info: NodeInfo, listing: list[NodeInfo] | None = None
                       ) -> Action | None:
        nodes = listing if listing is not None else self.slurm.nodes()
        mine = next((n for n in nodes if n.name == self.node), None)
        # This node's own record answers for its partitions when the listing lacks it (a
        # record refused as ambiguous, a listing cut short): no partition, no guard at all.
        parts = list((mine or info).partitions)
        for g in guard_states(nodes, parts, max_share=self.max_share, window=self.window,
                              now=self.now(), exclude=self.node):
            if g.tripped:
                msg = (f"mass-drain guard: {len(g.recent_ours)}/{g.total} nodes of partition "
                       f"{g.partition} drained by rsc_health in the last "
                       f"{self.window.total_seconds() / 60:g} min (limit {g.limit}); "
                       f"NOT draining {self.node}")
                self.log("!" * 78 + f"\nRSC_HEALTH GUARD TRIPPED: {msg}\n" + "!" * 78)
                return Action(ActionKind.GUARD_TRIPPED, self.node, msg)
        return None

    def _over_the_limit(self, listing: list[NodeInfo] | None = None) -> Action | None:
        """After our drain: did sweeps running at the same instant drain more of a partition
        than the guard allows? Every node ranks the recent drains the same way (a lemon's or a
        qualification's first, then reason time, then name); a node ranked past the limit
        undoes its own drain (still ours) and keeps its verdict pending. So the guard holds at
        its limit under simultaneous sweeps, counting what its first look counts. `listing`:
        the node table this run already read after the drain landed, if any."""
        nodes = listing if listing is not None else self.slurm.nodes()
        mine = next((n for n in nodes if n.name == self.node), None)
        if mine is None or not (mine.drain_set and is_ours(mine.reason)):
            return None
        now = self.now()
        stepping = set(MODE_FOR_LEVEL.values())
        for part in mine.partitions:
            members = [n for n in nodes if part in n.partitions]
            # The drains the first look counts (guard_states: every automatic one). A lemon's
            # or a qualification's never steps back, so it holds its place ahead of the
            # node-path drains, which are ranked after it (reason time, then name).
            recent = [n for n in members if n.drain_set and automatic(n.reason)
                      and _within(drain_time(n), now, self.window)]
            fixed = [n for n in recent
                     if (parse_reason(n.reason) or {}).get("mode") not in stepping]
            racing = sorted((n for n in recent if n not in fixed),
                            key=lambda n: (n.reason_time, n.name))
            limit = guard_limit(len(members), self.max_share)
            names = [n.name for n in racing]
            rank = len(fixed) + names.index(self.node) if self.node in names else -1
            if rank >= limit:
                self.slurm.undrain(self.node)
                msg = (f"mass-drain guard: {len(recent)}/{len(members)} nodes of partition "
                       f"{part} drained at once (limit {limit}); undid the drain of "
                       f"{self.node}, kept pending")
                self.log("!" * 78 + f"\nRSC_HEALTH GUARD TRIPPED: {msg}\n" + "!" * 78)
                return Action(ActionKind.GUARD_TRIPPED, self.node, msg)
        return None

    def _requeue_jobs(self, reason: str, skip: set[str], done: list[Action]) -> None:
        """Requeue every job on the node, appending to `done` (the drain's actions so far); a
        refusal is reported once per job and drain. Slurm's refusal of one job, whatever it
        says, is that job's: the jobs after it are still requeued. Slurm going away midway
        spools what was done (the drain above all, and the requeues before) before it is
        raised: the caller spools nothing then."""
        state = self.load_state()
        # Said under no drain of ours (a lemon's, a person's `healthctl drain`), then under
        # one: the same job is not said again.
        held = self._held_refusals()
        reported = set(state.refused_jobs if state else ()) | set(held)
        start = len(done)
        try:
            self._requeue_listed(reason, skip, reported, done)
        except SlurmError:
            self._spool(done)
            raise
        finally:
            newly = [a.job_id for a in done[start:]
                     if a.action == ActionKind.REQUEUE_REFUSED and a.job_id]
            if state is not None and newly:
                state.refused_jobs = sorted(set(state.refused_jobs) | set(newly))
                self._write_state(state)
            elif newly:
                self._write_held_refusals(held + [j for j in newly if j not in held])

    def _requeue_listed(self, reason: str, skip: set[str], reported: set[str],
                        out: list[Action]) -> None:
        for job in self.slurm.jobs_on_node(self.node):
            # A COMPLETING job is already leaving the node (one we requeued last sweep is, for
            # a moment, before it turns PENDING): there is nothing left to requeue.
            if job.job_id in skip or job.state.startswith("COMPLETING"):
                continue
            if not job.requeue:
                refused = Action(ActionKind.REQUEUE_REFUSED, self.node, reason, job.job_id,
                                 "job was submitted --no-requeue")
            else:
                try:
                    self.slurm.requeue(job.target)
                    out.append(Action(ActionKind.REQUEUE, self.node, reason, job.job_id))
                    continue
                except JobGone:
                    continue  # it ended or was requeued between the listing and the requeue
                except SlurmCommandError as exc:  # RequeueRefused, or anything Slurm said
                    refused = Action(ActionKind.REQUEUE_REFUSED, self.node, reason, job.job_id,
                                     exc.stderr[:500])
            if job.job_id in reported:
                continue
            out.append(refused)
            self.log(f"job {job.job_id} on {self.node} refused requeue: "
                     f"{refused.detail}")

    # ---- resume ----------------------------------------------------------------------------
    def _clean(self, info: NodeInfo) -> list[Action]:
        state = self.load_state()
        if not info.drain_set:
            if state is not None and self._reboot_lifted(state, info):
                # Lifted by Slurm as the reboot ended: set again. A DOWN node (the reboot
                # timed out) runs nothing: that waits until Slurm brings it back.
                return [] if info.down else self._drain_again(state, info)
            if state is not None:
                self._clear_state()  # resumed by someone else; nothing left to track
            return []
        if not is_ours(info.reason) or state is None or not _shows(state.reason, info.reason):
            # Not our drain, or our record is not about this drain (compared without the
            # trailing space a record written before format_reason stripped it may hold, and
            # with Slurm's " : reboot issued" after it). A person's drain over ours is theirs
            # to lift. Not so the reason of a reboot with nextstate=RESUME asked over our
            # drain (`scontrol reboot ... reason=X` replaces ours while the drain stands):
            # the node is never repaired by it, and Slurm lifts the drain when it is back.
            # A person's drain (theirs, NHC's, Slurm's, an operator's or a lemon's of ours)
            # seen with no reboot in hand makes the node theirs: our record goes (their
            # resume would end it), so a reboot they ask later with nextstate=RESUME is not
            # taken for one over our drain.
            theirs = (parse_reason(info.reason) or {}).get("mode") not in MODE_FOR_LEVEL.values()
            if state is not None and theirs and not info.in_hand:
                self._clear_state()
            elif state is not None:
                self._watch_reboot(info, state, ours=False)
            return []
        self._watch_reboot(info)
        if not self._resumable(state):
            return []
        if info.in_hand or info.down:
            # A reboot or power change someone asked Slurm for (`scontrol reboot ASAP` keeps
            # our reason when given none): a resume now could cancel it. Or Slurm's own DOWN
            # on top of our drain (slurmd stopped answering; it keeps our reason): RESUME
            # would clear that too, which is Slurm's to do (ReturnToService) or a person's,
            # and a sweep from the systemd timer runs even with slurmd dead. Slurm ends
            # either with the node's next state; the clean count waits, and restarts after.
            why = info.in_hand.lower() + " in hand" if info.in_hand else "down in Slurm"
            self.log(f"{self.node} is {info.state}: {why}, not resumed by rsc_health")
            self._reset_clean_count()
            return []
        state.clean_sweeps += 1
        if state.clean_sweeps < self.resume_after:
            self._write_state(state)
            return []
        # Our drain alone: a DOWN someone set since the read above stays (RESUME lifts both).
        self.slurm.undrain(self.node)
        self._clear_state()
        return [Action(ActionKind.RESUME, self.node, info.reason,
                       detail=f"{state.clean_sweeps} clean sweeps")]

    # ---- node-local state ------------------------------------------------------------------
    @property
    def _state_path(self) -> Path:
        return self.state_dir / DRAIN_STATE_FILE

    def load_state(self) -> DrainState | None:
        """What we drained for; None when absent or not a record this code wrote (right
        keys, wrong types would raise later, on every sweep, or resume on a truthy string):
        with no record the node is never auto-resumed, a person resumes it. A record that is
        there and unreadable (empty after a power cut, cut short, a directory, a FIFO) is
        said once and removed, so a later drain or adoption can write a whole one. A key this
        release does not know (a later release wrote the record, then was rolled back) is
        left out, not the record: the drain and what it was for still stand."""
        data = load_state_json(self._state_path)
        try:
            if "lost" in data:
                raise ValueError(data["lost"])
            known = set(record_fields(DrainState))
            state = DrainState(**{k: v for k, v in data.items() if k in known}) \
                if data else None
        except (ValueError, TypeError) as exc:
            self._discard_state(str(exc))
            return None
        if state is None:
            return None
        texts = (state.reason, state.time, *state.codes, *state.refused_jobs) if (
            isinstance(state.codes, list) and isinstance(state.refused_jobs, list)) else (None,)
        if (not all(isinstance(t, str) for t in texts)
                or not isinstance(state.auto_resumable, bool)
                or not isinstance(state.settled, bool)
                or not isinstance(state.reboot_resumes, bool) or not isinstance(state.boot, str)
                or not isinstance(state.boot_seen, str) or not isinstance(state.boot_id, str)
                or isinstance(state.clean_sweeps, bool) or not isinstance(state.clean_sweeps, int)):
            self._discard_state("not a record this code wrote")
            return None
        return state

    def _held_refusals(self) -> list[str]:
        """Jobs said to refuse requeue with no drain record of ours (REFUSALS_FILE), oldest
        first; [] when none or not a list of job ids (then said again: the safe side)."""
        jobs = load_state_json(self.state_dir / REFUSALS_FILE).get("jobs")
        if isinstance(jobs, list) and all(isinstance(j, str) for j in jobs):
            return jobs[-REFUSALS_KEPT:]
        return []

    def _write_held_refusals(self, jobs: list[str]) -> None:
        try:
            write_atomic(self.state_dir / REFUSALS_FILE,
                         json.dumps({"jobs": jobs[-REFUSALS_KEPT:]}))
        except OSError as exc:
            self.log(f"cannot record the requeue refusals in {self.state_dir} "
                     f"({exc.strerror or exc}); they may be said again")

    def _discard_state(self, why: str) -> None:
        self.log(f"unreadable drain record {self._state_path} ({why[:80]}) discarded; "
                 f"{self.node} will not be auto-resumed from it")
        self._clear_state()

    def _write_state(self, state: DrainState, then: str = "") -> bool:
        """Best effort: the drain is already done in Slurm when this runs, and a state dir
        that refuses writes (read-only, full) must not stop the requeue that follows. Without
        the record the node is never auto-resumed (a person resumes it): the safe side.
        `then`: what follows from the failure instead, where a record stands already."""
        try:
            # Durable: a power cut must not leave an empty record (read as "no record").
            write_atomic(self._state_path, json.dumps(asdict(state)))
        except OSError as exc:
            self.log(f"cannot record the drain state in {self.state_dir} "
                     f"({exc.strerror or exc}); "
                     + (then or f"{self.node} will not be auto-resumed"))
            return False
        return True

    def _save_state(self, verdict: Verdict, reason: str | None = None, *,
                    settled: bool = True) -> bool:
        """Record the drain Slurm holds for `verdict` (`reason`: the reason Slurm shows, when
        it is not this verdict's own: then the record is not auto-resumable, it is left to a
        person). False when the record could not be written."""
        same = reason is None or reason == verdict.reason
        codes = sorted({c.code or c.family for c in verdict.causes}) if same else []
        return self._write_state(DrainState(
            reason=verdict.reason if reason is None else reason,
            codes=codes,
            auto_resumable=same and verdict.auto_resumable and not (self.never_resume
                                                                    & set(codes)),
            time=self.now().isoformat(),
            settled=settled,
        ))

    def _never_resumed(self, causes) -> list:
        return [c for c in causes if (c.code or c.family) in self.never_resume]

    def _led(self, verdict: Verdict, mode: str | None = None) -> str:
        """The reason to drain with: led by a cause whose code is never auto-resumed, when one
        is among the verdict's. `healthctl resume` asks a qualification pass for such a drain
        by the code the reason leads with (the node's own record is on the node, out of its
        reach): an XID 79 behind `gpu_inaccessible ... (+1 more)` was resumed with no pass
        (helper-208). `mode`: the drain's own, when it stands already."""
        causes = list(verdict.causes)
        lead = self._never_resumed(causes)
        if not lead or (mode is None and causes[0] in lead):
            return verdict.reason
        return format_reason(mode or MODE_FOR_LEVEL[verdict.level],
                             lead + [c for c in causes if c not in lead])

    def _note_verdict(self, verdict: Verdict, before: DrainState | None = None) -> None:
        """A drain verdict under our drain: restart the clean count, and add what it found
        (and what an earlier record `before` was for) to the record, so a repair fault found
        under a transient drain (an XID 79 while drained for a lost mount) is never
        auto-resumed with it: its events are consumed, no later run sees them again. A write
        refused leaves the record as it was (auto-resumable for the mount alone, its clean
        count running on): `unrecorded` tells the caller to keep the verdict pending."""
        state = self.load_state()
        if state is None:
            return
        found = {c.code or c.family for c in verdict.causes}
        codes = sorted(set(state.codes) | found | set(before.codes if before else ()))
        resumable = (state.auto_resumable and verdict.auto_resumable
                     and (before is None or before.auto_resumable)
                     and not self.never_resume & set(codes))
        if (state.clean_sweeps, state.codes, state.auto_resumable) != (0, codes, resumable):
            state.clean_sweeps, state.codes, state.auto_resumable = 0, codes, resumable
            if not self._write_state(state, then=f"the drain of {self.node} stands; the "
                                     f"verdict ({', '.join(sorted(found))}) is kept for the "
                                     "next run to record"):
                self.unrecorded = True

    def _reset_clean_count(self) -> None:
        state = self.load_state()
        if state is not None and state.clean_sweeps:
            state.clean_sweeps = 0
            self._write_state(state)

    def _clear_state(self) -> None:
        try:
            remove(self._state_path)  # for good: a power cut must not bring it back
        except OSError as exc:
            self.log(f"cannot clear the drain state in {self.state_dir} "
                     f"({exc.strerror or exc})")

    def _spool(self, actions: list[Action]) -> None:
        if not actions:
            return
        now = self.now()
        recs = [spool.record("action", a.node, now, action=a.action, reason=a.reason,
                             job_id=a.job_id, detail=a.detail) for a in actions]
        try:
            spool.append(self.state_dir / "spool", recs)
        except OSError as exc:
            self.log(f"cannot spool actions: {exc}")


def spool_action(state_dir: str | os.PathLike, action: Action,
                 now: datetime | None = None) -> None:
    """Append one action done outside an Actor (healthctl drain/resume) to the spool."""
    spool.append(Path(state_dir) / "spool", [spool.record(
        "action", action.node, now or utcnow(), action=action.action, reason=action.reason,
        job_id=action.job_id, detail=action.detail)])
