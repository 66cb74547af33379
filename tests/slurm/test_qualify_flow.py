"""The qualification flow on the real Slurm cluster: a node rsc-health drained is reserved for
root, resumed into the reservation, qualified by a real job running `healthctl qualify run` on
stand-in tools printing the real formats, and released only on a stored pass; every other path
(fail, nothing proved, job killed, a person's drain, a flow cut short, shadow mode) leaves the
node drained or untouched and no reservation behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from rsc_health.sim import qualify_tools as standin
from tests.fixtures.nodes.node_copy import copy_node

# The stand-in dcgmi's verdict is taken only where root (or the asker) listens at its --host
# (checks.dcgm.host_door): the suite's own listener stands in (conftest.hostengine_standin).
pytestmark = pytest.mark.slurm

HEALTHY_NVML = (Path(__file__).resolve().parents[1] / "fixtures" / "nodes" / "healthy"
                / "rsc_health" / "nvml.json")


def _bin(tmp: Path, name: str, *, busbw=231.0, missing=(), hang=()) -> Path:
    d = tmp / name
    d.mkdir()
    outputs = {"dcgmi": standin.dcgm_diag({"Memory": ["Pass"] * 8}),
               "all_reduce_perf": standin.nccl(busbw), "gpu_burn": standin.gpu_burn([16950.0] * 8)}
    for tool, out in outputs.items():
        if tool in missing:
            continue
        (d / f"{tool}.out").write_text(out)
        body = "exec sleep 120" if tool in hang else f'cat "{d}/{tool}.out"'
        (d / tool).write_text(f"#!/bin/sh\n{body}\n")
        (d / tool).chmod(0o755)
    return d


def _config(tmp: Path, host: str) -> list[str]:
    """Write tmp/config.toml, dcgmi asking nv-hostengine at `host`; the healthctl command line
    that reads it."""
    cfg = tmp / "config.toml"
    node_cmd = [sys.executable, "-m", "rsc_health.cli", "--config", str(cfg)]
    cfg.write_text(f"""
