"""Carrying a verdict out in Slurm, and the job records a prolog or epilog spools. Imports
nothing of the Slurm side until a verdict asks for it: a healthy prolog makes no Slurm call."""

from __future__ import annotations

import os

from rsc_health import spool
from rsc_health.model import HELD_KINDS, ActionKind, Level, Verdict
from rsc_health.node.sinks import log, sweep_line
from rsc_health.node.stage import Context, drain_exit
from rsc_health.node.store import (
    HELD_BY,
    PendingVerdict,
    clear_pending,
    guard_retry_after,
    has_drain_state,
    reboot_lift_owed,
    save_pending,
)

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from datetime import datetime


def act(ctx: Context, verdict: Verdict, pending: PendingVerdict | None, *, now: datetime,
        locked: bool = True) -> tuple[int, bool | None]:
    """Carry out the verdict in Slurm; (exit code, verdict still pending): None when a drain
    verdict was neither carried out nor kept (the disk refused pending_verdict.json), so the
    events that gave it must not be consumed. A run without the node lock carries out a
    drain, but its clean verdict does not count towards a resume."""
    stage, cfg = ctx.stage, ctx.cfg
    had_pending = pending is not None
    settled = _settled_without_slurm(ctx, verdict, had_pending, locked)
    if settled is not None:
        return settled
    # Imported only past this point: a healthy prolog neither calls nor loads the Slurm side.
    from rsc_health.actions import Actor
    from rsc_health.collect import kmsg
    from rsc_health.slurm.api import SlurmError

    skip = {ctx.job_id} if (ctx.job_id and stage.name in ("prolog", "epilog")) else None
    slurm = ctx.slurm_factory(cfg, ctx.deadline)
    try:
        actor = Actor(slurm, cfg, ctx.node, ctx.sdir, log=log,
                      boot_id=lambda: kmsg.boot_id(ctx.root), deadline=ctx.deadline)
        actions = actor.apply(verdict, requeue=stage.requeue,
                              clean_sweep=stage.counts_as_clean and not had_pending,
                              skip_jobs=skip)
    except SlurmError as exc:
        return _slurm_away(ctx, verdict, had_pending, exc, now)
    held = next((a.action for a in actions if a.action in HELD_KINDS), None)
    if verdict.drains and held:
        return _held_back(ctx, verdict, pending, held, now)
    if verdict.drains and actor.unrecorded:
        return _unrecorded(ctx, verdict, actions, now)
    clear_pending(ctx.sdir)
    sweep_line(stage, ctx.node, verdict.level, verdict.reason, actions)
    restored = any(a.action == ActionKind.DRAIN_NOW for a in actions)
    if stage.name == "prolog" and (verdict.drains or restored) and cfg.get("actions.enabled"):
        log(f"prolog: {verdict.reason}")
        return drain_exit(), False
    return 0, False


def _settled_without_slurm(ctx: Context, verdict: Verdict, had_pending: bool,
                           locked: bool) -> tuple[int, bool] | None:
    """(exit code, still pending) when the verdict needs no Slurm call: shadow mode, or a
    clean run with nothing of ours to resume; None when Slurm must be asked."""
    stage = ctx.stage
    if not ctx.cfg.get("actions.enabled") and verdict.drains:
        # Shadow mode: record what would have been drained, ask Slurm nothing, fail no job.
        from rsc_health.actions import Actor

        Actor(None, ctx.cfg, ctx.node, ctx.sdir, log=log).apply(verdict)
        log(f"{stage.name}: shadow mode, would drain: {verdict.reason}")
        if had_pending:
            # Kept, and said: a verdict held from before shadow mode acts once [actions]
            # enabled is true again (the gauge said nothing was pending, for weeks).
            log(f"{stage.name}: a drain verdict held from before shadow mode stays pending; "
                "it acts when [actions] enabled is true again")
        return 0, had_pending
    if verdict.drains:
        return None
    if not (stage.counts_as_clean and locked and verdict.level in (Level.OK, Level.WARN)):
        if stage.name == "prolog" and not had_pending and reboot_lift_owed(ctx.sdir):
            return None  # did the reboot lift our drain? The job must not start if so.
        return 0, had_pending
    if not has_drain_state(ctx.sdir):
        # A clean sweep only talks to Slurm to count towards resuming a node we drained:
        # with no drain of ours on record, 16,000 nodes' sweeps cost slurmctld nothing.
        sweep_line(stage, ctx.node, verdict.level, verdict.reason, [])
        return 0, had_pending
    return None


