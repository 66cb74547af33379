"""The ways a node-path run ends early, each ending in one line on stderr and syslog, a
checker record and heartbeat in the spool where the disk allows, the textfile, and a safe
exit code (rsc_health.nodepath, "Exit codes"): a checker fault, a config that does not load,
and the watchdog past the budget."""

from __future__ import annotations

import _thread
import os
import sys
import time

from rsc_health.model import Finding, Severity, Status
from rsc_health.node import sinks
from rsc_health.node.sinks import log
from rsc_health.node.stage import Progress, drain_exit
from rsc_health.node.store import load_pending, save_pending

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from rsc_health.config import ConfigError


def fault(run: Progress, code: str, reason: str) -> Finding:
    return Finding("checker", run.step, Status.ERROR, Severity.NONE, reason[:500], code)


def keep_unacted_verdict(run: Progress) -> None:
    if run.unacted_drain and not run.kept and run.sdir is not None and run.verdict is not None:
        save_pending(run.sdir, run.verdict, why="fault")


def judge_what_is_in(run: Progress) -> tuple[list[Finding], list[str]]:
    """A run ended before its verdict step (the watchdog) takes the verdict of what it had:
    the families whose inputs all came in before the hang (engine.InFlight), and a drain
    verdict pending from before. Before, such a prolog exited 0 on a GPU NVML had already
    called lost, or under a pending drain verdict, and the node took the job. (findings,
    families not judged); sets run.verdict when it drains.

    A pending verdict keeps what it was held for (the mass-drain guard, someone else's drain,
    Slurm away) and its backoff, with the fresh causes added (none is lost: its kernel-log
    line may be consumed). One the guard holds lets the job run, as the guard wants: a whole
    run would ask the guard again, this one cannot. The pending file is not read when its
    own read is what hung (the verdict step)."""
    if run.verdict is not None or run.inflight is None or run.cfg is None:
        return [], []
    from rsc_health.policy import decide, still_standing

    found, unjudged = run.inflight.judged()
    fresh = decide(found)
    if fresh.drains:
        run.verdict = fresh  # before the pending file is read: that read may hang too
    if run.sdir is None or run.step == "verdict":
        return found, unjudged
    pending = load_pending(run.sdir)
    if pending is None or not pending.verdict.drains:
        return found, unjudged
    # As a whole run would (nodepath._still_pending): a kept cause this run sees healed is
    # not carried out; with none left, what came in is the verdict (kept as a fault's).
    standing = still_standing(pending.verdict.causes, found,
                              never_resume=set(run.cfg.get("actions.never_resume_codes")))
    if not standing:
        return found, unjudged
    merged = decide(found + standing)
    if fresh.drains:
        save_pending(run.sdir, merged, why=pending.why, holds=pending.holds,
                     retry_after=pending.retry_after)
    run.kept = True  # the file says it all now: not saved again as a fault's
    run.verdict = None if pending.why == "guard" else merged
    return found, unjudged


def checker_fault(run: Progress, exc: BaseException) -> int:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "rsc_health" in f.filename] or frames
    where = f" at {_basename(ours[-1].filename)}:{ours[-1].lineno}" if ours else ""
    code = run.safe_exit()
    detail = f"{type(exc).__name__}: {exc}"[:300]
    keep_unacted_verdict(run)
    finding = fault(run, "checker_fault", f"checker fault during {run.step}: {detail}")
    unspooled = sinks.say_fault(run, finding)
    log(f"{run.stage.name}: checker fault during {run.step}{where}: {detail}; exiting {code}"
        + (f" (not spooled: {unspooled})" if unspooled else ""))
    return code


def _basename(filename: str) -> str:
    """Path(filename).name: the last part, trailing slashes aside."""
    return os.path.basename(filename.rstrip("/"))


def broken_config(run: Progress, root: str | os.PathLike, exc: ConfigError) -> int:
    """The checker cannot look: say so loudly (stderr, syslog, spool, textfile), let the job
    run, unless a drain verdict from before is pending (see the module's exit codes). The
    packaged defaults still say where the spool and that verdict are; the textfile goes where
    the last good config put it (config.fallback_config)."""
    from rsc_health.config import ConfigError, fallback_config, node_name, state_dir

    stage = run.stage
    try:
        defaults, which = fallback_config(root)
    except ConfigError:
        log(f"{stage.name}: bad config: {exc}")
        return 0
    log(f"{stage.name}: bad config: {exc} (spool and textfile where {which} say)")
    run.node, run.sdir = node_name(defaults), state_dir(defaults, root)
    finding = fault(run, "config_error", f"bad config: {exc}")
    pending = load_pending(run.sdir) if stage.name == "prolog" else None
    held = pending is not None and pending.verdict.drains and pending.why != "guard"
    unspooled = sinks.say_fault(run, finding, cfg=defaults, root=root, pending=held)
    if unspooled:
        log(f"{stage.name}: cannot write the spool: {unspooled}")
    if held and pending is not None:
        # A drain verdict from before the config broke (Slurm was away, or a fault struck):
        # a working config would fail this job start, so does a broken one. One held back by
        # the mass-drain guard lets jobs run, as it would with a working config.
        codes = ", ".join(sorted({c.code or c.family for c in pending.verdict.causes}))
        log(f"{stage.name}: a drain verdict is pending ({codes}; {pending.why}); failing the "
            f"job start so slurmd drains the node. Fix the config to carry it out ourselves")
        return drain_exit()
    return 0