[gpu]
backend = "replay"
replay_file = "{HEALTHY_NVML}"
[slurm]
bin_dir = ""
[qualify]
full = ["dcgm", "nccl", "burn"]
min_peers = 4
tier_budget_s = 60
node_command = {json.dumps(node_cmd)}
flow_timeout_s = 90
[qualify.tests.dcgm]
plugin = "dcgm_diag"
command = ["dcgmi", "diag", "-r", "2", "-j", "--host", "{host}"]
timeout_s = 20
[qualify.tests.nccl]
plugin = "nccl_tests"
command = ["all_reduce_perf", "-g", "8"]
timeout_s = 20
[qualify.tests.burn]
plugin = "gpu_burn"
command = ["gpu_burn", "-tc", "60"]
timeout_s = 20
""")
    return node_cmd


def _healthctl(env: dict, node_cmd: list[str], db: str):
    def hc(*args, path_bin, extra_env=None):
        full = dict(env, RSC_HEALTH_DB=db, PATH=f"{path_bin}:{os.environ['PATH']}",
                    PYTHONPATH=str(Path(__file__).resolve().parents[2]), **(extra_env or {}))
        return subprocess.run([*node_cmd, *args], env=full, capture_output=True, text=True,
                              timeout=300)
    return hc


@pytest.fixture(scope="module")
def peer_history(_slurm_cluster_session, tmp_path_factory, hostengine_standin
                 ) -> Path:  # its directory
    """A historian holding the fleet's earlier passes (five peers, by `qualify run` on the
    stand-ins), made once for this module; every test starts from a copy of it."""
    tmp = tmp_path_factory.mktemp("qualify-peers")
    hc = _healthctl(_slurm_cluster_session.env, _config(tmp, hostengine_standin),
                    f"sqlite:///{tmp / 'history.db'}")
    assert hc("db", "upgrade", path_bin=_bin(tmp, "healthy")).returncode == 0
    for i, bw in enumerate((231.0, 230.2, 231.6, 229.9, 230.8)):  # the fleet's earlier passes
        hc("qualify", "run", "--node", f"peer{i}", path_bin=_bin(tmp, f"b{i}", busbw=bw))
    return tmp


@pytest.fixture
def qual(slurm_cluster, tmp_path, peer_history, hostengine_standin):
    c = slurm_cluster
    db = f"sqlite:///{tmp_path / 'history.db'}"
    node_cmd = _config(tmp_path, hostengine_standin)
    for name in ("history.db", "history.db-wal"):  # the writers have exited: no -shm needed
        if (peer_history / name).exists():
            shutil.copy(peer_history / name, tmp_path / name)
    healthy = _bin(tmp_path, "healthy")
    run = _healthctl(c.env, node_cmd, db)

    def hc(*args, path_bin=healthy, extra_env=None):
        return run(*args, path_bin=path_bin, extra_env=extra_env)

    engine = create_engine(db)

    def sql(q, **kw):
        with engine.connect() as conn:
            return conn.execute(text(q), kw).all()

    yield c, hc, sql, tmp_path
    for name in json.loads(json.dumps(_reservations(c))):
        if name.startswith("rsc_health_qualify_"):
            c.run(["scontrol", "delete", f"ReservationName={name}"], check=False)
    engine.dispose()


def _reservations(c) -> list[str]:
    out = c.run(["scontrol", "-o", "show", "reservation"], check=False).stdout
    return [tok.split("=", 1)[1] for line in out.splitlines() for tok in line.split()
            if tok.startswith("ReservationName=")]


def _ours(c, node, why="rsc_health:now:xid79:gpu3 fell off the bus"):
    c.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={why}"])


def test_a_repaired_node_passes_and_returns_to_service_with_a_stored_pass(qual):
    c, hc, sql, _ = qual
    _ours(c, "node02")
    out = hc("qualify", "start", "node02", "--json")
    [r] = json.loads(out.stdout)
    assert out.returncode == 0 and r["result"] == "pass", out.stdout + out.stderr
    assert "DRAIN" not in c.node_state("node02") and _reservations(c) == []
    [(verdict, job)] = sql("SELECT verdict, job_id FROM qualify_runs WHERE node = 'node02'")
    assert verdict == "pass" and job == r["job_id"]
    acts = [a for (a,) in sql("SELECT action FROM node_actions WHERE node = 'node02' "
                              "ORDER BY time")]
    assert acts == ["qualify_start", "qualify_release"]


def test_a_persons_resume_of_a_repair_drain_is_refused_until_qualification_passes(qual):
    """issue 24: `healthctl resume` of an rsc-health repair drain (xid79) with no stored pass
    since the drain is refused and points at `qualify start`; after the pass the node is in
    service (qualification resumed it), and a second drain is again refused until a pass."""
    c, hc, sql, _ = qual
    _ours(c, "node02")
    out = hc("resume", "node02")
    assert out.returncode == 1 and "qualify start node02" in out.stdout, out.stdout + out.stderr
    assert "DRAIN" in c.node_state("node02")
    out = hc("qualify", "start", "node02")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DRAIN" not in c.node_state("node02")
    _ours(c, "node02")  # failed again in production: the old pass predates this drain
    out = hc("resume", "node02")
    assert out.returncode == 1 and "no qualification pass since" in out.stdout, out.stdout
    assert hc("resume", "node02", "--force").returncode == 0
    assert "DRAIN" not in c.node_state("node02")


def test_a_slow_node_fails_and_is_drained_with_a_ticket_before_the_reservation_goes(qual):
    c, hc, sql, tmp = qual
    _ours(c, "node03")
    out = hc("qualify", "start", "node03", path_bin=_bin(tmp, "slow", busbw=231.0 * 0.94))
    assert out.returncode == 1 and "node03: fail" in out.stdout, out.stdout + out.stderr
    node = c.node("node03")
    assert "DRAIN" in node["State"] and node["Reason"].startswith("rsc_health:qualify:nccl")
    assert _reservations(c) == []
    assert sql("SELECT source FROM tickets WHERE node = 'node03'") == [("qualify",)]


def test_a_node_its_own_checks_would_drain_fails_before_any_test_and_stays_drained(qual):
    """The gate (rsc_health/qualify/gate.py): the node's kernel log holds an XID 79 the sweep
    has not consumed; every stand-in tool would pass, but the job's `qualify run` fails on the
    node's own checks before any test runs, and the flow drains it with a ticket."""
    c, hc, sql, tmp = qual
    root = copy_node(tmp / "node-root")
    with (root / "dev" / "kmsg").open("a") as fh:
        fh.write("3,1400,36500000000,-;NVRM: Xid (PCI:0000:5d:00): 79, pid=2814, "
                 "name=python3, GPU has fallen off the bus.\n")
    cfg = tmp / "config.toml"
    node_cmd = [sys.executable, "-m", "rsc_health.cli", "--config", str(cfg)]
    # The job reads that node (its NVML answers are the healthy fixture's: the same peers).
    cfg.write_text(cfg.read_text().replace(
        f"node_command = {json.dumps(node_cmd)}",
        f"node_command = {json.dumps([*node_cmd, '--root', str(root)])}").replace(
        f'replay_file = "{HEALTHY_NVML}"', 'replay_file = "rsc_health/nvml.json"'))
    burn = _bin(tmp, "marked")
    (burn / "gpu_burn").write_text(f'#!/bin/sh\ntouch "{burn}/ran"\ncat "{burn}/gpu_burn.out"\n')
    _ours(c, "node03")
    out = hc("qualify", "start", "node03", path_bin=burn)
    assert out.returncode == 1 and "node03: fail" in out.stdout, out.stdout + out.stderr
    node = c.node("node03")
    assert "DRAIN" in node["State"], node
    # Drained before the flow: the fail says since when it is out (the guard counts it so).
    assert re.match(r"rsc_health:qualify:node_checks:out since \S+Z xid79: gpu3 XID 79",
                    node["Reason"]), node["Reason"]
    assert "fallen off the bus" in node["Reason"]
    assert _reservations(c) == [] and not (burn / "ran").exists()
    [(verdict, reason)] = sql("SELECT verdict, reason FROM qualify_runs WHERE node = 'node03'")
    assert verdict == "fail" and reason.startswith("node_checks: xid79")
    assert sql("SELECT source FROM tickets WHERE node = 'node03'") == [("qualify",)]


