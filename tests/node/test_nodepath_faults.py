"""The checker's own faults never become a node's or a job's fault.

Whatever breaks inside prolog, epilog or sweep (a state dir that cannot be created, a bug in a
step, a Slurm call that hangs past the budget, a config that is a FIFO, a state dir that refuses
writes) ends in one line naming the step, a checker record where the disk allows, and a safe
exit code: 0, except a prolog already holding a drain verdict it could not carry out, which
exits 1 so slurmd drains the node and requeues the job, as the verdict asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ("prolog", "epilog", "sweep")
XID79 = "4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    root = copy_node(tmp_path / "node")
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text() +
                    '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n')
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for name in ("SLURM_JOB_PARTITION", "SLURM_JOBID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    return root


def _records(root: Path) -> list[dict]:
    path = root / NODE_STATE / "spool" / "pending.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _gauge(root: Path, metric: str) -> str | None:
    path = root / "var/lib/node_exporter" / nodepath.TEXTFILE
    for line in path.read_text().splitlines():
        if line.startswith(metric + " "):
            return line.split()[-1]
    return None


def _no_slurm(cfg, deadline):
    raise AssertionError("a Slurm call was made")


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_an_uncreatable_state_dir_exits_0_with_one_line_naming_the_step(entry, node_env, capsys):
    state = node_env / NODE_STATE
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("a file where the state dir should be")

    assert nodepath.run_stage(entry, slurm_factory=_no_slurm) == 0

    err = capsys.readouterr().err
    assert f"rsc_health: {entry}: checker fault during lock" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_fault_after_a_drain_verdict_fails_the_prolog_and_keeps_the_verdict(node_env, capsys):
    (node_env / "dev/kmsg").open("a").write(XID79)

    def broken(cfg, deadline):
        raise RuntimeError("bug in the Slurm layer")

    assert nodepath.run_stage("prolog", slurm_factory=broken) == 1

    err = capsys.readouterr().err
    assert "checker fault during act" in err and "RuntimeError: bug in the Slurm layer" in err
    pending = json.loads((node_env / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())
    assert pending["why"] == "fault" and pending["causes"][0]["code"] == "xid79"
    records = _records(node_env)
    beats = [r for r in records if r["kind"] == "heartbeat"]
    assert len(beats) == 1 and beats[0]["level"] == "drain_now"  # not doubled by the fault
    assert any(r.get("code") == "checker_fault" for r in records)


@pytest.mark.parametrize("entry", ("epilog", "sweep"))
def test_a_fault_after_a_drain_verdict_in_epilog_or_sweep_exits_0_and_keeps_it(entry, node_env):
    (node_env / "dev/kmsg").open("a").write(XID79)

    def broken(cfg, deadline):
        raise RuntimeError("bug")

    assert nodepath.run_stage(entry, slurm_factory=broken) == 0
    pending = json.loads((node_env / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())
    assert pending["why"] == "fault"


def test_a_fault_in_shadow_mode_fails_no_job_and_keeps_no_verdict(node_env, monkeypatch):
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text() + "\n[actions]\nenabled = false\n")
    (node_env / "dev/kmsg").open("a").write(XID79)

    def broken(*args, **kwargs):
        raise RuntimeError("bug after the verdict")

    monkeypatch.setattr(nodepath, "_job_records", broken)
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0
    assert not (node_env / NODE_STATE / nodepath.PENDING_VERDICT_FILE).exists()


def test_a_hung_slurm_call_is_cut_by_the_watchdog_with_the_safe_code(node_env, tmp_path):
    """A prolog whose drain call hangs: the watchdog fires at budget + 2 s, names the step,
    spools the fault and exits 1 (the verdict was drain), and keeps the verdict pending."""
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text().replace("[slurm]", "[slurm]\nprolog_budget_s = 1", 1)
                    if "[slurm]" in site.read_text()
                    else site.read_text() + "\n[slurm]\nprolog_budget_s = 1\n")
    (node_env / "dev/kmsg").open("a").write(XID79)
    script = ("import time\nfrom rsc_health import nodepath\n"
              "raise SystemExit(nodepath.run_stage('prolog', "
              "slurm_factory=lambda cfg, deadline: time.sleep(600)))\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    took = time.monotonic() - started

    assert proc.returncode == 1, proc.stderr
    assert "still running after 3s during act" in proc.stderr
    assert took < 30
    assert json.loads((node_env / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())[
        "why"] == "fault"
    assert any(r.get("code") == "checker_timeout" for r in _records(node_env))


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped is dead: PID 1 here may not reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_the_watchdog_kills_the_commands_a_hung_run_left_running(node_env, tmp_path):
    """A Slurm command that outlives the budget (a site's wrapper whose timeout was set
    past it) was left running, with what it started, when the watchdog's os._exit ended the
    prolog: every run that hung left two more processes behind. The watchdog now kills the
    process groups the run still holds before it leaves."""
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text() + "\n[slurm]\nprolog_budget_s = 1\n"
                    if "[slurm]" not in site.read_text()
                    else site.read_text().replace("[slurm]", "[slurm]\nprolog_budget_s = 1", 1))
    (node_env / "dev/kmsg").open("a").write(XID79)
    pids = tmp_path / "pids"
    shell = f"sleep 600 & echo $! > {pids}; echo $$ >> {pids}; wait"
    script = (
        "from rsc_health import nodepath\nfrom rsc_health.collect import procs\n"
        "def hung(cfg, deadline):\n"
        f"    procs.run_all({{'scontrol': ['sh', '-c', {shell!r}]}}, "
        "timeout_s={'scontrol': 600}, max_bytes=4096, exit_grace_s=None)\n"
        "raise SystemExit(nodepath.run_stage('prolog', slurm_factory=hung))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    assert "still running after 3s" in proc.stderr
    left = [int(p) for p in pids.read_text().split()]
    assert len(left) == 2
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in left), "the hung command outlived the prolog"


def test_a_fifo_as_the_config_is_refused_without_blocking(node_env, monkeypatch, capsys):
    fifo = node_env / "site.fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(fifo))

    started = time.monotonic()
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0

    assert time.monotonic() - started < 10
    assert "not a regular file" in capsys.readouterr().err


@pytest.fixture
def immutable_state_dir(node_env):
    """The state dir refuses new names (chattr +i: EPERM even for root) while its spool
    subdirectory and lock file, made by a first sweep, still take writes."""
    sdir = node_env / NODE_STATE
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    done = subprocess.run(["chattr", "+i", str(sdir)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {done.stderr.decode()[:200]}")
    yield sdir
    subprocess.run(["chattr", "-i", str(sdir)], capture_output=True)


def test_a_state_dir_that_refuses_the_counters_is_spooled_and_counted(
        node_env, immutable_state_dir, capsys):
    capsys.readouterr()
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    state = [r for r in _records(node_env) if r.get("code") == "state_error"]
    assert len(state) == 1 and "cannot save state" in state[0]["reason"]
    assert int(_gauge(node_env, 'rsc_health_checker_errors{source="sweep"}')) >= 1
    assert "cannot save state" in capsys.readouterr().err


def test_a_guard_held_verdict_costs_a_healthy_prolog_no_slurm_call(node_env):
    sdir = node_env / NODE_STATE
    sdir.mkdir(parents=True)
    cause = {"family": "xid", "component": "GPU0", "status": "fail", "severity": "drain_now",
             "reason": "XID 79", "code": "xid79"}
    (sdir / nodepath.PENDING_VERDICT_FILE).write_text(json.dumps(
        {"level": 3, "why": "guard", "causes": [cause], "time": "2026-11-24T00:00:00+00:00"}))

    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0

    assert (sdir / nodepath.PENDING_VERDICT_FILE).exists()
    assert _gauge(node_env, "rsc_health_pending_drain") == "1"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_writes_the_pending_drain_gauge(entry, node_env):
    assert nodepath.run_stage(entry, slurm_factory=_no_slurm) == 0
    assert _gauge(node_env, "rsc_health_pending_drain") == "0"


def test_a_full_spool_keeps_faults_and_drops_only_all_clear_rows(node_env, capsys):
    """The historian has not taken the spool for months: past [node] spool_max_mb a run
    spools its XID but not its all-clear rows and heartbeat, and says so once."""
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text().replace("[node]\n", "[node]\nspool_max_mb = 0.001\n", 1))
    spool_dir = node_env / NODE_STATE / "spool"
    spool_dir.mkdir(parents=True)
    (spool_dir / "pending.jsonl").write_text("{}\n" * 1000)  # 3 kB undelivered
    before = len(_records(node_env))
    (node_env / "dev/kmsg").open("a").write(XID79)

    nodepath.run_stage("sweep", slurm_factory=lambda cfg, deadline: _quiet())

    new = _records(node_env)[before:]
    assert [r["kind"] for r in new if r["kind"] == "check"] == ["check"]
    assert new[0]["code"] == "xid79"
    assert not [r for r in new if r["kind"] == "heartbeat" or r.get("status") == "ok"]
    assert "over [node] spool_max_mb" in capsys.readouterr().err
    assert int(_gauge(node_env, "rsc_health_spool_bytes")) >= 3000


def _quiet():
    """slurmctld away: every call raises SlurmUnavailable."""
    from rsc_health.slurm.memory import MemorySlurm

    slurm = MemorySlurm(["node01"])
    slurm.stop()
    return slurm


@pytest.mark.parametrize("cause", [
    {"family": 1, "component": "gpu0", "status": "fail", "severity": "drain_now",
     "reason": "r", "code": ""},
    {"family": "xid", "component": None, "status": "fail", "severity": "drain_now",
     "reason": "r", "code": "xid79"},
    {"family": "xid", "component": "gpu0", "status": "fail", "severity": "drain_now",
     "reason": 5, "code": "xid79"},
], ids=["family_int", "component_null", "reason_int"])
def test_a_wrongly_typed_pending_verdict_is_discarded_not_a_fault_on_every_run(node_env, cause):
    """pending_verdict.json whose cause parses as JSON but holds a number or null where text
    belongs: every run died at the verdict step before spooling anything, for ever, so a real
    XID 79 on the node was never spooled nor drained."""
    sdir = node_env / NODE_STATE
    sdir.mkdir(parents=True)
    (sdir / nodepath.PENDING_VERDICT_FILE).write_text(json.dumps(
        {"level": 3, "why": "guard", "causes": [cause], "time": "2026-11-24T00:00:00+00:00"}))
    (node_env / "dev/kmsg").open("a").write(XID79)

    assert nodepath.run_stage("prolog", slurm_factory=lambda cfg, deadline: _quiet()) == 1

    assert [r["code"] for r in _records(node_env) if r.get("status") == "fail"] == ["xid79"]
    assert not any(r.get("code") == "checker_fault" for r in _records(node_env))
    kept = json.loads((sdir / nodepath.PENDING_VERDICT_FILE).read_text())
    assert [c["code"] for c in kept["causes"]] == ["xid79"]  # the real verdict, for the sweep


# Every file the node path reads that is not /dev/kmsg, under the node's root.
READ_FILES = [
    f"{NODE_STATE}/counters.json", f"{NODE_STATE}/xid_cursor.json",
    f"{NODE_STATE}/{nodepath.PENDING_VERDICT_FILE}",
    "sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error",
    "sys/bus/pci/devices/0000:99:00.0/aer_dev_fatal", "proc/sys/kernel/random/boot_id",
    "proc/mounts", "rsc_health/nvml.json", f"var/lib/node_exporter/{nodepath.TEXTFILE}",
]


def _limit_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # /dev/zero must not eat the host


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
@pytest.mark.parametrize("rel", READ_FILES, ids=[Path(r).name for r in READ_FILES])
def test_a_fifo_or_endless_file_where_a_file_is_read_neither_hangs_nor_blinds_the_prolog(
        node_env, rel, kind):
    """A FIFO blocks read() for ever and /dev/zero never ends (the prolog ate memory until
    MemoryError and judged nothing): each such file is now refused at once, the rest of the
    node is still judged, and an XID 79 still fails the job start."""
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text()
                    + '\n[slurm]\nprolog_budget_s = 8\nbin_dir = "/nonexistent"\n')
    path = node_env / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    (node_env / "dev/kmsg").open("a").write(XID79)

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "prolog"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, preexec_fn=_limit_memory)

    assert time.monotonic() - started < 6, proc.stderr  # not the watchdog at 8 + 2 s
    assert proc.returncode == 1, proc.stderr
    assert "xid79" in [r.get("code") for r in _records(node_env)]


def _fleet_outage():
    """A Slurm where two of node01's ten partition mates were drained by rsc-health a moment
    ago: the mass-drain guard (limit 1 of 10) holds node01's drain. Its `reads` count the
    node-table reads, each one of which costs slurmctld the whole table."""
    from rsc_health.slurm.memory import MemorySlurm

    slurm = MemorySlurm([f"node{i:02d}" for i in range(1, 9)])
    for i in (9, 10):
        slurm.add_node(f"node{i:02d}", "IDLE+DRAIN",
                       "rsc_health:now:mount_missing:/checkpoint missing", user="root")
    return slurm


def _drains(slurm) -> list[tuple]:
    return [c for c in slurm.calls if c[0] == "drain"]


def _lose_checkpoint_mount(root: Path) -> None:
    mounts = root / "proc/mounts"
    mounts.write_text("".join(line + "\n" for line in mounts.read_text().splitlines()
                              if " /checkpoint " not in line))


def _pending(root: Path) -> dict:
    return json.loads((root / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())


def _set_retry_after(root: Path, when: str) -> None:
    path = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    data = json.loads(path.read_text())
    data["retry_after"] = when
    path.write_text(json.dumps(data))


def test_a_guard_held_node_leaves_slurmctld_alone_until_its_backoff_runs_out(node_env):
    """A fleet-wide outage (the shared mount gone everywhere) trips the mass-drain guard.
    Every held node used to retry on every sweep and every job start, each try reading the
    node's record and the whole node table (24 ms of slurmctld's time each at 16,000 nodes,
    benchmarks/bench_guard_load.py): 16,000 nodes' sweeps kept slurmctld busy 2.5 s per
    second for as long as the outage lasted. A held verdict is now retried only after a
    jittered backoff that doubles per hold, and a try reads the table once."""
    from datetime import UTC, datetime, timedelta

    _lose_checkpoint_mount(node_env)
    slurm = _fleet_outage()
    before = datetime.now(UTC)
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    first = _pending(node_env)
    assert first["why"] == "guard" and first["holds"] == 1
    assert slurm.reads == 1  # one read of the table per try: its own record is in it
    assert _drains(slurm) == []  # the guard held the drain
    retry = datetime.fromisoformat(first["retry_after"])
    assert before + timedelta(minutes=2.5) <= retry <= datetime.now(UTC) + timedelta(minutes=7.5)

    for entry in ("sweep", "prolog", "epilog", "sweep"):  # the same fault, nothing new
        assert nodepath.run_stage(entry, slurm_factory=_no_slurm) == 0
    assert _pending(node_env)["holds"] == 1
    assert _gauge(node_env, "rsc_health_pending_drain") == "1"

    _set_retry_after(node_env, (datetime.now(UTC) - timedelta(seconds=1)).isoformat())
    # The backoff ran out.
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    second = _pending(node_env)
    assert second["holds"] == 2 and slurm.reads == 2
    assert _drains(slurm) == []  # the guard held the drain
    assert datetime.fromisoformat(second["retry_after"]) >= before + timedelta(minutes=5)


def test_a_new_fault_on_a_guard_held_node_is_tried_at_once(node_env):
    _lose_checkpoint_mount(node_env)
    slurm = _fleet_outage()
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    assert _pending(node_env)["holds"] == 1
    (node_env / "dev/kmsg").open("a").write(XID79)  # a GPU fell off the bus: news
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    assert slurm.reads == 2 and _pending(node_env)["holds"] == 2
    assert _drains(slurm) == []  # the guard held the drain


@pytest.mark.parametrize("junk", [
    {"holds": 3, "retry_after": "2099-01-01T00:00:00+00:00"},  # the clock stepped back
    {"holds": "many", "retry_after": "soon"},
    {"holds": True, "retry_after": 12},
    {"holds": -3, "retry_after": "2026-11-25T12:00:00"},  # no zone: not trusted
])
def test_a_garbled_guard_backoff_retries_rather_than_waits_for_ever(node_env, junk):
    """A pending verdict from an older version, or hand-edited, or a wait longer than any
    backoff (the wall clock was stepped back since it was written): what cannot be read as a
    backoff is no backoff (the sweep asks Slurm, as before); it never blocks retries."""
    sdir = node_env / NODE_STATE
    sdir.mkdir(parents=True)
    # An XID's cause (its line consumed): a mount's, this node's /checkpoint being healthy,
    # is dropped as healed before any backoff is read (policy.still_standing).
    cause = {"family": "xid", "component": "0000:1b:00", "status": "fail",
             "severity": "drain_now", "reason": "XID 79 GPU has fallen off the bus",
             "code": "xid79", "repair": True}
    (sdir / nodepath.PENDING_VERDICT_FILE).write_text(json.dumps(
        {"level": 3, "why": "guard", "causes": [cause], "time": "2026-11-24T00:00:00+00:00",
         **junk}))
    slurm = _fleet_outage()
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    assert slurm.reads == 1  # tried now
    assert _drains(slurm) == []  # the guard held the drain
    assert _pending(node_env)["holds"] == (4 if junk["holds"] == 3 else 1)


def test_a_prolog_that_drains_now_requeues_the_nodes_other_jobs_not_its_own(node_env):
    """A prolog finding an XID 79 drained the node and requeued nothing: Slurm requeues the job
    whose prolog failed, but a job already running on a shared node (or one whose prolog waited
    on the lock while this one drained) ran on, on the GPU that fell off the bus, for good: the
    prolog had consumed the XID and no later run found it (helper-122, on the real Slurm:
    tests/slurm/test_cluster_scenarios.py). The prolog now requeues them, its own job aside."""
    from rsc_health.slurm.memory import MemorySlurm

    (node_env / "dev/kmsg").open("a").write(XID79)
    slurm = MemorySlurm(["node01"], now=lambda: nodepath.utcnow())
    slurm.start_job("node01", "777", whole_node=False)  # already running on the node
    slurm.start_job("node01", "4242", whole_node=False)  # this prolog's own
    assert nodepath.run_stage("prolog", slurm_factory=lambda cfg, d: slurm) == 1
    assert [c[0] for c in slurm.calls if c[0] == "drain"] == ["drain"]
    assert ("requeue", "777") in slurm.calls
    assert ("requeue", "4242") not in slurm.calls  # Slurm requeues it: the prolog failed
