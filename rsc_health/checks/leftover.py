"""Leftover GPU processes at job start: a compute process NVML sees on a GPU
(nvmlDeviceGetComputeRunningProcesses) that belongs to no running job of this node holds GPU
memory (and, in EXCLUSIVE_PROCESS mode, the GPU itself) that the next job needs: it OOMs or
fails to create its context minutes into its run. Found before the job starts, the prolog
fails, Slurm requeues the job elsewhere and the node drains until the process is gone.

Whose a process is, read without any Slurm RPC (the prolog makes none when healthy):
- its cgroup (/proc/PID/cgroup): Slurm's task/cgroup puts every task under `job_N` in its
  own hierarchy (v1 `/slurm/uid_U/job_N/step_S/...`, v2
  `/system.slice/slurmstepd.scope/job_N/...`), from the hierarchy's root or below a
  containerized slurmd's own cgroup; a `job_N` anywhere else, or below a user's
  `user@UID.service` (the subtree systemd delegates to them, where they can make one), is no
  job's;
- whether job N still runs here: slurmstepd listens on `<SlurmdSpoolDir>/<node>_<job>.<step>`
  (src/slurmd/common/stepd_api.c) while the step runs; no socket of job N = job N is over;
- the prolog's own job ($SLURM_JOB_ID) is not a leftover, unless the process is older than
  the prolog could make it (`[leftover] own_job_grace_s`, from /proc/PID/stat): a survivor of
  the job's earlier run here, requeued under the same id onto this node again.
A process in the cgroup of a job that is over is a leftover. One in no job cgroup (a user's
ssh session, a daemon, or any job's process under proctrack/linuxproc where tasks have no job
cgroup) is a leftover only when no other job runs here (the exclusive node at job start);
with other jobs running it cannot be told from theirs, and warns. A spool directory that
cannot be read is the checker's problem: nothing in a job cgroup is called a leftover then.

The finding names pid, command, user, GPU and memory. `[leftover] action` decides (default
drain_now: at job start nothing of ours is running, so "now" only fails the prolog, which
sends the job elsewhere). A sweep (no job of its own) that finds one while other jobs run
drains after them instead: "now" would requeue jobs for a process that is not theirs.
Everything under /proc is read bounded (read_bounded refuses a FIFO and stops at its limit);
user names come from the root's /etc/passwd only (an NSS lookup can block on a directory
server). `check --from` judges the record a snapshot carries.
"""

from __future__ import annotations

import os
import time

from rsc_health import lazyre
from rsc_health.checks._finding import checker_error, fail, gpu_name, ok, warn
from rsc_health.checks.env import replayed
from rsc_health.collect.gpu import err
from rsc_health.collect.sysfs import pure, read_bounded
from rsc_health.model import Finding, Severity

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

FAMILY = "leftover"
# Slurm's own job cgroups: cgroup v1 (task/cgroup) "/slurm/uid_U/job_N/..." ("/slurm_<node>/..."
# under multiple slurmd); cgroup v2 (22.05+) "/system.slice/slurmstepd.scope/job_N/..."
# ("<node>_slurmstepd.scope" likewise). Under a containerized slurmd the same forms come after
# the container's own cgroup (v2: cgroup_v2.c puts the scope under dirname(PID 1's cgroup),
# "/docker.slice/docker-<id>.scope/system.slice/slurmstepd.scope/job_N"; v1:
# "/docker/<id>/slurm/uid_U/job_N"), so a prefix is allowed (the shortest: Slurm's outermost
# hierarchy names the job), but never one that passes through a user's delegated subtree:
# systemd delegates user@UID.service's subtree to its user, who can make
# ".../user@1000.service/app.slice/job_4242" (or a whole "system.slice/slurmstepd.scope/job_N"
# below it) and move a GPU hog from an ssh session into it, to pass as job N's.
_JOB = lazyre.compile(r"^[^:]*:[^:]*:((?:/[^/]{1,256}){0,32}?)/(?:slurm(?:_[^/]{1,256})?/"
                      r"uid_\d{1,10}|system\.slice/(?:[^/]{1,256}_)?slurmstepd\.scope)"
                      r"/job_(\d{1,12})(?:/|$)")


def _cgroup_job(line: str) -> str | None:
    """The job a /proc/PID/cgroup line's path names in Slurm's hierarchy, or None: no such
    path, or one under a user's delegated subtree (a user@UID.service component before it)."""
    m = _JOB.match(line)
    if m is None:
        return None
    if any(c.startswith("user@") and c.endswith(".service") for c in m.group(1).split("/")):
        return None
    return m.group(2)