def test_nothing_proved_or_a_killed_job_leaves_the_node_drained_never_in_service(qual):
    c, hc, sql, tmp = qual
    _ours(c, "node04")
    out = hc("qualify", "start", "node04", path_bin=_bin(tmp, "nogpuburn", missing=("gpu_burn",)))
    assert "node04: inconclusive" in out.stdout, out.stdout + out.stderr
    assert c.node("node04")["Reason"].startswith("rsc_health:qualify:inconclusive")

    _ours(c, "node05")
    hung = _bin(tmp, "hung", hang=("all_reduce_perf",))

    def kill_when_running():
        def running():
            jobs = c.run(["squeue", "-h", "-w", "node05", "-o", "%i %T"]).stdout.split()
            return jobs[0] if len(jobs) == 2 and jobs[1] == "RUNNING" else None
        job = c.wait_for(running, 60, "qualification job running")
        c.run(["scancel", job])

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    out = hc("qualify", "start", "node05", path_bin=hung)
    killer.join()
    assert "node05: inconclusive" in out.stdout and "no stored result" in out.stdout, out.stdout
    assert "DRAIN" in c.node_state("node05") and _reservations(c) == []


def test_a_persons_drain_is_refused_and_untouched(qual):
    c, hc, sql, _ = qual
    c.run(["scontrol", "update", "NodeName=node06", "State=DRAIN", "Reason=alice: BIOS update"])
    out = hc("qualify", "start", "node06")
    assert out.returncode == 1 and "node06: refused" in out.stdout
    assert c.node("node06")["Reason"].startswith("alice: BIOS update")
    assert _reservations(c) == [] and sql("SELECT * FROM node_actions") == []


