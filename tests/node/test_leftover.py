"""Leftover GPU processes at job start: NVML's compute processes judged by whose they are
(/proc/PID/cgroup under Slurm's job_N, the job's step sockets in the slurmd spool dir, the
prolog's own job), without a Slurm call; hostile /proc and NVML answers never crash nor drain
by themselves."""

from __future__ import annotations

import os
import time

import pytest

from rsc_health.model import Level, Severity, Status
from tests.node.conftest import Node

from .test_nodepath_faults import node_env  # noqa: F401 - the fixture

V2 = "0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
# cgroup v1 as task/cgroup writes it (several hierarchies, one line each).
V1 = ("12:memory:/slurm/uid_1000/job_{job}/step_batch/task_0\n"
      "11:devices:/slurm/uid_1000/job_{job}/step_batch/task_0\n4:cpuset:/\n")
SPOOL = "var/spool/slurmd"
JOB17 = V2.format(job=17)


def _gpu_process(node, pid=4321, gpu=2, used=2 << 30, cgroup=JOB17,
                 comm="python3", uid=1000):
    node.nvml(lambda d: d["devices"][gpu].setdefault("processes", []).append(
        {"pid": pid, "used_memory": used}))
    if cgroup is not None:
        node.write(f"proc/{pid}/cgroup", cgroup)
        node.write(f"proc/{pid}/comm", comm + "\n")
        node.write(f"proc/{pid}/status", f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    node.write("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"
                             "alice:x:1000:1000::/home/alice:/bin/bash\n")


def _steps(node, *jobs):
    node.path(SPOOL).mkdir(parents=True, exist_ok=True)
    for job in jobs:
        node.write(f"{SPOOL}/node01_{job}.4294967292", "")
        node.write(f"{SPOOL}/node01_{job}.0", "")


def _leftover(node):
    findings, verdict = node.check(only={"leftover"})
    return [f for f in findings if f.status is not Status.OK], verdict


@pytest.fixture(autouse=True)
def _prolog_of_job_4242(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")


def test_a_process_of_a_job_that_ended_drains_now_and_says_what_it_is(node):
    _gpu_process(node)
    _steps(node, 4242)  # only the prolog's own job runs
    bad, verdict = _leftover(node)
    assert verdict.level is Level.DRAIN_NOW
    (f,) = bad
    assert (f.family, f.component, f.code, f.repair) == (
        "leftover", "gpu2", "gpu_process_leftover", False)
    assert {k: f.data[k] for k in ("pid", "command", "user", "job", "used_memory_mib")} == {
        "pid": 4321, "command": "python3", "user": "alice", "job": "17",
        "used_memory_mib": 2048}
    assert "gpu2 pid 4321 (python3, alice, 2048 MiB) left by job 17" in f.reason


def test_a_sweep_finding_one_beside_running_jobs_drains_after_them_not_now(node, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID")  # the sweep: no job of its own
    _gpu_process(node)
    _steps(node, 4242)  # job 4242 runs here; job 17 is over
    bad, verdict = _leftover(node)
    assert [(f.code, f.severity) for f in bad] == [
        ("gpu_process_leftover", Severity.DRAIN_AFTER_JOB)]
    _steps(node)  # nothing runs: now costs no job
    node.path(f"{SPOOL}/node01_4242.0").unlink()
    node.path(f"{SPOOL}/node01_4242.4294967292").unlink()
    assert _leftover(node)[1].level is Level.DRAIN_NOW


def test_cgroup_v1_paths_name_the_job_too(node):
    _gpu_process(node, cgroup=V1.format(job=99))
    _steps(node)
    bad, _ = _leftover(node)
    assert [f.data["job"] for f in bad] == ["99"]


@pytest.mark.parametrize("cgroup", [
    # systemd delegates user@UID.service's subtree to its user (Delegate=yes): alice can
    # mkdir a "job_4242" there and move a GPU hog from her ssh session into it (helper-207)
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job_4242/hog\n",
    # ... or copy Slurm's whole v2 path below it
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/system.slice/"
    "slurmstepd.scope/job_4242/step_0/user/task_0\n",
    # ... or, cgroup v1, in the name=systemd hierarchy systemd delegates alike
    "1:name=systemd:/user.slice/user-1000.slice/user@1000.service/slurm/uid_1000/job_4242/x\n"
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/hog.scope\n",
])
def test_a_user_cgroup_named_job_n_does_not_make_a_process_a_jobs(node, cgroup):
    """The job was read from any "/job_N/" anywhere in the path, not from Slurm's own
    hierarchy, so at job 4242's prolog the hog passed for job 4242's own process and the job
    started on a GPU whose memory was taken."""
    _gpu_process(node, cgroup=cgroup)
    _steps(node, 4242)
    bad, verdict = _leftover(node)
    assert verdict.level is Level.DRAIN_NOW, [f.reason for f in bad]
    assert [f.code for f in bad] == ["gpu_process_leftover"]
    assert bad[0].data["job"] is None


@pytest.mark.parametrize("cgroup", [
    V2.format(job=4242),
    V1.format(job=4242),
    # multiple slurmd on one host: the node's name before the scope / the hierarchy
    "0::/system.slice/node01_slurmstepd.scope/job_4242/step_0/user/task_0\n",
    "4:memory:/slurm_node01/uid_1000/job_4242/step_0/task_0\n",
    "0::/system.slice/slurmstepd.scope/job_4242\n",  # the job's own cgroup (an extern task)
])
def test_slurms_own_job_cgroups_name_the_job(node, cgroup):
    _gpu_process(node, cgroup=cgroup)
    _steps(node, 4242)
    bad, verdict = _leftover(node)
    assert bad == [] and verdict.level is Level.OK


@pytest.mark.parametrize("cgroup", [
    # slurmd in a container, cgroup v2 seen from the host's cgroup namespace: Slurm's cgroup/v2
    # puts the scope at dirname(PID 1's cgroup)/system.slice/slurmstepd.scope
    # (src/plugins/cgroup/v2/cgroup_v2.c _set_int_cg_ns: "In containerized environments it
    # will look like: /sys/fs/cgroup[/docker.slice/docker-<some UUID>.scope]").
    "0::/docker.slice/docker-3f2a9c.scope/system.slice/slurmstepd.scope/job_17/step_0/user/"
    "task_0\n",
    # slurmd in a Docker container on a cgroup v1 host (Docker's default there: the host's
    # cgroup namespace): task/cgroup's /slurm hierarchy under the container's own cgroup.
    "12:memory:/docker/3f2a9c/slurm/uid_1000/job_17/step_0/task_0\n"
    "11:devices:/docker/3f2a9c/slurm/uid_1000/job_17/step_0/task_0\n",
], ids=["v2", "v1"])
def test_a_running_jobs_process_under_a_containerized_slurmd_is_its_jobs(node, cgroup):
    """Job 17 runs on GPU 2 of a shared node (its step sockets are in the spool); job 4242's
    prolog starts on the other GPUs. With slurmd in a container (the cgroup path Slurm itself
    builds there) the root-anchored pattern read job 17's process as in no job:
    gpu_process_unattributed, a warning at every prolog and sweep for every running job."""
    _gpu_process(node, cgroup=cgroup)
    _steps(node, 4242, 17)
    bad, verdict = _leftover(node)
    assert bad == [] and verdict.level is Level.OK, [(f.code, f.reason) for f in bad]


@pytest.mark.parametrize("cgroup", [
    # a rootless container alice runs (podman) copies a containerized slurmd's path: the
    # container's cgroup is inside her delegated subtree
    "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-3f2a9c.scope/"
    "system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
    "1:name=systemd:/user.slice/user-1000.slice/user@1000.service/docker/3f2a9c/slurm/"
    "uid_1000/job_4242/step_0\n"
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/hog.scope\n",
], ids=["v2", "v1"])
def test_a_containerized_slurm_path_inside_a_users_delegated_subtree_is_no_jobs(node, cgroup):
    """The prefix a containerized slurmd's path may have never passes through a user's
    user@UID.service: there she makes whatever path she likes and moves a hog into it."""
    _gpu_process(node, cgroup=cgroup)
    _steps(node, 4242)
    bad, verdict = _leftover(node)
    assert verdict.level is Level.DRAIN_NOW, [f.reason for f in bad]
    assert [f.code for f in bad] == ["gpu_process_leftover"]
    assert bad[0].data["job"] is None


def test_the_prologs_own_job_and_another_running_job_are_not_leftovers(node):
    _gpu_process(node, pid=10, cgroup=V2.format(job=4242))
    _gpu_process(node, pid=11, gpu=3, cgroup=V2.format(job=17))
    _steps(node, 4242, 17)  # job 17 still runs here (a shared node)
    bad, verdict = _leftover(node)
    assert bad == [] and verdict.level is Level.OK


def test_a_process_in_no_job_is_a_leftover_alone_and_only_a_warning_beside_other_jobs(node):
    _gpu_process(node, cgroup="0::/user.slice/user-1000.slice/session-3.scope\n")
    _steps(node)
    bad, verdict = _leftover(node)
    assert [f.code for f in bad] == ["gpu_process_leftover"]
    assert verdict.level is Level.DRAIN_NOW
    _steps(node, 17)  # another job runs: under proctrack/linuxproc its tasks look the same
    bad, verdict = _leftover(node)
    assert [(f.code, f.severity) for f in bad] == [("gpu_process_unattributed", Severity.WARN)]


def test_config_decides_warn_and_small_leftovers_only_warn(node):
    _gpu_process(node, used=100 << 20)
    _steps(node)
    cfg = node.config
    cfg.data["leftover"]["min_memory_mib"] = 512
    from rsc_health.engine import run
    from rsc_health.policy import decide

    assert decide(run(cfg, node.root, only={"leftover"})).level is Level.WARN
    cfg.data["leftover"]["min_memory_mib"] = 0
    cfg.data["leftover"]["action"] = "warn"
    assert decide(run(cfg, node.root, only={"leftover"})).level is Level.WARN
    cfg.data["leftover"]["action"] = "drain_after_job"
    assert decide(run(cfg, node.root, only={"leftover"})).level is Level.DRAIN_AFTER_JOB
    cfg.data["leftover"]["ignore_commands"] = ["python3"]
    # alice's process calls itself python3 (comm is the process's own choice): not ignored
    assert decide(run(cfg, node.root, only={"leftover"})).level is Level.DRAIN_AFTER_JOB


def test_an_ignored_command_is_ignored_only_as_roots_daemon_not_a_users_namesake(node):
    from rsc_health.engine import run
    from rsc_health.policy import decide

    _gpu_process(node, comm="nv-hostengine", uid=1000, cgroup="0::/user.slice/x.scope\n")
    _steps(node)
    cfg = node.config
    cfg.data["leftover"]["ignore_commands"] = ["nv-hostengine"]
    # a user's process named itself so with prctl(PR_SET_NAME): still a leftover
    assert decide(run(cfg, node.root, only={"leftover"})).level is Level.DRAIN_NOW
    node.write("proc/4321/status", "Name:\tnv-hostengine\nUid:\t0\t0\t0\t0\n")
    assert decide(run(cfg, node.root, only={"leftover"})).level is Level.OK


def test_memory_nvml_cannot_tell_counts_as_held(node):
    _gpu_process(node, used=None)
    _steps(node)
    cfg = node.config
    cfg.data["leftover"]["min_memory_mib"] = 512
    from rsc_health.engine import run
    from rsc_health.policy import decide

    assert decide(run(cfg, node.root, only={"leftover"})).level is Level.DRAIN_NOW


def test_a_pid_this_proc_does_not_show_warns(node):
    _gpu_process(node, cgroup=None)
    _steps(node)
    bad, verdict = _leftover(node)
    assert [f.code for f in bad] == ["gpu_process_unseen"] and verdict.level is Level.WARN


def test_an_unreadable_spool_dir_is_the_checkers_problem_never_a_drain(node):
    _gpu_process(node)  # job 17's, and no spool dir to tell whether job 17 still runs
    bad, verdict = _leftover(node)
    assert [(f.family, f.code) for f in bad] == [("checker", "leftover_unreadable")]
    assert verdict.level is Level.CHECKER_ERROR


def test_hostile_proc_files_and_nvml_answers_neither_block_nor_crash(node):
    _gpu_process(node, pid=20, cgroup=None)
    node.path("proc/20").mkdir(parents=True)
    os.mkfifo(node.path("proc/20/cgroup"))  # a FIFO where a file was expected: never opened
    _gpu_process(node, pid=21, gpu=3, cgroup="x" * 200_000)  # over the read limit
    node.write("proc/21/comm", "\x1b[31mevil\x00name" * 50)
    node.nvml(lambda d: d["devices"][4].update(processes=[
        {"pid": "7"}, {"pid": -1}, {"pid": True}, "junk", {"pid": 2**40}]))
    node.nvml(lambda d: d["devices"][5].update(processes={"error": "NVML_ERROR_NOT_SUPPORTED"}))
    _steps(node)
    bad, verdict = _leftover(node)
    assert sorted(f.code for f in bad) == ["gpu_process_unseen", "gpu_process_unseen"]
    assert verdict.level is Level.WARN


def test_a_healthy_node_reads_no_proc_file(node, monkeypatch):
    from rsc_health.checks import leftover

    def refuse(*a, **k):
        raise AssertionError("read a /proc file with no GPU process")

    monkeypatch.setattr(leftover, "_process", refuse)
    bad, verdict = _leftover(node)
    assert bad == [] and verdict.level is Level.OK


def test_this_machines_real_proc_reads_as_a_process_with_its_command_and_user(monkeypatch):
    """The record's reader on the real /proc (root "/"): this test's own process, as the
    kernel shows it (cgroup v1 or v2 lines, comm, the Uid: line of status)."""
    from pathlib import Path

    from rsc_health.checks import leftover
    from rsc_health.config import load_config

    monkeypatch.delenv("SLURM_JOB_ID")
    cfg = load_config(os.devnull)
    rec = leftover.record(Path("/"), cfg, {os.getpid()})
    me = rec["pids"][str(os.getpid())]
    assert me["seen"] and me["command"] == Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert me["uid"] == os.getuid() and me["user"] not in ("?", "")
    assert me["job"] is None  # not a Slurm task here
    assert rec["job_id"] is None


def test_a_snapshot_asks_a_wedged_nvml_once_and_is_not_hung_by_it(node, monkeypatch):
    """The snapshot asks live NVML from an abandonable child, as the node path does, and the
    leftover capture names the processes of those answers. Before, the capture asked NVML
    from a child of its own: two children per snapshot stuck in a wedged driver."""
    from rsc_health.collect import bounded, gpu, hangs
    from rsc_health.collect import node as node_mod
    from rsc_health.commands.node import take_snapshot

    def wedged(self, progress=None):
        time.sleep(60)

    forked: list[str | None] = []
    real_start = bounded.start

    def start(fn, **kw):
        forked.append(kw.get("mark"))
        return real_start(fn, **kw)

    monkeypatch.setattr(bounded, "start", start)
    monkeypatch.setattr(gpu.NvmlBackend, "read", wedged)
    monkeypatch.setattr(node_mod, "gpu_backend",
                        lambda cfg, root, telemetry=False: gpu.NvmlBackend())
    cfg = node.config
    cfg.data["gpu"]["nvml_timeout_s"] = 0.5
    started = time.monotonic()
    doc = take_snapshot(cfg, node.root, "node01")
    assert time.monotonic() - started < 5
    assert doc["nvml"] == gpu.UNANSWERED
    assert doc["leftover_record"]["pids"] == {}
    assert forked.count(hangs.marker(hangs.NVML, node.root)) == 1


def _aged(node, pid: int, age_s: float, uptime_s: float = 100_000.0) -> None:
    """/proc/uptime and /proc/PID/stat as the kernel writes them: pid `age_s` seconds old (a
    comm with a space and a parenthesis, as a process may name itself)."""
    hz = os.sysconf("SC_CLK_TCK")
    start = int((uptime_s - age_s) * hz)
    node.write("proc/uptime", f"{uptime_s:.2f} 1234567.89\n")
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "0", "0", "0", "0", "10",
              "5", "0", "0", "20", "0", "4", "0", str(start), "123456789", "1000"]
    node.write(f"proc/{pid}/stat", f"{pid} (pt main) x) " + " ".join(fields) + "\n")


def test_a_requeued_jobs_survivor_from_its_earlier_run_fails_its_prolog(node):
    """The job's earlier run here lost its slurmstepd (OOM-killed): nothing killed its tasks,
    Slurm requeued the job under the same id and gave it this node again. Its old process in
    job_4242's cgroup still holds the GPU; the prolog used to pass it as its own job's."""
    _gpu_process(node, pid=10, cgroup=V2.format(job=4242))
    _aged(node, 10, age_s=3600)
    _steps(node)
    findings, verdict = node.check(only={"leftover"}, stage="prolog")
    (f,) = [f for f in findings if f.status is not Status.OK]
    assert verdict.level is Level.DRAIN_NOW
    assert (f.code, f.data["job"], f.data["pid"]) == ("gpu_process_leftover", "4242", 10)
    assert "earlier run of job 4242 (requeued), 3600.0 s old" in f.reason


@pytest.mark.parametrize("stage, age_s, uptime", [
    ("epilog", 3600, True),   # the job's own processes, still exiting after its end
    (None, 3600, True),       # healthctl check: no stage, no prolog
    ("prolog", 30, True),     # younger than the grace: a prolog script run beside ours
    ("prolog", 3600, False),  # no /proc/uptime: the age is no evidence
])
def test_the_own_jobs_process_is_not_a_leftover_outside_a_prolog_or_when_young(
        node, stage, age_s, uptime):
    _gpu_process(node, pid=10, cgroup=V2.format(job=4242))
    _aged(node, 10, age_s=age_s)
    if not uptime:
        node.path("proc/uptime").unlink()
    _steps(node)
    findings, verdict = node.check(only={"leftover"}, stage=stage)
    assert [f for f in findings if f.status is not Status.OK] == []
    assert verdict.level is Level.OK


@pytest.mark.parametrize("stat", ["", "garbage", "10 (x) S 1 2", "10 (x) " + "-5 " * 30,
                                  "10 (x) " + "9" * 400 + " " * 30])
def test_a_garbled_stat_or_uptime_never_drains_the_own_job(node, stat):
    _gpu_process(node, pid=10, cgroup=V2.format(job=4242))
    node.write("proc/uptime", "not a number\n" if stat == "garbage" else "100.0 5.0\n")
    node.write("proc/10/stat", stat)
    _steps(node)
    findings, verdict = node.check(only={"leftover"}, stage="prolog")
    assert verdict.level is Level.OK, [f.reason for f in findings]


def test_the_node_paths_prolog_drains_on_a_requeued_jobs_survivor(node_env):  # noqa: F811
    """Through the prolog as slurmd runs it: the stage reaches the family."""
    from rsc_health import nodepath
    from tests.fixtures.nodes.node_copy import NODE_STATE

    from .test_state_dir_read_only import node01_slurm

    node = Node(node_env)
    _gpu_process(node, pid=10, cgroup=V2.format(job=4242))
    _aged(node, 10, age_s=7200)
    _steps(node)
    slurm = node01_slurm()
    assert nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm) == 1
    spooled = (node_env / NODE_STATE / "spool" / "pending.jsonl").read_text()
    assert "earlier run of job 4242" in spooled
    # the epilog of that run says nothing of it: the job's own processes end after it
    slurm = node01_slurm()
    assert nodepath.run_stage("epilog", slurm_factory=lambda c, d: slurm) == 0