def _exit_after(seconds: float, run: Progress) -> None:
    time.sleep(seconds)
    try:
        code = run.safe_exit()  # the verdict the watchdog judged in the meantime, if any
    except Exception:  # noqa: BLE001 - leaving is all that is left
        code = 0
    os._exit(code)


class Watchdog:
    """Past the budget, whatever is stuck (a probe that ignored its deadline, a Slurm call, a
    config on a hung mount), the process leaves with the safe exit code: it names the step,
    spools a checker_error heartbeat and writes the textfile (bounded by a one-second
    backstop, since the spool's disk may be what hangs) and calls os._exit, so no stuck thread
    or child can hold the exit.

    Its thread is a bare _thread waiting on a lock with a timeout (cancel releases the lock),
    not a threading.Timer: importing threading (and _weakrefset) cost every job start 4.1 M
    instructions, about 3% of a healthy prolog (benchmarks/bench_prolog_floor.py). Like a
    daemon Timer, nothing waits for it at exit; the node path leaves by os._exit anyway.

    Re-armed to a deadline no earlier than the one waited for (the config's budget, once it
    is read, against the packaged one armed before), the thread already waiting waits on to
    it: one thread a run, not a second started and the first woken to end (a thread start
    and GIL handoffs on every job start). An earlier deadline gets a thread of its own (one
    already past fires at once).

    `since`: the time.monotonic() the seconds count from (the node path gives the run's
    start, as its deadline, run.started + budget, does; re-armed from the end of the config's
    load, a load that took long let the run overrun its budget and slurmd's
    PrologEpilogTimeout by as much); now when None."""

    BACKSTOP_S = 1.0

    def __init__(self, run: Progress, after_s: float, since: float | None = None):
        self.run = run
        # The lock the waiting thread times out on; released = cancelled.
        self._armed: _thread.LockType | None = None
        self._until = 0.0  # time.monotonic() at which the waiting thread fires
        self.rearm(after_s, since)

    def rearm(self, after_s: float, since: float | None = None) -> None:
        until = (time.monotonic() if since is None else since) + after_s
        self.after_s = after_s
        if self._armed is not None and until >= self._until:
            self._until = until  # read by the waiting thread when its wait ends
            return
        self.cancel()
        self._until = until
        armed = _thread.allocate_lock()
        armed.acquire()
        self._armed = armed
        _thread.start_new_thread(self._wait, (armed,))

    def cancel(self) -> None:
        armed, self._armed = self._armed, None
        if armed is not None:
            armed.release()

    def _wait(self, armed: _thread.LockType) -> None:
        while True:
            left = self._until - time.monotonic()
            if left <= 0:
                break
            if armed.acquire(timeout=min(left, _thread.TIMEOUT_MAX)):
                return  # cancelled (or replaced by a thread for an earlier deadline)
        if self._armed is armed:  # still this thread's arming: not cancelled meanwhile
            self._fire()

    def _fire(self) -> None:
        run = self.run
        _thread.start_new_thread(_exit_after, (self.BACKSTOP_S, run))
        try:
            # Said first: judging reads the state dir, which may be what hangs (then the
            # backstop ends the run, and this line is all an operator gets).
            log(f"{run.stage.name}: still running after {self.after_s:.0f}s during {run.step} "
                "(budget exceeded; a source or a Slurm call hung)")
            found: list[Finding] = []
            unjudged: list[str] = []
            try:
                found, unjudged = judge_what_is_in(run)
            except Exception as exc:  # noqa: BLE001 - the exit must not wait on a judging bug
                log(f"{run.stage.name}: could not judge what was read before the hang: "
                    f"{type(exc).__name__}: {exc}"[:300])
            code = run.safe_exit()
            # A Slurm command or site check still running is killed with its process group
            # (imported only if something started one): os._exit leaves them running.
            procs = sys.modules.get("rsc_health.collect.procs")
            if procs is not None:
                procs.kill_live_groups()
            judged = (f"judged what was read before it, not {', '.join(unjudged)}; "
                      if unjudged and run.inflight is not None and run.inflight.state is not None
                      else "")
            verdict = (f" ({run.verdict.reason})" if run.verdict is not None
                       and run.verdict.drains else "")
            log(f"{run.stage.name}: {judged}exiting {code}{verdict}")
            keep_unacted_verdict(run)
            unspooled = sinks.say_fault(run, fault(
                run, "checker_timeout",
                f"{run.stage.name} hung during {run.step} past {self.after_s:.0f}s"
                + (f"; not judged: {', '.join(unjudged)}" if unjudged else "")), found=found)
            if unspooled:
                log(f"{run.stage.name}: not spooled: {unspooled}")
        finally:
            os._exit(run.safe_exit())