def test_cleanup_drains_what_an_interrupted_flow_left_and_shadow_mode_touches_nothing(qual):
    c, hc, sql, tmp = qual
    c.run(["scontrol", "create", "reservation", "ReservationName=rsc_health_qualify_node01",
           "Nodes=node01", "StartTime=now", "Duration=infinite", "Users=root",
           "Flags=MAINT,IGNORE_JOBS"])
    young = hc("qualify", "cleanup")  # may be a flow still running: left alone
    assert "node01" not in young.stdout and _reservations(c) == ["rsc_health_qualify_node01"]
    out = hc("qualify", "cleanup", "--older-than", "0")
    assert "node01: inconclusive" in out.stdout, out.stdout + out.stderr
    assert c.node("node01")["Reason"].startswith("rsc_health:qualify:interrupted")
    assert _reservations(c) == []

    _ours(c, "node02")
    shadow = tmp / "shadow.toml"
    shadow.write_text("[actions]\nenabled = false\n")
    out = subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config", str(shadow),
                          "qualify", "start", "node02"],
                         env=dict(c.env, RSC_HEALTH_DB=f"sqlite:///{tmp / 'history.db'}"),
                         capture_output=True, text=True, timeout=60)
    assert "would_qualify" in out.stdout, out.stdout + out.stderr
    assert c.node("node02")["Reason"].startswith("rsc_health:now:xid79")
    assert _reservations(c) == []


def test_auto_qualifies_a_node_once_its_repair_ticket_closes(qual):
    c, hc, sql, _ = qual
    _ours(c, "node03")
    dry = hc("qualify", "auto", "--dry-run")
    assert "no node is due" in dry.stdout, dry.stdout + dry.stderr
    # Slurm stamps the drain to the second: a repair closes after it, never in the same second.
    time.sleep(1.1)
    assert hc("ticket", "open", "node03", "--reason", "RMA gpu3").returncode == 0
    [(ticket,)] = sql("SELECT id FROM tickets WHERE node = 'node03'")
    assert hc("ticket", "close", str(ticket)).returncode == 0
    assert sql("SELECT count(*) FROM tickets WHERE node = 'node03' AND closed IS NOT NULL") \
        == [(1,)]
    out = hc("qualify", "auto", "--json")
    doc = json.loads(out.stdout)
    assert [d["node"] for d in doc["due"]] == ["node03"], out.stdout + out.stderr
    assert doc["results"][0]["result"] == "pass"
    assert "DRAIN" not in c.node_state("node03") and _reservations(c) == []


def test_auto_qualifies_an_idle_suspect_undrained_pass_clears_fail_drains_nothing_proved_stays(
        qual):
    """Issue 24's suspect trigger: a suspect (rsc_health/suspects.py) is qualified as it is,
    never drained first; a pass leaves it in service and clears the episode, a run that
    proved nothing leaves it a suspect and undrained, a fail drains it and confirms it."""
    from datetime import UTC, datetime, timedelta

    from rsc_health.historian import suspects as hs
    from rsc_health.historian.failslow.evidence import SuspectEvidence

    c, hc, sql, tmp = qual
    with open(tmp / "config.toml", "a") as fh:
        fh.write('\n[suspects]\nqualify_tier = "full"\n')
    engine = create_engine(f"sqlite:///{tmp / 'history.db'}")
    now = datetime.now(UTC).replace(tzinfo=None)

    def suspect(node):
        hs.record(engine, [SuspectEvidence(
            node=node, metric="sm_clock_ratio", value=0.7, peer_median=0.99, deviation=8.0,
            since=now - timedelta(minutes=10), last=now, job_ids=("12",), source="telemetry",
            detail="gpu1 clocks held low")], now, expire_after=timedelta(hours=24))

    def state(node):
        return hs.of_node(engine, node, limit=1)[0].state.value

    try:
        suspect("node02")
        out = hc("qualify", "auto", "--json", path_bin=_bin(tmp, "nothing",
                                                            missing=("gpu_burn",)))
        doc = json.loads(out.stdout)
        assert [d["node"] for d in doc["due"]] == ["node02"], out.stdout + out.stderr
        assert doc["results"][0]["result"] == "inconclusive"
        assert c.node_state("node02") == "IDLE" and _reservations(c) == []
        hc("suspects", "apply")
        assert state("node02") == "suspect"

        out = hc("qualify", "auto", "--json")  # the back-off: not yet again
        assert json.loads(out.stdout)["due"] == [], out.stdout
        suspect("node03")
        out = hc("qualify", "auto", "--json")
        doc = json.loads(out.stdout)
        assert [d["node"] for d in doc["due"]] == ["node03"], out.stdout + out.stderr
        assert doc["results"][0]["result"] == "pass"
        assert c.node_state("node03") == "IDLE" and _reservations(c) == []
        hc("suspects", "apply")
        assert state("node03") == "cleared"

        suspect("node04")
        out = hc("qualify", "auto", "--json", path_bin=_bin(tmp, "slow4", busbw=231.0 * 0.94))
        assert json.loads(out.stdout)["results"][0]["result"] == "fail", out.stdout
        assert c.node("node04")["Reason"].startswith("rsc_health:qualify:nccl")
        hc("suspects", "apply")
        assert state("node04") == "confirmed"
    finally:
        engine.dispose()
        for node in ("node02", "node03", "node04"):  # what the tier set, as slurm.conf has it
            c.run(["scontrol", "update", f"NodeName={node}", "AvailableFeatures=",
                   "ActiveFeatures=", "Weight=1"], check=False)


