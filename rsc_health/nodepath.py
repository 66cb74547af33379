"""The node path: what Slurm runs on the compute node (prolog, epilog, periodic sweep).

    python -m rsc_health.nodepath prolog|epilog|sweep

Standard library only (no click): the prolog is part of every job's start-up. The three entry
points are one pipeline (`_run`): resolve the config and the node's name, take the per-node
lock, run the checks, spool what was seen (findings, a heartbeat) and only then advance the
node's state (XID cursor, counter baselines), act in Slurm, and write the sinks (stderr and
syslog, the Prometheus textfile). What differs per entry point is a `Stage`: which families,
how long, whether to requeue, and what exit code Slurm gets.

Environment: SLURMD_NODENAME (else [slurm] node_name, else the short hostname),
RSC_HEALTH_ROOT (the node's root, "/" in production), RSC_HEALTH_CONFIG (the site config),
SLURM_JOB_ID / SLURM_JOB_USER / SLURM_JOB_PARTITION / SLURM_JOB_NODELIST (set by slurmd for
prolog and epilog).

Exit codes: the prolog exits 1 on a drain verdict (after setting the specific reason) so slurmd
drains the node and requeues the job elsewhere; otherwise 0, also when the checker itself is
broken (a bad config, a state dir it cannot write, a bug, a hang past the budget): a checker
fault never fails a job. The one exception is a prolog that already holds a drain verdict when
its own fault strikes (or finds its config broken with one pending that the mass-drain guard
did not hold): it still exits 1, as the verdict asked, and keeps the verdict pending
(why="fault"). The epilog and the sweep exit 0: Slurm needs only the actions they take. A
healthy prolog, epilog or sweep makes no Slurm call. A node lock still held after [slurm]
lock_timeout_s (by a run stuck in the kernel) is not a reason to look away: the run judges
read-only without it (a checker error `lock_held`; no cursor or baseline moved) and acts on
what it sees, and keeps the probes' hang record, so NVML unanswered [gpu] nvml_hang_sweeps
sweeps in a row drains the node (nvml_wedged) with the lock held as without it.

The parts live in rsc_health/node/: the stages and a run's progress (stage), the local store
(store: lock, pending verdicts, guard backoff), the sinks every exit path writes (sinks: log,
spool, textfile, stdout), the early exits (exits: fault, broken config, watchdog) and the
Slurm side (act). This module is the pipeline and the entry points.

Never forget: a drain verdict that could not be carried out (slurmctld away, the mass-drain
guard holding, or a drain that is not ours standing: a person's, NHC's, slurmd's "Prolog
error") is kept in `pending_verdict.json` and honoured by the next sweep or prolog.
"""

from __future__ import annotations

import gc
import os
import sys
import time

if __name__ == "__main__":
    # A job start: few cycles to collect in a process that leaves within a second by
    # os._exit, yet its imports alone made the collector pass over every object several
    # times (2-3 ms of a 50 ms healthy prolog, benchmarks/bench_prolog.py). Collection still
    # runs, only less often: garbage stays bounded (JOB_START_GC_THRESHOLD objects a pass).
    # The scripts start through rsc_health.node.job_start, which sets the same threshold.
    from rsc_health.node import JOB_START_GC_THRESHOLD
    gc.set_threshold(JOB_START_GC_THRESHOLD)

from rsc_health import spool
from rsc_health.config import (
    ConfigError,
    last_good_config,
    load_config_compiled,
    node_root,
    resolve_node_config,
    state_dir,
)
from rsc_health.model import Finding, Severity, Status, Verdict, utcnow
from rsc_health.node import sinks
from rsc_health.node.act import act as _act
from rsc_health.node.act import job_records as _job_records
from rsc_health.node.exits import Watchdog, broken_config, checker_fault
from rsc_health.node.sinks import TEXTFILE, VERSION, heartbeat, log, write_spool, write_textfile
from rsc_health.node.stage import STAGES, Context, Progress, budget, drain_exit, job_id
from rsc_health.node.store import (
    HELD_BY,
    LOCK_FILE,
    PENDING_VERDICT_FILE,
    LockTimeout,
    PendingVerdict,
    clear_pending,
    guard_backs_off,
    guard_retry_after,
    load_pending,
    node_lock,
    remember_config,
    save_pending,
)
from rsc_health.policy import decide, still_standing

