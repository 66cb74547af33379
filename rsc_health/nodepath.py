"""The node path: what Slurm runs on the compute node (prolog, epilog, periodic sweep).

    python -m rsc_health.nodepath prolog|epilog|sweep

Standard library only (no click): the prolog is part of every job's start-up. Each entry point
takes the per-node lock so a sweep and a prolog never act over each other, runs the node
engine, spools what it saw and did, and turns the verdict into Slurm actions.

Environment: SLURMD_NODENAME (else [slurm] node_name, else the short hostname),
RSC_HEALTH_ROOT (the node's root, "/" in production), RSC_HEALTH_CONFIG (the site config),
SLURM_JOB_ID / SLURM_JOB_USER / SLURM_JOB_PARTITION (set by slurmd for prolog and epilog).

Exit codes: the prolog exits 1 on a drain verdict (after setting the specific reason) so slurmd
drains the node and requeues the job elsewhere; otherwise 0. The epilog and the sweep exit 0
unless they crash: Slurm does not need their verdict, only the actions they take.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rsc_health import spool
from rsc_health.config import Config, ConfigError, load_config, node_root, state_dir
from rsc_health.model import Finding, Level, Verdict, utcnow
from rsc_health.policy import decide

if TYPE_CHECKING:
    from collections.abc import Callable


LOCK_FILE = "node.lock"
# A drain verdict the sweep could not hand to Slurm (controller away): acted on next sweep,
# because the engine has already consumed the events (XID cursor) that produced it.
PENDING_VERDICT_FILE = "pending_verdict.json"


class LockTimeout(Exception):
    pass


def log(msg: str) -> None:
    print(f"rsc_health: {msg}", file=sys.stderr, flush=True)


def node_name(cfg: Config) -> str:
    return (
        os.environ.get("SLURMD_NODENAME")
        or cfg.get("slurm.node_name", "")
        or socket.gethostname().split(".")[0]
    )


@contextmanager
def node_lock(sdir: Path, timeout_s: float):
    """flock on <state_dir>/node.lock; polls so the wait is bounded by our budget."""
    sdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(sdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
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


def _slurm(cfg: Config, deadline: float | None = None):
    from rsc_health.slurm import from_config

    backend = from_config(cfg)
    backend.deadline = deadline
    return backend


def _actor(cfg: Config, node: str, sdir: Path, slurm):
    from rsc_health.actions import Actor

    return Actor(slurm, cfg, node, sdir, log=log)


def _spool(sdir: Path, records: list[dict]) -> None:
    try:
        spool.append(sdir / "spool", records)
    except OSError as exc:
        log(f"cannot write the spool: {exc}")


def _run_engine(cfg: Config, root: Path, only, budget_s: float | None = None) -> list[Finding]:
    from rsc_health import engine

    families = set(only) if only else None
    return engine.run(cfg, root, only=families, budget_s=budget_s)


def _setup() -> tuple[Config, Path, str, Path]:
    cfg0 = load_config()
    root = node_root()
    node = node_name(cfg0)
    cfg = cfg0.for_node(node, os.environ.get("SLURM_JOB_PARTITION") or None)
    return cfg, root, node, state_dir(cfg, root)


# ---- the three entry points ---------------------------------------------------------------
def _locked(
    what: str,
    body: Callable[[Config, Path, str, Path], int],
    *,
    lock_note: str = "",
    lock_cap: Callable[[Config], float] | None = None,
) -> int:
    """Set up, take the node lock, run body(cfg, root, node, state_dir).

    The two ways the checker itself can be stuck (a config it cannot read, a lock it cannot get
    in time) exit 0 with a log line: a stuck checker must never fail a job or drain a node.
    """
    try:
        cfg, root, node, sdir = _setup()
    except ConfigError as exc:
        log(f"{what}: bad config{lock_note}: {exc}")
        return 0
    timeout = float(cfg.get("slurm.lock_timeout_s", 20))
    if lock_cap is not None:
        timeout = min(timeout, lock_cap(cfg))
    try:
        with node_lock(sdir, timeout):
            return body(cfg, root, node, sdir)
    except LockTimeout as exc:
        log(f"{what}: {exc}{lock_note}")
        return 0


def _job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")


# ---- prolog ----------------------------------------------------------------------------------
def prolog() -> int:
    job_id = _job_id()
    return _locked(
        "prolog",
        lambda cfg, root, node, sdir: _prolog(cfg, root, node, sdir, job_id),
        lock_note="; letting the job run",
    )


def _prolog(cfg: Config, root: Path, node: str, sdir: Path, job_id: str | None) -> int:
    from rsc_health.slurm.api import SlurmError

    findings = _run_engine(cfg, root, cfg.get("slurm.prolog_families"))
    verdict = decide(findings)
    now = utcnow()
    records = spool.check_records(findings, node=node, source="prolog", time=now, job_id=job_id)
    slurm = _slurm(cfg)
    excluded: list[str] = []
    if job_id:
        try:
            job = slurm.job(job_id)
            excluded = list(job.excluded) if job else []
        except SlurmError as exc:
            log(f"prolog: cannot read job {job_id}: {exc}")
        records.append(spool.record(
            "job_start", node, now, job_id=job_id, excluded=excluded,
            user=os.environ.get("SLURM_JOB_USER", ""),
            partition=os.environ.get("SLURM_JOB_PARTITION", ""),
        ))
    _spool(sdir, records)
    if not verdict.drains:
        return 0
    try:
        actions = _actor(cfg, node, sdir, slurm).apply(verdict, requeue=False)
    except SlurmError as exc:
        # Failing still drains the node ("Prolog error") and requeues the job: the safe side.
        log(f"prolog: could not set the reason ({exc}); failing the job start anyway")
        return 1
    if any(a.action == "guard_tripped" for a in actions):
        log(f"prolog: guard tripped, letting job {job_id} run despite: {verdict.reason}")
        return 0
    if not cfg.get("actions.enabled", True):
        return 0
    log(f"prolog: {verdict.reason}")
    return 1


# ---- epilog ----------------------------------------------------------------------------------
def epilog() -> int:
    job_id = _job_id()
    return _locked("epilog", lambda cfg, root, node, sdir: _epilog(cfg, root, node, sdir, job_id))


def _epilog(cfg: Config, root: Path, node: str, sdir: Path, job_id: str | None) -> int:
    from rsc_health.slurm.api import SlurmError

    findings = _run_engine(cfg, root, cfg.get("slurm.epilog_families"))
    verdict = decide(findings)
    now = utcnow()
    records = spool.check_records(findings, node=node, source="epilog", time=now, job_id=job_id)
    if job_id:
        records.append(spool.record("job_end", node, now, job_id=job_id))
    _spool(sdir, records)
    if verdict.drains:
        try:
            _actor(cfg, node, sdir, _slurm(cfg)).apply(
                verdict, skip_jobs={job_id} if job_id else None
            )
        except SlurmError as exc:
            _save_pending(sdir, verdict)
            log(f"epilog: Slurm unavailable ({exc}); the next sweep will act")
    return 0


# ---- sweep -----------------------------------------------------------------------------------
def sweep() -> int:
    started = time.monotonic()  # the budget counts from here: config and lock included

    def budget(cfg: Config) -> float:
        return float(cfg.get("slurm.sweep_budget_s", 45))

    return _locked(
        "sweep",
        lambda cfg, root, node, sdir: _sweep(cfg, root, node, sdir, started + budget(cfg)),
        lock_note="; skipping this sweep",
        lock_cap=lambda cfg: budget(cfg) / 3,
    )


def _sweep(cfg: Config, root: Path, node: str, sdir: Path, deadline: float) -> int:
    from rsc_health.slurm.api import SlurmError

    remaining = deadline - time.monotonic()
    # Checks get at most half of what is left; Slurm calls get the rest.
    findings = _run_engine(cfg, root, None, budget_s=max(1.0, remaining * 0.5))
    pending = _load_pending(sdir)
    verdict = decide(findings + list(pending.causes)) if pending else decide(findings)
    now = utcnow()
    _spool(sdir, spool.check_records(findings, node=node, source="sweep", time=now, job_id=None))
    slurm = _slurm(cfg, deadline=deadline)
    try:
        actions = _actor(cfg, node, sdir, slurm).apply(verdict, clean_sweep=not pending)
    except SlurmError as exc:
        if verdict.drains:
            _save_pending(sdir, verdict)
        log(f"sweep: Slurm unavailable ({exc}); verdict {verdict.level.name} kept for next sweep")
        return 0
    _clear_pending(sdir)
    summary = ", ".join(f"{a.action}{' ' + a.job_id if a.job_id else ''}" for a in actions)
    print(f"rsc_health sweep {node}: {verdict.level.name} {verdict.reason} {summary}".rstrip())
    return 0


def _save_pending(sdir: Path, verdict: Verdict) -> None:
    data = {"level": int(verdict.level), "causes": [c.to_dict() for c in verdict.causes]}
    sdir.mkdir(parents=True, exist_ok=True)
    (sdir / PENDING_VERDICT_FILE).write_text(json.dumps(data))


def _load_pending(sdir: Path) -> Verdict | None:
    try:
        data = json.loads((sdir / PENDING_VERDICT_FILE).read_text())
        causes = tuple(Finding.from_dict(c) for c in data["causes"])
        return Verdict(Level(data["level"]), "", causes)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _clear_pending(sdir: Path) -> None:
    (sdir / PENDING_VERDICT_FILE).unlink(missing_ok=True)


MAINS = {"prolog": prolog, "epilog": epilog, "sweep": sweep}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in MAINS:
        print("usage: python -m rsc_health.nodepath prolog|epilog|sweep", file=sys.stderr)
        return 2
    return MAINS[argv[0]]()


if __name__ == "__main__":
    sys.exit(main())