def test_auto_qualifies_an_idle_node_whose_driver_changed_undrained_and_drains_it_on_a_fail(
        qual):
    """The driver/firmware-change trigger ([qualify] on_driver_change): heartbeats that said a
    new driver make an idle node due; it is qualified as it is, in service; a pass leaves it
    in service and not due again, a fail drains it with a ticket. Off, nothing is due."""
    from datetime import UTC, datetime, timedelta

    from rsc_health import spool
    from rsc_health.historian.ingest.delivery import deliver

    c, hc, sql, tmp = qual
    engine = create_engine(f"sqlite:///{tmp / 'history.db'}")
    t0 = datetime.now(UTC) - timedelta(minutes=30)
    d = tmp / "spool"
    d.mkdir()
    # node02's new driver is seen first, node04's five minutes later.
    spool.append(d, [spool.record("heartbeat", node, t0 + timedelta(minutes=k + later),
                                  source="sweep", level="ok", checker_errors=0, duration_s=0.3,
                                  families={}, version="t",
                                  versions={"driver": drv, "vbios": {"0": "96.00.AF.00.01"}})
                     for node, later in (("node02", 0), ("node04", 5))
                     for k, drv in enumerate(("570.133.20", "580.95.05"))])
    try:
        assert deliver(engine, d).quarantined_count == 0
        off = hc("qualify", "auto", "--json")
        assert json.loads(off.stdout)["due"] == [], off.stdout + off.stderr
        cfg = tmp / "config.toml"
        cfg.write_text(cfg.read_text().replace(
            "[qualify]\n", "[qualify]\non_driver_change = true\nauto_max_nodes = 1\n", 1))
        out = hc("qualify", "auto", "--json")
        doc = json.loads(out.stdout)
        assert [x["node"] for x in doc["due"]] == ["node02"], out.stdout + out.stderr
        assert "driver=570.133.20" in doc["due"][0]["why"]
        assert doc["results"][0]["result"] == "pass"
        assert c.node_state("node02") == "IDLE" and _reservations(c) == []
        out = hc("qualify", "auto", "--json", path_bin=_bin(tmp, "slow_drv", busbw=231.0 * 0.94))
        doc = json.loads(out.stdout)
        assert [x["node"] for x in doc["due"]] == ["node04"], out.stdout + out.stderr
        assert doc["results"][0]["result"] == "fail"
        assert c.node("node04")["Reason"].startswith("rsc_health:qualify:nccl")
        assert _reservations(c) == []
        assert sql("SELECT count(*) FROM tickets WHERE node = 'node04'") == [(1,)]
        again = hc("qualify", "auto", "--json")
        assert json.loads(again.stdout)["due"] == [], again.stdout
    finally:
        engine.dispose()