def _slurm_away(ctx: Context, verdict: Verdict, had_pending: bool, exc: Exception,
                now: datetime) -> tuple[int, bool | None]:
    stage = ctx.stage
    if not verdict.drains:
        log(f"{stage.name}: Slurm unavailable ({exc})")
        return 0, had_pending
    kept = save_pending(ctx.sdir, verdict, why="slurm_unavailable", now=now)
    log(f"{stage.name}: Slurm unavailable ({exc}); verdict {verdict.level.name} "
        + ("kept for the next run" if kept else "not kept (see above): the next run reads "
           "its events again"))
    # The prolog still fails the job start: slurmd then drains the node itself.
    enabled = bool(ctx.cfg.get("actions.enabled"))
    return (drain_exit() if stage.name == "prolog" and enabled else 0), (True if kept else None)


def _unrecorded(ctx: Context, verdict: Verdict, actions: list, now: datetime
                ) -> tuple[int, bool | None]:
    """Carried out in Slurm, but our drain record could not be told what the verdict found
    (actions.Actor.unrecorded: a full or failing state disk): kept pending, so the next run
    records it; not kept either, its events are not consumed. Cleared as done, an XID 79
    under our drain for a lost mount left the record auto-resumable for the mount alone, its
    line consumed: three clean sweeps resumed a node whose GPU had fallen off the bus."""
    stage = ctx.stage
    sweep_line(stage, ctx.node, verdict.level, verdict.reason, actions)
    kept = save_pending(ctx.sdir, verdict, why="unrecorded", now=now)
    log(f"{stage.name}: verdict {verdict.reason} carried out, not recorded in the drain "
        "record; " + ("kept for the next run" if kept else "not kept (see above): the next "
                      "run reads its events again"))
    enabled = bool(ctx.cfg.get("actions.enabled"))
    code = drain_exit() if stage.name == "prolog" and enabled else 0
    return code, (True if kept else None)


def _held_back(ctx: Context, verdict: Verdict, pending: PendingVerdict | None, held,
               now: datetime) -> tuple[int, bool | None]:
    """The mass-drain guard or someone else's drain held the verdict: kept pending, retried
    after a backoff."""
    stage = ctx.stage
    why = "guard" if held == ActionKind.GUARD_TRIPPED else "foreign_drain"
    holds = (pending.holds if pending is not None and pending.why == why else 0) + 1
    retry = guard_retry_after(ctx.cfg, holds, now)
    kept = save_pending(ctx.sdir, verdict, why=why, holds=holds, retry_after=retry, now=now)
    if kept:
        log(f"{stage.name}: {HELD_BY[why]} holds; verdict {verdict.reason} kept and retried "
            f"after {retry:%H:%M:%S}Z (held {holds} time(s))")
    else:
        log(f"{stage.name}: {HELD_BY[why]} holds; verdict {verdict.reason} not kept (see "
            "above): the next run reads its events again")
    # A job start under someone else's drain (its allocation came before that drain):
    # the job must not run on the fault. Under the guard, jobs run, as the guard wants.
    foreign = why == "foreign_drain" and stage.name == "prolog"
    return (drain_exit() if foreign else 0), (True if kept else None)


def job_records(ctx: Context, now) -> list[dict]:
    """job_start / job_end. ExcNodeList costs a Slurm RPC, so it is read only when the lemon
    feature wants it and only on the allocation's first node: one call per job, not per node."""
    if not ctx.job_id:
        return []
    if ctx.stage.name == "epilog":
        return [spool.record("job_end", ctx.node, now, job_id=ctx.job_id)]
    if ctx.stage.name != "prolog":
        return []
    excluded: list[str] = []
    if ctx.cfg.get("slurm.record_exclusions") and _first_node(ctx.node):
        from rsc_health.slurm.api import SlurmError

        try:
            job = ctx.slurm_factory(ctx.cfg, ctx.deadline).job(ctx.job_id)
            excluded = list(job.excluded) if job else []
        except SlurmError as exc:
            log(f"prolog: cannot read job {ctx.job_id}: {exc}")
    # `nodes`: the job's nodelist as Slurm gave it, so the historian knows once every node of
    # a job sacct has not told of yet has told (docs/failslow.md, "Time to flag")
    return [spool.record(
        "job_start", ctx.node, now, job_id=ctx.job_id, excluded=excluded,
        user=os.environ.get("SLURM_JOB_USER", ""),
        partition=os.environ.get("SLURM_JOB_PARTITION", ""),
        nodes=os.environ.get("SLURM_JOB_NODELIST", ""),
    )]


def _first_node(node: str) -> bool:
    from rsc_health.hostlist import HostlistError, expand

    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return True
    try:
        hosts = expand(nodelist)
    except (HostlistError, ValueError):
        return False
    return bool(hosts) and hosts[0] == node