# The names scripts, wrappers and tests reach through this module.
__all__ = ["LOCK_FILE", "MAINS", "PENDING_VERDICT_FILE", "STAGES", "TEXTFILE", "VERSION",
           "LockTimeout", "PendingVerdict", "drain_exit", "epilog", "guard_retry_after",
           "load_pending", "main", "main_and_leave", "node_lock", "prolog", "run_stage",
           "save_pending", "sweep"]


def _default_slurm(cfg, deadline: float | None):
    from rsc_health.slurm import from_config

    backend = from_config(cfg)
    backend.deadline = deadline
    return backend


def run_stage(name: str, *, slurm_factory=_default_slurm) -> int:
    """One run of an entry point. Whatever goes wrong inside (a broken state dir, a bug, a hang)
    ends in one line on stderr and syslog, a checker_error heartbeat where the disk allows, the
    textfile, and a safe exit code: the checker's own fault never fails a job or drains a
    node."""
    stage = STAGES[name]
    run = Progress(stage, time.monotonic(), job_id())
    # Armed before the config is read: a config on a hung mount cannot hold the prolog either.
    # Counted from the run's start, as every re-arming is (see _run).
    watchdog = Watchdog(run, budget(None, stage) + 2.0, since=run.started)
    try:
        return _run(run, watchdog, slurm_factory)
    except Exception as exc:  # noqa: BLE001 - the contract: a checker fault is not a node fault
        return checker_fault(run, exc)
    finally:
        watchdog.cancel()


def _run(run: Progress, watchdog: Watchdog, slurm_factory) -> int:
    stage = run.stage
    root = node_root()
    run.step = "config"
    try:
        base = load_config_compiled(root)
    except ConfigError as exc:
        # A broken or refused push must not blind the node: judge with the whole last config
        # that loaded here, and say the new one is broken (config_error) in the same run.
        kept = last_good_config(root)
        if kept is None:
            return broken_config(run, root, exc)
        base, which = kept
        run.config_error = f"bad config: {exc}; judged with {which}"[:500]
        log(f"{stage.name}: {run.config_error}")
    run.parsed = base.parsed
    sinks.set_syslog(bool(base.get("node.syslog")))
    # base is loaded for this run alone and not used again: the node's view is made in it.
    cfg, node = resolve_node_config(base, partition=os.environ.get("SLURM_JOB_PARTITION"),
                                    given_up=True)
    del base
    # The node's own [node] syslog ([nodes."GLOB".node]) from here on (helper-105: it was
    # shown by `config show --node` and not honoured).
    sinks.set_syslog(bool(cfg.get("node.syslog")))
    run.cfg, run.node = cfg, node
    sdir = run.sdir = state_dir(cfg, root)
    seconds = budget(cfg, stage)
    # From the run's start, as the deadline below: re-armed from now, a config that took long
    # to load (its filesystem slow to answer) moved the watchdog as far past the deadline and
    # slurmd's PrologEpilogTimeout. One whose load ate the budget ends the run at once.
    watchdog.rearm(seconds + 2.0, since=run.started)
    ctx = Context(stage, cfg, root, node, sdir, run.started, run.started + seconds, run.job_id,
                  slurm_factory)
    run.step = "lock"
    try:
        # A third of what is left of the budget, not of the whole: after a slow config load
        # the wait plus the checks must still end before the watchdog (helper-117).
        left = run.started + seconds - time.monotonic()
        timeout = max(0.0, min(float(cfg.get("slurm.lock_timeout_s")), left / 3))
        with node_lock(sdir, timeout) as (writable, lock_note):
            return _judge(ctx, run, state_writable=writable, lock_note=lock_note)
    except LockTimeout as exc:
        # Whatever holds it (a run stuck in the kernel, a probe of an older release), the node
        # is still judged: read-only, so the events stay for the lock's holder to consume.
        log(f"{stage.name}: {exc}; judging without it (no cursor or baseline moved)")
        return _judge(ctx, run, lock_held=str(exc))