# `<node>_<job>.<step>[.<het component>]`; a node name may itself hold "_".
_STEP_SOCKET = lazyre.compile(r"_(\d{1,12})\.(\d{1,12})(?:\.\d{1,6})?(?:\.ALT)?$")
MAX_PID = 2**22  # the kernel's pid_max ceiling
MAX_SPOOL_ENTRIES = 100_000
READ_LIMIT = 64 * 1024
ACTIONS = {s.severity_word: s
           for s in (Severity.DRAIN_NOW, Severity.DRAIN_AFTER_JOB, Severity.WARN)}


def _pid(p) -> int | None:
    """A process answer's pid when it is one the kernel could have given, else None."""
    pid = p.get("pid") if isinstance(p, dict) else None
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < MAX_PID:
        return pid
    return None


def _nvml_pids(answers) -> set[int]:
    pids: set[int] = set()
    devices = answers.get("devices") if isinstance(answers, dict) else None
    for dev in devices if isinstance(devices, list) else []:
        procs = dev.get("processes") if isinstance(dev, dict) else None
        for p in procs if isinstance(procs, list) else []:
            if (pid := _pid(p)) is not None:
                pids.add(pid)
    return pids


def collect(root: StrPath, env) -> dict | None:
    doc = replayed(root, env.cfg, "leftover", "GPU processes")
    if doc is not None:  # a snapshot's record: nothing of this machine is read
        return doc
    answers = env.state.nvml_answers if env.state is not None else None
    pids = _nvml_pids(answers)
    if not pids:
        return record(root, env.cfg, pids, env.stage)  # the healthy case reads nothing at all
    return _bounded_record(root, env, pids)


# Longest wait for the /proc reads of the processes NVML names, without a stage budget or a
# probe timeout (`healthctl check`).
PROC_TIMEOUT_S = 5.0


def _bounded_record(root: StrPath, env, pids: set[int]) -> dict:
    """record() read in an abandonable child: the processes NVML names on a GPU are the ones
    likeliest stuck in the driver, and reading such a process's /proc files can block in the
    kernel (its memory map's lock held by the stuck fault) where no timeout reaches. A
    thread blocked there keeps the prolog from exiting at all (D state), and the dead GPU's
    evidence NVML already gave was never judged. Not answered in time: each pid is a process
    on a GPU whose owner could not be read (no job), and the checker says why."""
    from rsc_health.collect import bounded

    timeout = env.probe_timeout_s if env.probe_timeout_s is not None else PROC_TIMEOUT_S
    if env.deadline is not None:
        timeout = max(0.05, min(timeout, env.deadline - time.monotonic()))
    try:
        return bounded.call(lambda: record(root, env.cfg, pids, env.stage), timeout)
    except bounded.Abandoned as exc:
        if env.state is not None:
            env.state.errors.append(("leftover", "/proc", f"the GPU processes' /proc files did "
                                                          f"not answer ({exc}): owners unread"))
        return {"job_id": _own_job(), "stage": env.stage, "jobs": [], "spool_error": None,
                "pids": {str(pid): {"seen": True, "job": None, "command": "?", "user": "?",
                                    "age_s": None, "unreadable": True}
                         for pid in sorted(pids)[:1024]}}


def capture(cfg, root: StrPath, env) -> dict:
    """A snapshot carries who each process NVML names is, as read now: NVML's answers are the
    snapshot's own (env.state.nvml_answers: asked once, from an abandonable child, and not
    again while a child abandoned before still waits in the driver: commands.node)."""
    answers = env.state.nvml_answers if env.state is not None else None
    return {"leftover_record": record(root, cfg, _nvml_pids(answers))}


def record(root: StrPath, cfg, pids: set[int], stage: str | None = None) -> dict:
    """Who each pid is and which jobs run here, as plain JSON (what `check` judges); the
    stage the node path runs (a prolog judges its own job's processes by their age)."""
    out: dict = {"job_id": _own_job(), "stage": stage, "pids": {}, "jobs": [],
                 "spool_error": None}
    if not pids:
        return out  # the healthy case reads nothing at all
    spool = pure(os.path.join(root, str(cfg.get("leftover.slurmd_spool_dir")).lstrip("/")))
    try:
        jobs = set()
        with os.scandir(spool) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_SPOOL_ENTRIES:
                    break
                m = _STEP_SOCKET.search(entry.name)
                if m:
                    jobs.add(m.group(1))
        out["jobs"] = sorted(jobs)
    except OSError as exc:
        out["spool_error"] = f"{spool}: {exc.strerror or exc}"
    users = _passwd(root)
    uptime = _uptime(root)
    for pid in sorted(pids)[:1024]:
        out["pids"][str(pid)] = _process(root, pid, users, uptime)
    return out


