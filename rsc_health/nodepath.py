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
read-only without it (a checker error `lock_held`) and acts on what it sees.

Never forget: a drain verdict that could not be carried out (slurmctld away, the mass-drain
guard holding, or a drain that is not ours standing: a person's, NHC's, slurmd's "Prolog
error") is kept in `pending_verdict.json` and honoured by the next sweep or prolog.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from rsc_health import spool
from rsc_health.collect.sysfs import read_bounded
from rsc_health.config import (
    Config,
    ConfigError,
    fallback_config,
    load_config,
    node_name,
    node_root,
    resolve_node_config,
    state_dir,
)
from rsc_health.durable import open_regular, remove, write_atomic
from rsc_health.model import (
    HELD_KINDS,
    HUNG_CODES,
    ActionKind,
    Finding,
    Level,
    Severity,
    Status,
    Verdict,
    utcnow,
)
from rsc_health.policy import decide
from rsc_health.record import dataclass

LOCK_FILE = "node.lock"
# A drain verdict not yet carried out (controller away, the guard holding, someone else's drain
# standing): acted on by the next sweep or prolog, because the engine has already consumed the
# events behind it.
PENDING_VERDICT_FILE = "pending_verdict.json"
TEXTFILE = "rsc_health.prom"
VERSION = "0.1.0"


def drain_exit() -> int:
    """The prolog's exit code for a drain verdict: 1 (what slurmd drains on), or the code the
    shipped wrapper asks for (RSC_HEALTH_DRAIN_EXIT) so it can tell a verdict from a Python that
    could not even start, and turn only the verdict into 1."""
    try:
        code = int(os.environ.get("RSC_HEALTH_DRAIN_EXIT", "1"))
    except ValueError:
        return 1
    return code if 1 <= code <= 125 else 1


class LockTimeout(Exception):
    pass


_syslog_on = True


def log(msg: str) -> None:
    """stderr (the sweep's log) and syslog/journald: slurmd discards a prolog's stderr."""
    print(f"rsc_health: {msg}", file=sys.stderr, flush=True)
    if _syslog_on:
        try:
            import syslog

            syslog.openlog("rsc-health", syslog.LOG_PID, syslog.LOG_DAEMON)
            syslog.syslog(syslog.LOG_WARNING, msg[:2000])
        except Exception:  # noqa: BLE001 - logging must never break the node path
            pass


@contextmanager
def node_lock(sdir: Path, timeout_s: float):
    """flock on <state_dir>/node.lock; polls so the wait is bounded by our budget.

    A state dir that refuses writes (its filesystem remounted read-only after disk errors)
    must not blind the node path: flock needs no write access, so the lock file, or the
    directory itself when the file was never made, is opened read-only. That run can neither
    spool nor advance its cursor (it says so), but it still looks and acts."""
    _own_state_dir(sdir)
    # Held by this process alone: O_CLOEXEC (Python's default, said here) keeps it from the
    # programs a run executes (site checks, Slurm commands), and a probe forked without exec
    # closes it first thing (collect.bounded): a child stuck in the kernel must not hold it.
    # O_NOFOLLOW: a symlink planted at its name is not followed (nor created through).
    try:
        fd = os.open(sdir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o644)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        try:
            fd = os.open(sdir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = os.open(sdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        log(f"state dir {sdir} refuses writes ({exc.strerror}): checking and acting, but "
            f"nothing can be spooled or remembered until it is writable")
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{sdir / LOCK_FILE} held for {timeout_s:g}s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


STATE_DIR_MODE = 0o755


def _own_state_dir(sdir: Path) -> None:
    """The state dir, made 0755 whatever the umask. One that others may write (made 0777 by an
    older version under umask 000) is ours to mend: anyone could plant a pending verdict,
    a drain record or a symlink in it, and write_atomic refuses it (durable.DIRECTORY_RULE)."""
    from rsc_health.durable import make_dirs, unsafe_directory

    make_dirs(sdir, STATE_DIR_MODE)
    for directory, mode in ((sdir, STATE_DIR_MODE), (sdir / "spool", spool.SPOOL_DIR_MODE)):
        try:
            st = directory.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and unsafe_directory(st):
                os.chmod(directory, mode)
                log(f"{directory} was writable by group or others (mode "
                    f"{stat.S_IMODE(st.st_mode):o}): made {mode:o}")
        except OSError:
            pass  # a read-only state dir: node_lock says so


# ---- the stages -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    name: str  # prolog | epilog | sweep
    families_key: str | None  # [slurm] key listing the families, None = all
    budget_key: str
    default_budget_s: float
    requeue: bool  # DRAIN_NOW requeues the node's jobs (not in the prolog: Slurm does it)
    counts_as_clean: bool  # a clean run counts towards auto-resume (only the sweep)


STAGES = {
    "prolog": Stage("prolog", "slurm.prolog_families", "slurm.prolog_budget_s", 30, False, False),
    "epilog": Stage("epilog", "slurm.epilog_families", "slurm.epilog_budget_s", 30, True, False),
    "sweep": Stage("sweep", None, "slurm.sweep_budget_s", 45, True, True),
}


@dataclass
class Context:
    stage: Stage
    cfg: Config
    root: Path
    node: str
    sdir: Path
    started: float
    deadline: float
    job_id: str | None
    slurm_factory: Callable[[Config, float | None], object]


def _job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")


def _default_slurm(cfg: Config, deadline: float | None):
    from rsc_health.slurm import from_config

    backend = from_config(cfg)
    backend.deadline = deadline
    return backend


def _budget(cfg: Config, stage: Stage) -> float:
    try:
        return max(1.0, float(cfg.get(stage.budget_key, stage.default_budget_s)))
    except (TypeError, ValueError):
        return stage.default_budget_s


# ---- the pipeline ---------------------------------------------------------------------------
@dataclass
class Progress:
    """How far this run got, for whoever has to end it early (a fault, the watchdog): which
    step was running, where the spool is, and whether a drain verdict is already in hand."""

    stage: Stage
    started: float
    job_id: str | None
    step: str = "start"
    cfg: Config | None = None
    node: str | None = None
    sdir: Path | None = None
    verdict: Verdict | None = None
    spooled: bool = False
    acted: bool = False

    @property
    def unacted_drain(self) -> bool:
        """A drain verdict is in hand, not yet carried out, and actions are on."""
        return bool(self.verdict is not None and self.verdict.drains and not self.acted
                    and self.cfg is not None and self.cfg.get("actions.enabled", True))

    def safe_exit(self) -> int:
        """0 (let the job run, leave the node alone) unless this is a prolog with an unacted
        drain verdict: then the drain code, so slurmd drains the node and requeues the job,
        which is what the verdict asked for."""
        return drain_exit() if self.unacted_drain and self.stage.name == "prolog" else 0


def run_stage(name: str, *, slurm_factory=_default_slurm) -> int:
    """One run of an entry point. Whatever goes wrong inside (a broken state dir, a bug, a hang)
    ends in one line on stderr and syslog, a checker_error heartbeat where the disk allows, and
    a safe exit code: the checker's own fault never fails a job or drains a node."""
    stage = STAGES[name]
    run = Progress(stage, time.monotonic(), _job_id())
    # Armed before the config is read: a config on a hung mount cannot hold the prolog either.
    watchdog = Watchdog(run, stage.default_budget_s + 2.0)
    try:
        return _run(run, watchdog, slurm_factory)
    except Exception as exc:  # noqa: BLE001 - the contract: a checker fault is not a node fault
        return _checker_fault(run, exc)
    finally:
        watchdog.cancel()


def _run(run: Progress, watchdog: Watchdog, slurm_factory) -> int:
    global _syslog_on
    stage = run.stage
    root = node_root()
    run.step = "config"
    try:
        base = load_config()
    except ConfigError as exc:
        return _broken_config(run, root, exc)
    _syslog_on = bool(base.get("node.syslog", True))
    cfg, node = resolve_node_config(base, partition=os.environ.get("SLURM_JOB_PARTITION"))
    run.cfg, run.node = cfg, node
    sdir = run.sdir = state_dir(cfg, root)
    budget = _budget(cfg, stage)
    watchdog.rearm(budget + 2.0)
    ctx = Context(stage, cfg, root, node, sdir, run.started, run.started + budget, run.job_id,
                  slurm_factory)
    run.step = "lock"
    try:
        timeout = min(float(cfg.get("slurm.lock_timeout_s", 20)), budget / 3)
        with node_lock(sdir, timeout):
            return _judge(ctx, run)
    except LockTimeout as exc:
        # Whatever holds it (a run stuck in the kernel, a probe of an older release), the node
        # is still judged: read-only, so the events stay for the lock's holder to consume.
        log(f"{stage.name}: {exc}; judging without it (no cursor or baseline moved)")
        return _judge(ctx, run, lock_held=str(exc))


def _checker_fault(run: Progress, exc: BaseException) -> int:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "rsc_health" in f.filename] or frames
    where = f" at {Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else ""
    code = run.safe_exit()
    detail = f"{type(exc).__name__}: {exc}"[:300]
    _keep_unacted_verdict(run)
    finding = _fault(run, "checker_fault", f"checker fault during {run.step}: {detail}")
    unspooled = _say_fault(run, finding)
    log(f"{run.stage.name}: checker fault during {run.step}{where}: {detail}; exiting {code}"
        + (f" (not spooled: {unspooled})" if unspooled else ""))
    return code


def _say_fault(run: Progress, finding: Finding) -> str | None:
    """A run ended early (a checker fault, the watchdog) says so where a working run would:
    the spool (a checker record and heartbeat) and the textfile, else the textfile goes on
    showing the last good run's verdict. Returns why it could not be spooled, or None."""
    unspooled = _spool_fault(run, finding)
    if run.cfg is not None and run.node is not None and run.step != "textfile":
        try:
            _write_textfile(run.cfg, node_root(), run.node, run.stage, Level.CHECKER_ERROR,
                            [finding], time.monotonic() - run.started,
                            pending=run.unacted_drain, families=set())
        except Exception:  # noqa: BLE001 - said in the log and the spool
            pass
    return unspooled


def _keep_unacted_verdict(run: Progress) -> None:
    if run.unacted_drain and run.sdir is not None:
        save_pending(run.sdir, run.verdict, why="fault")


def _fault(run: Progress, code: str, reason: str) -> Finding:
    return Finding("checker", run.step, Status.ERROR, Severity.NONE, reason[:500], code)


def _spool_fault(run: Progress, finding: Finding) -> str | None:
    """A checker record, and a checker_error heartbeat unless this run already spooled one, so
    the historian sees a node that could not look rather than a silent one. Returns why it
    could not be spooled, or None."""
    if run.sdir is None or run.node is None:
        return "no state dir yet"
    now = utcnow()
    records = spool.check_records([finding], node=run.node, source=run.stage.name, time=now,
                                  job_id=run.job_id)
    if not run.spooled:
        records.append(_heartbeat(run.stage, run.node, now, Level.CHECKER_ERROR, [finding],
                                  time.monotonic() - run.started))
    try:
        spool.append(run.sdir / "spool", records)
    except OSError as err:
        return str(err)
    run.spooled = True
    return None


class Watchdog:
    """Past the budget, whatever is stuck (a probe that ignored its deadline, a Slurm call, a
    config on a hung mount), the process leaves with the safe exit code: it names the step,
    spools a checker_error heartbeat and writes the textfile (bounded by a one-second
    backstop, since the spool's disk may be what hangs) and calls os._exit, so no stuck thread
    or child can hold the exit."""

    BACKSTOP_S = 1.0

    def __init__(self, run: Progress, after_s: float):
        self.run = run
        self._timer: threading.Timer | None = None
        self.rearm(after_s)

    def rearm(self, after_s: float) -> None:
        self.cancel()
        self.after_s = after_s
        self._timer = threading.Timer(after_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        run = self.run
        code = run.safe_exit()
        backstop = threading.Timer(self.BACKSTOP_S, os._exit, (code,))
        backstop.daemon = True
        backstop.start()
        try:
            # A Slurm command or site check still running is killed with its process group
            # (imported only if something started one): os._exit leaves them running.
            procs = sys.modules.get("rsc_health.collect.procs")
            if procs is not None:
                procs.kill_live_groups()
            log(f"{run.stage.name}: still running after {self.after_s:.0f}s during {run.step} "
                f"(budget exceeded; a source or a Slurm call hung); exiting {code}")
            _keep_unacted_verdict(run)
            unspooled = _say_fault(run, _fault(
                run, "checker_timeout",
                f"{run.stage.name} hung during {run.step} past {self.after_s:.0f}s"))
            if unspooled:
                log(f"{run.stage.name}: not spooled: {unspooled}")
        finally:
            os._exit(code)


def _broken_config(run: Progress, root: Path, exc: ConfigError) -> int:
    """The checker cannot look: say so loudly (stderr, syslog, spool, textfile), let the job
    run, unless a drain verdict from before is pending (see the module's exit codes). The
    packaged defaults still say where the spool and that verdict are; the textfile goes where
    the last good config put it (config.fallback_config)."""
    stage = run.stage
    try:
        defaults, which = fallback_config(root)
    except ConfigError:
        log(f"{stage.name}: bad config: {exc}")
        return 0
    log(f"{stage.name}: bad config: {exc} (spool and textfile where {which} say)")
    run.node, run.sdir = node_name(defaults), state_dir(defaults, root)
    finding = _fault(run, "config_error", f"bad config: {exc}")
    unspooled = _spool_fault(run, finding)
    if unspooled:
        log(f"{stage.name}: cannot write the spool: {unspooled}")
    pending = load_pending(run.sdir) if stage.name == "prolog" else None
    held = pending is not None and pending.verdict.drains and pending.why != "guard"
    _write_textfile(defaults, root, run.node, stage, Level.CHECKER_ERROR, [finding],
                    time.monotonic() - run.started, pending=held, families=set(),
                    spool_bytes=spool.size_bytes(run.sdir / "spool"))
    if held:
        # A drain verdict from before the config broke (Slurm was away, or a fault struck):
        # a working config would fail this job start, so does a broken one. One held back by
        # the mass-drain guard lets jobs run, as it would with a working config.
        codes = ", ".join(sorted({c.code or c.family for c in pending.verdict.causes}))
        log(f"{stage.name}: a drain verdict is pending ({codes}; {pending.why}); failing the "
            f"job start so slurmd drains the node. Fix the config to carry it out ourselves")
        return drain_exit()
    return 0


def _judge(ctx: Context, run: Progress, lock_held: str | None = None) -> int:
    """Look, spool, remember, act. Under the node lock, or (lock_held: why it could not be
    taken) without it: then read-only, as `healthctl check` is: the XID cursor and counter
    baselines are not moved and no clean sweep counts towards a resume, but the kernel log, the
    probes and the pending verdict are judged and acted on (an XID 79 still fails the job)."""
    from rsc_health import engine

    stage, cfg = ctx.stage, ctx.cfg
    families = cfg.get(stage.families_key) if stage.families_key else None
    if stage.name == "prolog" and cfg.get("qualify.prolog_lite_min_nodes"):
        families, cfg = prolog_lite(cfg, families, os.environ)
    remaining = ctx.deadline - time.monotonic()
    run.step = "checks"
    # Checks get at most half of what is left; Slurm calls get the rest.
    findings, commit = engine.run_deferred(
        cfg, ctx.root, only=set(families) if families else None,
        budget_s=max(1.0, remaining * 0.5), sweep=stage.name == "sweep",
    )
    if lock_held:
        findings.append(Finding("checker", LOCK_FILE, Status.ERROR, Severity.NONE,
                                f"{lock_held}: judged without it, read-only", "lock_held"))
    run.step = "verdict"
    pending = load_pending(ctx.sdir)
    fresh = decide(findings)
    verdict = decide(findings + list(pending.verdict.causes)) if pending else fresh
    run.verdict = verdict
    now = utcnow()
    run.step = "spool"
    records = spool.check_records(findings, node=ctx.node, source=stage.name, time=now,
                                  job_id=ctx.job_id)
    records.extend(_job_records(ctx, now))
    records.append(_heartbeat(stage, ctx.node, now, verdict.level, findings,
                              time.monotonic() - ctx.started))
    records, spool_bytes = _within_spool_cap(ctx, records)
    run.spooled = _spool(ctx.sdir, records)
    if run.spooled and not lock_held:
        # Only now is it safe to consume the events: they are on disk. When the spool is not
        # writable the next run reads them again, under the same record ids.
        run.step = "state"
        unsaved = commit()
        for f in unsaved:
            log(f"{stage.name}: {f.reason}")
        if unsaved:
            # The next run will see these events again (same record ids, so the historian
            # keeps one copy); the operator must see that the state dir refuses writes.
            _spool(ctx.sdir, spool.check_records(unsaved, node=ctx.node, source=stage.name,
                                                 time=now, job_id=ctx.job_id))
            findings = findings + unsaved
    run.step = "act"
    if pending and _guard_backs_off(cfg, stage, pending, fresh, now):
        # The mass-drain guard (something is wrong fleet-wide) or someone else's drain held
        # this verdict back. Each try reads the whole node table from slurmctld (about 25 ms
        # of its time at 16,000 nodes), and every held node would try on every sweep and job
        # start, for as long as the outage or the maintenance lasts. Nothing new since: no
        # Slurm call until the backoff (jittered, doubling) runs out.
        code, still_pending = 0, True
        if pending.retry_after is not None and stage.name != "prolog":
            log(f"{stage.name}: {HELD_BY[pending.why]} held {verdict.reason} "
                f"{pending.holds} time(s); next try after {pending.retry_after:%H:%M:%S}Z")
    else:
        code, still_pending = _act(ctx, verdict, pending, locked=not lock_held)
    run.acted = True
    run.step = "textfile"
    _write_textfile(cfg, ctx.root, ctx.node, stage, verdict.level, findings,
                    time.monotonic() - ctx.started, pending=still_pending,
                    spool_bytes=spool_bytes, families=set(families) if families else None)
    _remember_config(cfg, ctx.sdir)
    return code


def _remember_config(cfg: Config, sdir: Path) -> None:
    """What a broken config push falls back on (config.fallback_config)."""
    from rsc_health.config import remember_good

    try:
        remember_good(cfg, sdir)
    except OSError as exc:
        log(f"cannot remember the config's textfile dir and historian ({exc})")


def job_nodes(env) -> int:
    """The job's node count from the prolog's environment (SLURM_JOB_NUM_NODES, SLURM_NNODES,
    else SLURM_JOB_NODELIST counted without expanding it); 0 when none says. No Slurm RPC."""
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        text = (env.get(key) or "").strip()
        if text.isdigit() and len(text) < 10:
            return int(text)
    from rsc_health.hostlist import HostlistError, count

    try:
        return count((env.get("SLURM_JOB_NODELIST") or "")[:65536])
    except HostlistError:
        return 0


def lite_diag_level(cfg: Config) -> int:
    """The DCGM diagnostic level of the [qualify] lite tier: the highest `-r N` among its tests
    with the dcgm_diag plug-in (their verdict is DCGM's own, node-local; a test judged against
    peers needs the historian and is not run in a prolog). 0: none."""
    tests = cfg.get("qualify.tests") or {}
    level = 0
    for name in cfg.get("qualify.lite") or []:
        spec = tests.get(name) if isinstance(tests, dict) else None
        if not isinstance(spec, dict) or spec.get("plugin") != "dcgm_diag":
            continue
        argv = [str(a) for a in spec.get("command") or []]
        for flag, value in zip(argv, argv[1:]):
            if flag in ("-r", "--run") and value.isdigit():
                level = max(level, min(int(value), 4))
    return level


def prolog_lite(cfg: Config, families, env):
    """The lite tier in the prolog of a job of [qualify] prolog_lite_min_nodes nodes or more:
    the dcgm family with DCGM's diagnostic at the lite tier's level, bounded as every check
    is (by the prolog's budget). A DCGM Fail drains the node (the job starts elsewhere); a
    diagnostic that could not run is a checker error, never a drain. Smaller jobs: nothing."""
    least = int(cfg.get("qualify.prolog_lite_min_nodes"))
    level = lite_diag_level(cfg) if least > 0 and job_nodes(env) >= least else 0
    if level <= 0:
        return families, cfg
    import copy

    data = copy.deepcopy(cfg.data)
    dcgm = data.setdefault("dcgm", {})
    dcgm.update(enabled=True, diag_level=max(level, int(cfg.get("dcgm.diag_level"))))
    dcgm.update(timeout_s=min(float(cfg.get("dcgm.timeout_s")),
                              float(cfg.get("qualify.prolog_lite_timeout_s"))))
    only = list(families) if families else None
    if only is not None and "dcgm" not in only:
        only.append("dcgm")
    return only, Config(data, cfg.path, cfg.overrides)


def _job_records(ctx: Context, now) -> list[dict]:
    """job_start / job_end. ExcNodeList costs a Slurm RPC, so it is read only when the lemon
    feature wants it and only on the allocation's first node: one call per job, not per node."""
    if not ctx.job_id:
        return []
    if ctx.stage.name == "epilog":
        return [spool.record("job_end", ctx.node, now, job_id=ctx.job_id)]
    if ctx.stage.name != "prolog":
        return []
    excluded: list[str] = []
    if ctx.cfg.get("slurm.record_exclusions", False) and _first_node(ctx.node):
        from rsc_health.slurm.api import SlurmError

        try:
            job = ctx.slurm_factory(ctx.cfg, ctx.deadline).job(ctx.job_id)
            excluded = list(job.excluded) if job else []
        except SlurmError as exc:
            log(f"prolog: cannot read job {ctx.job_id}: {exc}")
    return [spool.record(
        "job_start", ctx.node, now, job_id=ctx.job_id, excluded=excluded,
        user=os.environ.get("SLURM_JOB_USER", ""),
        partition=os.environ.get("SLURM_JOB_PARTITION", ""),
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


# Why a pending verdict waits on a backoff (PendingVerdict.why), as the logs say it.
HELD_BY = {"guard": "mass-drain guard", "foreign_drain": "someone else's drain"}


def _guard_backs_off(cfg: Config, stage: Stage, pending: PendingVerdict, fresh: Verdict,
                     now: datetime) -> bool:
    """Leave Slurm alone for a verdict the guard or someone else's drain held? Only while
    nothing is new: a fault code the held verdict lacks, or a worse level, is tried at once.
    A job start never retries a guard-held one (the sweep does) and always retries one held
    under someone else's drain: a job starting here means that drain is most likely lifted,
    and the job must not run on the fault. A sweep or epilog retries once the backoff has run
    out, or at once when the wait left is longer than any backoff (the clock stepped back)."""
    if pending.why not in HELD_BY or not cfg.get("actions.enabled", True):
        return False  # shadow mode asks Slurm nothing anyway: it records would_drain
    held = {c.code or c.family for c in pending.verdict.causes}
    new = {c.code or c.family for c in fresh.causes if fresh.drains} - held
    if new or fresh.level > pending.verdict.level:
        return False
    if stage.name == "prolog":
        return pending.why == "guard"
    longest = timedelta(minutes=1.5 * _guard_retry_minutes(cfg)[1])
    return pending.retry_after is not None and now < pending.retry_after <= now + longest


def _guard_retry_minutes(cfg: Config) -> tuple[float, float]:
    """[actions] guard_retry_min and guard_retry_max_min: the first backoff and the longest."""
    return (float(cfg.get("actions.guard_retry_min", 5.0)),
            float(cfg.get("actions.guard_retry_max_min", 60.0)))


def guard_retry_after(cfg: Config, holds: int, now: datetime,
                      rand: Callable[[], float] | None = None) -> datetime:
    """When a verdict the guard has held `holds` times is next tried: [actions]
    guard_retry_min doubling per hold up to guard_retry_max_min, times 0.5-1.5 at random so a
    fleet's held nodes do not all come back in the same minute."""
    import random

    first, most = _guard_retry_minutes(cfg)
    minutes = min(most, first * 2 ** min(holds - 1, 16))
    return now + timedelta(minutes=minutes * (0.5 + (rand or random.random)()))


def _act(ctx: Context, verdict: Verdict, pending: PendingVerdict | None, *,
         locked: bool = True) -> tuple[int, bool]:
    """Carry out the verdict in Slurm; (exit code, verdict still pending). A run without the
    node lock carries out a drain, but its clean verdict does not count towards a resume."""
    stage, cfg = ctx.stage, ctx.cfg
    had_pending = pending is not None
    enabled = bool(cfg.get("actions.enabled", True))
    if not enabled and verdict.drains:
        # Shadow mode: record what would have been drained, ask Slurm nothing, fail no job.
        from rsc_health.actions import Actor

        Actor(None, cfg, ctx.node, ctx.sdir, log=log).apply(verdict)
        log(f"{stage.name}: shadow mode, would drain: {verdict.reason}")
        return 0, False
    if not verdict.drains:
        if not (stage.counts_as_clean and locked and verdict.level in (Level.OK, Level.WARN)):
            return 0, had_pending
        if not _has_drain_state(ctx.sdir):
            # A clean sweep only talks to Slurm to count towards resuming a node we drained:
            # with no drain of ours on record, 16,000 nodes' sweeps cost slurmctld nothing.
            _sweep_line(ctx, verdict, [])
            return 0, had_pending
    # Imported only past this point: a healthy prolog neither calls nor loads the Slurm side.
    from rsc_health.actions import Actor
    from rsc_health.slurm.api import SlurmError

    skip = {ctx.job_id} if (ctx.job_id and stage.name == "epilog") else None
    slurm = ctx.slurm_factory(cfg, ctx.deadline)
    try:
        actor = Actor(slurm, cfg, ctx.node, ctx.sdir, log=log)
        actions = actor.apply(verdict, requeue=stage.requeue,
                              clean_sweep=stage.counts_as_clean and not had_pending,
                              skip_jobs=skip)
    except SlurmError as exc:
        if verdict.drains:
            save_pending(ctx.sdir, verdict, why="slurm_unavailable")
            log(f"{stage.name}: Slurm unavailable ({exc}); verdict {verdict.level.name} kept "
                f"for the next run")
            # The prolog still fails the job start: slurmd then drains the node itself.
            return (drain_exit() if stage.name == "prolog" and enabled else 0), True
        log(f"{stage.name}: Slurm unavailable ({exc})")
        return 0, had_pending
    held = next((a.action for a in actions if a.action in HELD_KINDS), None)
    if verdict.drains and held:
        why = "guard" if held == ActionKind.GUARD_TRIPPED else "foreign_drain"
        holds = (pending.holds if pending is not None and pending.why == why else 0) + 1
        retry = guard_retry_after(cfg, holds, utcnow())
        save_pending(ctx.sdir, verdict, why=why, holds=holds, retry_after=retry)
        log(f"{stage.name}: {HELD_BY[why]} holds; verdict {verdict.reason} kept and retried "
            f"after {retry:%H:%M:%S}Z (held {holds} time(s))")
        # A job start under someone else's drain (its allocation came before that drain):
        # the job must not run on the fault. Under the guard, jobs run, as the guard wants.
        foreign = why == "foreign_drain" and stage.name == "prolog"
        return (drain_exit() if foreign else 0), True
    clear_pending(ctx.sdir)
    _sweep_line(ctx, verdict, actions)
    if stage.name == "prolog" and verdict.drains and enabled:
        log(f"prolog: {verdict.reason}")
        return drain_exit(), False
    return 0, False


def _sweep_line(ctx: Context, verdict: Verdict, actions: list) -> None:
    """The sweep's one line on stdout (HealthCheckProgram's log, the timer's journal)."""
    if ctx.stage.name != "sweep":
        return
    summary = ", ".join(f"{a.action}{' ' + a.job_id if a.job_id else ''}" for a in actions)
    print(f"rsc_health sweep {ctx.node}: {verdict.level.name} {verdict.reason} "
          f"{summary}".rstrip())


def _has_drain_state(sdir: Path) -> bool:
    from rsc_health.actions import DRAIN_STATE_FILE

    try:
        return (sdir / DRAIN_STATE_FILE).exists()
    except OSError:
        return True  # cannot tell: ask Slurm, as before


def _within_spool_cap(ctx: Context, records: list[dict]) -> tuple[list[dict], int]:
    """(records to spool, bytes the spool holds). Past [node] spool_max_mb (the historian has
    not taken the spool for a long time) only the records that carry news are kept: a fault is
    never dropped, /var never fills."""
    try:
        cap = float(ctx.cfg.get("node.spool_max_mb", 64)) * 1024 * 1024
    except (TypeError, ValueError):
        cap = 64 * 1024 * 1024
    held = spool.size_bytes(ctx.sdir / "spool")
    if held < cap:
        return records, held
    kept = [r for r in records if spool.carries_news(r)]
    log(f"{ctx.stage.name}: spool holds {held / 1048576:.0f} MB, over [node] spool_max_mb "
        f"(is spool flush failing?): spooling {len(kept)} of {len(records)} records, "
        f"all-clear rows and heartbeat dropped")
    return kept, held


# ---- sinks ----------------------------------------------------------------------------------
def _spool(sdir: Path, records: list[dict]) -> bool:
    try:
        spool.append(sdir / "spool", records)
        return True
    except OSError as exc:
        log(f"cannot write the spool ({exc}); node state kept, so the next run reads the same "
            f"events again")
        return False


def _family_status(findings: list[Finding]) -> dict[str, str]:
    order = {Status.OK: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3}
    worst: dict[str, Status] = {}
    for f in findings:
        if f.family not in worst or order[f.status] > order[worst[f.family]]:
            worst[f.family] = f.status
    return {k: v.value for k, v in sorted(worst.items())}


def _hung_probes(findings: list[Finding]) -> dict[str, str]:
    """{probe: since when it hangs} for the probes this run found hung (collect.hangs)."""
    return {str(f.data["probe"]): str(f.data["since"]) for f in findings
            if f.code in HUNG_CODES and isinstance(f.data, dict)
            and "probe" in f.data and "since" in f.data}


def _heartbeat(stage: Stage, node: str, now, level: Level, findings: list[Finding],
               duration_s: float) -> dict:
    hung = _hung_probes(findings)
    gpus = _gpu_bus_ids(findings)
    return spool.record(
        "heartbeat", node, now, source=stage.name, level=level.name.lower(),
        checker_errors=sum(f.status is Status.ERROR for f in findings),
        duration_s=round(duration_s, 3), families=_family_status(findings), version=VERSION,
        **({"hung": hung} if hung else {}), **({"gpus": gpus} if gpus else {}),
    )


def _gpu_bus_ids(findings: list[Finding]) -> dict[str, str]:
    """{"1": "00000000:1A:00.0"}: the bus id of each GPU index NVML answered for this run
    (the gpu family's per-GPU findings carry it), so the historian names a GPU one way
    (rsc_health.gpuname) whichever half a finding knew."""
    out: dict[str, str] = {}
    for f in findings:
        # checks.gpu names each GPU gpu_name(index) = "gpuN" (parsed here rather than by
        # rsc_health.gpuname: one module less on every job start).
        if (f.family == "gpu" and isinstance(f.data, dict) and f.data.get("bus_id")
                and f.component.startswith("gpu") and f.component[3:].isdigit()):
            out[f.component[3:]] = str(f.data["bus_id"])[:32]
    return out


STATUS_VALUE = {"ok": 0, "warn": 1, "fail": 2, "error": 3}


def _write_textfile(cfg: Config, root: Path, node: str, stage: Stage, level: Level,
                    findings: list[Finding], duration_s: float, *, pending: bool,
                    spool_bytes: int | None = None, families: set[str] | None = None) -> None:
    """node_exporter textfile collector: the latest run per entry point, written atomically
    (durable.write_atomic: a scrape never reads half a file, nothing planted in the directory
    is followed, a directory others may write without the sticky bit is refused).

    Every line is this run's or still the latest word: each entry point's own lines come from
    its latest run, and a check family's line from the latest run that looked at it
    (`families`, None for all of them; one it looked at and heard nothing from is dropped).
    Checker errors (family "checker") are said by every run: 3, or 0 once they are gone."""
    directory = str(cfg.get("node.textfile_dir", "") or "")
    if not directory:
        return
    path = root / directory.lstrip("/") / TEXTFILE
    try:
        from rsc_health.checks import FAMILIES

        now = time.time()
        samples = {
            f'rsc_health_last_run_timestamp_seconds{{source="{stage.name}"}}': f"{now:.3f}",
            f'rsc_health_run_duration_seconds{{source="{stage.name}"}}': f"{duration_s:.3f}",
            f'rsc_health_verdict_level{{source="{stage.name}"}}': str(int(level)),
            f'rsc_health_checker_errors{{source="{stage.name}"}}':
                str(sum(f.status is Status.ERROR for f in findings)),
        }
        samples["rsc_health_pending_drain"] = "1" if pending else "0"
        if spool_bytes is not None:
            samples["rsc_health_spool_bytes"] = str(spool_bytes)
        for family, status in {"checker": "ok", **_family_status(findings)}.items():
            samples[_family_key(family)] = str(STATUS_VALUE[status])
        hung_key = f'rsc_health_probe_hung_since_seconds{{source="{stage.name}",probe='
        for probe, since in _hung_probes(findings).items():
            try:
                samples[f'{hung_key}"{_label(probe)}"}}'] = (
                    f"{datetime.fromisoformat(since).timestamp():.0f}")
            except ValueError:
                continue
        unlooked = set() if families is None else set(FAMILIES) - families
        still = {_family_key(f) for f in unlooked}
        others = tuple(f'source="{other}"' for other in STAGES if other != stage.name)
        kept = {k: v for k, v in _read_samples(path).items()
                if k in still or k.partition("{")[2].startswith(others)}
        write_atomic(path, _exposition({**kept, **samples}, node), sync_dir=False)
    except OSError as exc:
        log(f"cannot write the textfile {path}: {exc}")


HELP = {
    "rsc_health_verdict_level": "Verdict of the latest run: 0 ok, 1 warn, 2 drain after job, "
                                "3 drain now, 4 checker error.",
    "rsc_health_family_status": "Worst status of a check family in the latest run: 0 ok, "
                                "1 warn, 2 fail, 3 checker error.",
    "rsc_health_last_run_timestamp_seconds": "When the entry point last ran (Unix time).",
    "rsc_health_run_duration_seconds": "How long the entry point's latest run took.",
    "rsc_health_checker_errors": "Findings the checker could not look at in the latest run.",
    "rsc_health_pending_drain": "1 while a drain verdict waits (Slurm away, the guard, or "
                                "someone else's drain).",
    "rsc_health_spool_bytes": "Bytes in the node's spool not yet delivered to the historian.",
    "rsc_health_probe_hung_since_seconds": "Since when (Unix time) a probe (a mount's statvfs, "
                                           "NVML) has not answered, per probe still hanging.",
}


def _family_key(family: str) -> str:
    return f'rsc_health_family_status{{family="{_label(family)}"}}'


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _exposition(samples: dict[str, str], node: str) -> str:
    lines = []
    for metric in HELP:
        mine = sorted(k for k in samples if k == metric or k.startswith(metric + "{"))
        if not mine:
            continue
        lines.append(f"# HELP {metric} {HELP[metric]}")
        lines.append(f"# TYPE {metric} gauge")
        lines.extend(f"{k} {samples[k]}" for k in mine)
    return "\n".join(lines) + "\n"


def _read_samples(path: Path) -> dict[str, str]:
    """The previous textfile's samples, if it is a file of ours (a symlink planted at its name
    is not followed, a FIFO not waited on, a file someone else made not believed)."""
    try:
        with open(open_regular(path), "rb") as fh:
            if os.fstat(fh.fileno()).st_uid != os.geteuid():
                return {}
            text = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and " " in line:
            key, _, value = line.rpartition(" ")
            out[key] = value
    return out


# ---- pending verdicts -----------------------------------------------------------------------
def save_pending(sdir: Path, verdict: Verdict, *, why: str, holds: int = 0,
                 retry_after: datetime | None = None) -> None:
    data = {"level": int(verdict.level), "why": why,
            "causes": [c.to_dict() for c in verdict.causes], "time": utcnow().isoformat()}
    if holds:
        data.update(holds=holds, retry_after=retry_after.isoformat() if retry_after else None)
    try:
        # Its bytes and its name fsync'd: a power cut must not take the one memory of a drain
        # verdict whose XID left with the old boot's ring buffer.
        write_atomic(sdir / PENDING_VERDICT_FILE, json.dumps(data))
    except OSError as exc:
        log(f"cannot save the pending verdict ({exc}); the next run decides afresh")


@dataclass(frozen=True)
class PendingVerdict:
    verdict: Verdict
    why: str  # slurm_unavailable | guard | foreign_drain | fault
    holds: int = 0  # how many runs in a row the mass-drain guard has held it back
    retry_after: datetime | None = None  # aware; no Slurm call for it before then


def _aware_time(value) -> datetime | None:
    """A stored ISO time, aware; None for anything else (an old file, a hand edit)."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def load_pending(sdir: Path) -> PendingVerdict | None:
    try:
        data = json.loads(read_bounded(sdir / PENDING_VERDICT_FILE))
        causes = tuple(Finding.from_dict(c) for c in data["causes"])
        for c in causes:
            # JSON of the wrong types (a number or null where text belongs) would fail the
            # verdict step of every later run, before anything is spooled.
            if not all(isinstance(v, str) for v in (c.family, c.component, c.reason, c.code)):
                raise TypeError(f"cause {c.family!r}/{c.component!r} is not all text")
        holds = data.get("holds", 0)
        holds = holds if isinstance(holds, int) and not isinstance(holds, bool) else 0
        return PendingVerdict(Verdict(Level(data["level"]), "", causes), str(data.get("why", "")),
                              max(0, min(holds, 64)), _aware_time(data.get("retry_after")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log(f"corrupt {PENDING_VERDICT_FILE} discarded: {exc}")
        clear_pending(sdir)
        return None


def clear_pending(sdir: Path) -> None:
    try:
        remove(sdir / PENDING_VERDICT_FILE)  # for good: not drained again after a power cut
    except OSError:
        pass


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


if __name__ == "__main__":
    sys.exit(main())