def _judge(ctx: Context, run: Progress, lock_held: str | None = None,
           state_writable: bool = True, lock_note: str | None = None) -> int:
    """Look, spool, remember, act. Under the node lock, or (lock_held: why it could not be
    taken) without it: then read-only, as `healthctl check` is: the XID cursor and counter
    baselines are not moved and no clean sweep counts towards a resume, but the kernel log, the
    probes and the pending verdict are judged and acted on (an XID 79 still fails the job),
    and the probes' hang record is kept (it consumes no event: a probe unanswered sweep after
    sweep still becomes the node's fault, nvml_wedged). A run that may lack a record of the
    probe children abandoned before it (the lock held: its holder's are not on it yet; the
    state dir refusing writes) finds them in /proc (collect.hangs)."""
    from rsc_health import engine

    stage, cfg = ctx.stage, ctx.cfg
    families = cfg.get(stage.families_key) if stage.families_key else None
    if stage.name == "prolog" and cfg.get("qualify.prolog_lite_min_nodes"):
        from rsc_health.node.lite import prolog_lite

        families, cfg = prolog_lite(cfg, families, os.environ)
    remaining = ctx.deadline - time.monotonic()
    run.step = "checks"
    only = set(families) if families else None
    run.inflight = engine.InFlight(cfg, only)
    # Checks get at most half of what is left; Slurm calls get the rest.
    findings, commit = engine.run_deferred(
        cfg, ctx.root, only=only,
        budget_s=max(1.0, remaining * 0.5), sweep=stage.name == "sweep",
        find_children=bool(lock_held) or not state_writable, stage=stage.name,
        inflight=run.inflight,
    )
    run.inflight.findings = findings
    if lock_held:
        findings.append(Finding("checker", LOCK_FILE, Status.ERROR, Severity.NONE,
                                f"{lock_held}: judged without it, read-only", "lock_held"))
    if lock_note:
        findings.append(Finding("checker", LOCK_FILE, Status.ERROR, Severity.NONE, lock_note,
                                "lock_file"))
    if run.config_error:
        findings.append(Finding("checker", "config", Status.ERROR, Severity.NONE,
                                run.config_error, "config_error"))
    run.step = "verdict"
    lost: list[str] = []
    pending = load_pending(ctx.sdir, lost)
    if lost:  # a drain verdict was held, and what it was for cannot be read: not "ok"
        findings.append(Finding(
            "checker", os.path.join(ctx.sdir, PENDING_VERDICT_FILE), Status.ERROR, Severity.NONE,
            f"{PENDING_VERDICT_FILE} unreadable ({lost[0][:80]}); discarded: the drain verdict "
            "it held is lost unless this run finds its fault again", "state_error"))
    if pending is not None:
        pending = _still_pending(ctx, pending, findings, locked=not lock_held)
    fresh = decide(findings)
    verdict = decide(findings + list(pending.verdict.causes)) if pending else fresh
    run.verdict = verdict
    now = utcnow()
    run.step = "spool"
    records = spool.check_records(findings, node=ctx.node, source=stage.name, time=now,
                                  job_id=ctx.job_id)
    records.extend(_job_records(ctx, now))
    records.extend(spool.telemetry_records(findings, node=ctx.node, source=stage.name, time=now,
                                           job_id=ctx.job_id))
    records.append(heartbeat(stage, ctx.node, now, verdict.level, findings,
                             time.monotonic() - ctx.started))
    records, spool_bytes = _within_spool_cap(ctx, records)
    run.spooled = write_spool(ctx.sdir, records)
    run.step = "act"
    if pending and guard_backs_off(cfg, stage, pending, fresh, now):
        # The mass-drain guard (something is wrong fleet-wide) or someone else's drain held
        # this verdict back. Each try reads the whole node table from slurmctld (about 25 ms
        # of its time at 16,000 nodes), and every held node would try on every sweep and job
        # start, for as long as the outage or the maintenance lasts. Nothing new since: no
        # Slurm call until the backoff (jittered, doubling) runs out.
        code = 0
        still_pending: bool | None = True
        if pending.retry_after is not None and stage.name != "prolog":
            log(f"{stage.name}: {HELD_BY[pending.why]} held {verdict.reason} "
                f"{pending.holds} time(s); next try after {pending.retry_after:%H:%M:%S}Z")
    else:
        code, still_pending = _act(ctx, verdict, pending, now=now, locked=not lock_held)
    run.exit_code, run.acted = code, True
    # Only now is it safe to consume the events: they are on disk, and a drain verdict they
    # gave was carried out or kept pending (still_pending None: neither, the disk refused
    # pending_verdict.json with slurmctld away, so the next run must read them again to find
    # it). When the spool is not writable the next run reads them again, under the same
    # record ids. A run without the lock consumes none (the cursors and baselines are the
    # holder's). The record of the probes that hang (which, since when, how many sweeps in
    # a row, the children left behind) is saved all the same: it consumes no event, and
    # without it a node whose lock a run stuck in the kernel holds for good never counted a
    # second sweep of NVML unanswered, never drained as nvml_wedged, and kept taking jobs.
    # A run killed before here (slurmd's timeout in a Slurm call) saved nothing either.
    run.step = "state"
    unsaved = commit(events=not lock_held and run.spooled and still_pending is not None)
    for f in unsaved:
        log(f"{stage.name}: {f.reason}")
    if unsaved and run.spooled:
        # The next run will see these events again (same record ids, so the historian keeps
        # one copy); the operator must see that the state dir refuses writes.
        write_spool(ctx.sdir, spool.check_records(unsaved, node=ctx.node, source=stage.name,
                                                  time=now, job_id=ctx.job_id))
    findings = findings + unsaved
    run.step = "textfile"
    write_textfile(cfg, ctx.root, ctx.node, stage, verdict.level, findings,
                   time.monotonic() - ctx.started, pending=still_pending is not False,
                   spool_bytes=spool_bytes, families=set(families) if families else None)
    if not run.config_error:
        remember_config(cfg, ctx.sdir, run.parsed)
    return code