def _own_job() -> str | None:
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    return job if job and job.isdigit() and len(job) <= 12 else None


def _uptime(root: StrPath) -> float | None:
    """Seconds since boot (/proc/uptime's first field), None when it cannot be read."""
    try:
        first = read_bounded(os.path.join(root, "proc/uptime"), 256).split()[0]
        value = float(first)
    except (OSError, IndexError, ValueError):
        return None
    return value if 0 <= value < 1e10 else None


def _age_s(stat: str, uptime: float | None) -> float | None:
    """A process's age in seconds from /proc/PID/stat's starttime (field 22, clock ticks
    since boot; the fields after the last ')' since comm may hold spaces and parentheses),
    None when either cannot be read or the answer is not one a clock could give."""
    if uptime is None:
        return None
    try:
        ticks = int(stat[stat.rindex(")") + 1:].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
    except (ValueError, IndexError, OSError):
        return None
    if ticks < 0 or hz <= 0:
        return None
    age = uptime - ticks / hz
    return round(age, 1) if age >= 0 else None


def _process(root: StrPath, pid: int, users: dict[int, str], uptime: float | None = None) -> dict:
    proc = os.path.join(root, "proc", str(pid))
    try:
        cgroup = read_bounded(os.path.join(proc, "cgroup"), READ_LIMIT).decode("utf-8", "replace")
    except OSError:
        return {"seen": False}
    jobs = {job for line in cgroup.splitlines() for job in [_cgroup_job(line)] if job}
    info: dict = {"seen": True, "job": min(jobs, key=int) if jobs else None}
    try:
        comm = read_bounded(os.path.join(proc, "comm"), 256).decode("utf-8", "replace").strip()
        info["command"] = "".join(c if c.isprintable() else "?" for c in comm)[:64]
    except OSError:
        info["command"] = "?"
    try:
        status = read_bounded(os.path.join(proc, "status"), READ_LIMIT).decode("utf-8", "replace")
        uid_line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
        uid = int(uid_line.split()[1])
        info["uid"] = uid
        info["user"] = users.get(uid, f"uid {uid}")
    except (OSError, ValueError, IndexError):
        info["user"] = "?"
    try:
        stat = read_bounded(os.path.join(proc, "stat"), READ_LIMIT).decode("utf-8", "replace")
        info["age_s"] = _age_s(stat, uptime)
    except OSError:
        info["age_s"] = None
    return info


def _passwd(root: StrPath) -> dict[int, str]:
    users: dict[int, str] = {}
    try:
        text = read_bounded(os.path.join(root, "etc/passwd"), 4 * 2**20).decode("utf-8", "replace")
    except OSError:
        return users
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            users.setdefault(int(parts[2]), parts[0][:32])
    return users


def _earlier_run(info: dict, here: dict) -> bool:
    """A process in the prolog's own job's cgroup that is older than the prolog can be: a
    survivor of that job's earlier run here (its slurmstepd killed, e.g. by the OOM killer, so
    nothing killed its tasks; Slurm requeued the job and gave it this node again). Slurm runs
    the prolog before any task of the job on this node, so nothing of this run is older than
    the prolog, give or take `[leftover] own_job_grace_s` for prolog scripts run beside this
    one. Only a prolog judges it: in the epilog the job's own processes are its last run's,
    still exiting. An age that cannot be read is no evidence."""
    age = info.get("age_s")
    return (here["stage"] == "prolog" and isinstance(age, (int, float))
            and not isinstance(age, bool) and age > here["grace"])


def _ignored(info: dict, ignore: set) -> bool:
    """An ignored command is root's daemon (nv-hostengine): /proc/PID/comm is whatever the
    process set with prctl(PR_SET_NAME), so a user's leftover named like it still counts."""
    return info.get("uid") == 0 and str(info.get("command")) in ignore


def check(state, cfg: dict) -> list[Finding]:
    conf = cfg["leftover"]
    rec = state.extra.get(FAMILY)
    if state.gpu is None or state.gpu.error or not isinstance(rec, dict):
        return []  # NVML itself is the gpu family's to report
    action = ACTIONS.get(str(conf["action"]))
    if action is None:
        return [checker_error(FAMILY, FAMILY, f"[leftover] action {conf['action']!r} is not "
                              "drain_now, drain_after_job or warn")]
    ignore = set(conf["ignore_commands"])
    floor = int(conf["min_memory_mib"]) * 2**20
    own = rec.get("job_id")
    raw = rec.get("pids")
    pids: dict = raw if isinstance(raw, dict) else {}
    running = {str(j) for j in rec.get("jobs") or []} - {own}
    spool_error = rec.get("spool_error")
    out: list[Finding] = []
    if spool_error:
        out.append(checker_error(FAMILY, "slurmd spool", f"leftover: cannot list running "
                                 f"jobs ({str(spool_error)[:160]}): no process in a job cgroup "
                                 "is called a leftover"))
    here = {"pids": pids, "own": own, "running": running, "spool_error": spool_error,
            "ignore": ignore, "floor": floor, "action": action, "stage": rec.get("stage"),
            "grace": float(conf["own_job_grace_s"])}
    for g in state.gpu.gpus:
        procs = g.answers.get("processes") if isinstance(g.answers, dict) else None
        if procs is None or err(procs) or not isinstance(procs, list):
            continue  # absent, or NVML refused: the gpu family says which
        for p in procs:
            finding = _judge(g, p, here)
            if finding is not None:
                out.append(finding)
    if not [f for f in out if f.family == FAMILY]:
        out.append(ok(FAMILY, "gpus", "no leftover GPU processes"))
    return out


def _judge(g, p, here: dict) -> Finding | None:
    """One process NVML names on GPU g: a finding, or None when it is no one's concern (its
    own job's, an ignored command, a job still running here, not a pid at all)."""
    pid = _pid(p)
    if pid is None:
        return None  # not a pid NVML could have answered: nothing to look at
    found = here["pids"].get(str(pid))
    info: dict = found if isinstance(found, dict) else {"seen": False}
    used = p.get("used_memory") if isinstance(p, dict) else None
    mib = used // 2**20 if isinstance(used, int) and used >= 0 else None
    comp = gpu_name(g.index)
    data = {"pid": pid, "gpu": comp, "gpu_uuid": g.uuid, "pci": g.pci_bus_id,
            "used_memory_mib": mib, "command": info.get("command"),
            "user": info.get("user"), "job": info.get("job")}
    what = (f"{comp} pid {pid} ({info.get('command', '?')}, {info.get('user', '?')}, "
            f"{'?' if mib is None else mib} MiB)")
    if not info.get("seen"):
        return warn(FAMILY, comp, "gpu_process_unseen", f"{what}: NVML names a process this "
                    "/proc does not show (exited, or another PID namespace)", **data)
    job = None if info.get("job") is None else str(info.get("job"))
    own, running = here["own"], here["running"]
    earlier_run = job is not None and job == own and _earlier_run(info, here)
    if (job is not None and job == own and not earlier_run) or _ignored(info, here["ignore"]):
        return None
    if job is not None and (job in running or here["spool_error"]):
        return None  # a job still running here
    if job is None and running:
        return warn(FAMILY, comp, "gpu_process_unattributed", f"{what}: in no job's cgroup "
                    f"while job(s) {', '.join(sorted(running)[:3])} run here: cannot tell "
                    "whose", **data)
    why = (f"left by an earlier run of job {job} (requeued), {info.get('age_s')} s old at "
           "this prolog" if earlier_run
           else f"left by job {job}, which no longer runs here" if job is not None
           else "whose /proc files did not answer (stuck in the kernel): owner unread"
           if info.get("unreadable") else "in no job's cgroup")
    severity = here["action"]
    if severity is Severity.DRAIN_NOW and own is None and running:
        # A sweep (no job of its own) while jobs run here: "now" would requeue them for a
        # process that is not theirs. They finish; then the node drains.
        severity = Severity.DRAIN_AFTER_JOB
    if severity is Severity.WARN or (isinstance(used, int) and 0 <= used < here["floor"]):
        return warn(FAMILY, comp, "gpu_process_leftover", f"{what} {why}", **data)
    return fail(FAMILY, comp, severity, "gpu_process_leftover", f"{what} {why}", repair=False,
                **data)