def test_qualify_start_takes_three_nodes_side_by_side_and_releases_each_on_its_own_pass(qual):
    """`qualify start` with --parallel: three reservations and three qualification jobs at
    once on the real cluster (their results written into one SQLite historian together);
    each node back in service on its own stored pass, no reservation left."""
    c, hc, sql, _ = qual
    nodes = ("node02", "node03", "node04")
    for node in nodes:
        _ours(c, node)
    out = hc("qualify", "start", "node[02-04]", "--parallel", "3", "--json")
    results = json.loads(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [(r["node"], r["result"]) for r in results] == [(n, "pass") for n in nodes]
    assert all("DRAIN" not in c.node_state(n) for n in nodes) and _reservations(c) == []
    runs = sql("SELECT node, verdict, job_id FROM qualify_runs WHERE node IN "
               "('node02', 'node03', 'node04') ORDER BY node")
    assert [(n, v) for n, v, _ in runs] == [(n, "pass") for n in nodes]
    assert [j for _, _, j in runs] == [r["job_id"] for r in results]
    # Side by side: every job had started before the first one's pass was stored.
    starts = sql("SELECT time FROM node_actions WHERE action = 'qualify_start' AND node IN "
                 "('node02', 'node03', 'node04') ORDER BY time")
    ends = sql("SELECT min(ended) FROM qualify_runs WHERE node IN "
               "('node02', 'node03', 'node04')")
    assert len(starts) == 3 and str(starts[-1][0]) < str(ends[0][0])


def test_a_node_qualification_keeps_proving_nothing_about_gets_a_ticket_not_endless_retries(
        qual):
    """A node whose qualification proves nothing for the same reason run after run (a tool
    that is missing there, a GPU the tool cannot use) is broken in a way no run will prove:
    after [qualify] inconclusive_ticket_after runs in a row (4, the default) `qualify auto`
    opens a repair ticket, says so in the node's drain reason and stops retrying it; the
    ticket's closing makes it due at once (the back-off is the broken node's, not the
    repaired one's). Before, it was retried with back-off forever and no ticket."""
    c, hc, sql, tmp = qual
    _ours(c, "node04")
    broken = _bin(tmp, "nogpuburn", missing=("gpu_burn",))
    for _ in range(4):
        out = hc("qualify", "start", "node04", path_bin=broken)
        assert "node04: inconclusive" in out.stdout, out.stdout + out.stderr
    assert sql("SELECT count(*) FROM tickets WHERE node = 'node04'") == [(0,)]
    for _ in range(2):  # the second auto opens no second ticket
        out = hc("qualify", "auto", "--json", path_bin=broken)
        doc = json.loads(out.stdout)
        assert doc["due"] == [], out.stdout + out.stderr
    [(ticket, source, why)] = sql("SELECT id, source, reason FROM tickets WHERE node = 'node04'")
    assert source == "qualify" and "4 inconclusive runs in a row" in why, why
    assert "burn: tool not found" in why
    node = c.node("node04")
    assert "DRAIN" in node["State"] and node["Reason"].startswith(
        "rsc_health:qualify:inconclusive:"), node
    assert "ticket" in node["Reason"], node["Reason"]
    assert _reservations(c) == []

    time.sleep(1.1)  # Slurm and the historian stamp to the second
    assert hc("ticket", "close", str(ticket)).returncode == 0
    out = hc("qualify", "auto", "--json")  # repaired: gpu_burn is there now
    doc = json.loads(out.stdout)
    assert [d["node"] for d in doc["due"]] == ["node04"], out.stdout + out.stderr
    assert doc["results"][0]["result"] == "pass"
    assert "DRAIN" not in c.node_state("node04") and _reservations(c) == []


def test_a_node_that_dies_mid_qualification_fails_and_no_requeued_attempt_passes_it(qual):
    """The node stops answering mid-run (slurmd gone: a hang under the stress; here the run's
    own process frozen with it) and comes back: Slurm ends the qualification job NODE_FAIL.
    Submitted without --no-requeue, JobRequeue=1 started it again in the reservation that
    still stood, and the second attempt's pass under the same job id released the node. Now
    there is no second attempt, and the NODE_FAIL is the node's finding: drained with
    `node_fail` (not a code `qualify auto` retries) and a repair ticket."""
    import signal

    c, hc, sql, tmp = qual
    _ours(c, "node05")
    d = _bin(tmp, "dies")
    first = d / "first_attempt"  # the first attempt's `qualify run`, frozen
    (d / "all_reduce_perf").write_text(
        f'#!/bin/sh\nif [ -e "{first}" ]; then exec cat "{d}/all_reduce_perf.out"; fi\n'
        f'echo $PPID > "{first}.tmp" && mv "{first}.tmp" "{first}"\n'
        'kill -STOP $PPID\nexec sleep 300\n')

    def node_dies_and_comes_back():
        c.wait_for(first.exists, 90, "the first attempt in its nccl test")
        c._stop_proc("slurmd-node05")
        c.wait_for(lambda: "DOWN" in c.node_state("node05"), 60, "node05 DOWN")
        c.start_slurmd("node05")

    t = threading.Thread(target=node_dies_and_comes_back)
    t.start()
    try:
        out = hc("qualify", "start", "node05", "--timeout", "150", path_bin=d)
    finally:
        t.join()
        try:
            os.kill(int(first.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # gone with its job, as slurmd's return kills it
    assert "node05: pass" not in out.stdout, out.stdout + out.stderr
    assert "node05: fail" in out.stdout and "NODE_FAIL" in out.stdout, out.stdout + out.stderr
    node = c.node("node05")
    assert "DRAIN" in node["State"], node
    assert node["Reason"].startswith("rsc_health:qualify:node_fail:"), node["Reason"]
    assert sql("SELECT source FROM tickets WHERE node = 'node05'") == [("qualify",)]
    assert _reservations(c) == []


def test_a_node_in_a_persons_reservation_is_refused_and_left_out_of_qualify_auto(
        qual, monkeypatch):
    """A person's maintenance reservation (node[03-04], active) and a debug session booked to
    start within the flow's timeout (node05): Slurm 22.05 shows the nodes IDLE (+DRAIN) and
    accepts the flow's MAINT,IGNORE_JOBS reservation over either, so `qualify start` resumed
    them and ran its job there, and `qualify auto`'s candidates took the idle one. Refused in
    words now, nothing touched; Slurm's Nodes= hostlist is read node by node."""
    from rsc_health.qualify.flow import FINISH_SLACK_S, reserved_by_others
    from rsc_health.slurm.cli_backend import CliSlurm

    c, hc, sql, _ = qual
    _ours(c, "node03")
    _ours(c, "node05")
    made = ["alice_fw_flash", "bob_debug"]
    c.run(["scontrol", "create", "reservation", "ReservationName=alice_fw_flash",
           "Nodes=node[03-04]", "StartTime=now", "Duration=120", "Users=slurm", "Flags=MAINT"])
    c.run(["scontrol", "create", "reservation", "ReservationName=bob_debug", "Nodes=node05",
           "StartTime=now+60", "Duration=60", "Users=slurm", "Flags=IGNORE_JOBS"])
    try:
        monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
        held = reserved_by_others(CliSlurm().reservations(), horizon_s=90 + FINISH_SLACK_S)
        assert set(held) == {"node03", "node04", "node05"}, held
        out = hc("qualify", "start", "node03,node05", "--json")
        results = {r["node"]: r for r in json.loads(out.stdout)}
        assert out.returncode == 1, out.stdout + out.stderr
        assert results["node03"]["result"] == "refused" \
            and "alice_fw_flash" in results["node03"]["detail"], results
        assert results["node05"]["result"] == "refused" \
            and "bob_debug" in results["node05"]["detail"], results
        assert sql("SELECT * FROM qualify_runs WHERE node IN ('node03', 'node05')") == []
        for n in ("node03", "node05"):
            assert c.node(n)["Reason"].startswith("rsc_health:now:xid79"), c.node(n)
        assert sorted(_reservations(c)) == made
    finally:
        for name in made:
            c.run(["scontrol", "delete", f"ReservationName={name}"], check=False)