def _still_pending(ctx: Context, pending: PendingVerdict, findings: list[Finding], *,
                   locked: bool) -> PendingVerdict | None:
    """The kept verdict less the causes this run sees healed (policy.still_standing: a
    transient fault the same check now calls ok on the same component); None when none is
    left, and the file forgotten by a run holding the lock (one without it may race its
    holder's save). Carried out as kept, a mount missing while slurmctld was away, back by
    now, drained the node and requeued its jobs for a fault it no longer had."""
    kept = pending.verdict.causes
    standing = still_standing(kept, findings,
                              never_resume=set(ctx.cfg.get("actions.never_resume_codes")))
    if len(standing) == len(kept):
        return pending
    healed = ", ".join(f"{c.code} on {c.component}" for c in kept
                      if not any(c is s for s in standing))
    log(f"{ctx.stage.name}: kept drain verdict: {healed} seen healthy now, dropped"
        + ("" if standing else "; nothing of it left to carry out"))
    if not standing:
        if locked:
            clear_pending(ctx.sdir)
        return None
    return PendingVerdict(Verdict(max(c.level for c in standing), "", tuple(standing)),
                          pending.why, pending.holds, pending.retry_after, pending.time)


def _within_spool_cap(ctx: Context, records: list[dict]) -> tuple[list[dict], int]:
    return sinks.within_spool_cap(ctx.cfg, ctx.sdir, ctx.stage.name, records)


def prolog() -> int:
    return run_stage("prolog")


def epilog() -> int:
    return run_stage("epilog")


def sweep() -> int:
    return run_stage("sweep")


MAINS = {"prolog": prolog, "epilog": epilog, "sweep": sweep}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in MAINS:
        print("usage: python -m rsc_health.nodepath prolog|epilog|sweep", file=sys.stderr)
        return 2
    return MAINS[argv[0]]()


def main_and_leave(argv: list[str] | None = None) -> None:
    """main(), then leave at once with its exit code: what `python -m rsc_health.nodepath` and
    the node zipapp run. Everything the run promised is on disk by then (the spool and state
    were fsynced, every file closed, syslog lines sent when logged), so the interpreter's
    teardown (collecting every module and object, joining nothing: the watchdog's thread is a
    daemon) only adds to every job's start: 13 ms of the healthy prolog's 73 ms of CPU
    (benchmarks/bench_prolog.py). stdout and stderr are flushed first; nothing registers an
    atexit handler on the node path."""
    code = main(argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said
            pass
    os._exit(code)


if __name__ == "__main__":
    main_and_leave()
