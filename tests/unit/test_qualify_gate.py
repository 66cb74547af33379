"""`healthctl qualify run` is gated on the node's own checks (rsc_health/qualify/gate.py): a node
the node path would drain (7 of 8 GPUs, an XID 79 in the kernel log) never passes, whatever the
tier measures; a checker error is inconclusive; warnings are shown and do not block; a healthy
node passes with the same figures. Real fixture node roots (tests/fixtures/nodes/healthy,
copied and broken), the stand-in tools of test_qualify_run."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from rsc_health.cli import cli
from tests.fixtures.nodes.node_copy import HEALTHY, NODE_STATE, copy_node
from tests.unit.test_qualify_run import CONFIG, Node

GPU3_PCI = "0000:5d:00"  # gpu3 in the healthy fixture
# A tier of gpu_burn alone: it measures the GPUs it finds, and 7 of 8 look fine.
BURN_ONLY = CONFIG.replace('full = ["dcgm", "nccl", "burn"]', 'full = ["burn"]', 1)
XID79 = f"3,1400,36500000000,-;NVRM: Xid (PCI:{GPU3_PCI}): 79, pid=2814, name=python3, " \
        "GPU has fallen off the bus.\n"
XID13 = f"3,1401,36500000001,-;NVRM: Xid (PCI:{GPU3_PCI}): 13, pid='<unknown>', " \
        "name=<unknown>, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n"


def _config(tmp: Path, tier_text: str = BURN_ONLY, name: str = "config") -> Path:
    """The fixture node's expected hardware (its config.toml) plus the qualification tier."""
    cfg = tmp / f"{name}.toml"
    cfg.write_text((HEALTHY / "config.toml").read_text() + tier_text)
    return cfg


def _root(tmp: Path, name: str) -> Path:
    return copy_node(tmp / f"root-{name}")


def _nvml(root: Path, edit) -> None:
    p = root / "rsc_health" / "nvml.json"
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc))


def _qualify(node: Node, cfg: Path, db: str, root: Path, *extra: str):
    old = dict(os.environ)
    os.environ.update({"PATH": f"{node.bin}:/usr/bin:/bin", "RSC_HEALTH_DB": db})
    try:
        return CliRunner().invoke(cli, ["--config", str(cfg), "--root", str(root), "qualify",
                                        "run", "--node", node.name, "--gpu-model",
                                        "NVIDIA H100 80GB HBM3", "--driver", "570.124.06",
                                        "--json", *extra])
    finally:
        os.environ.clear()
        os.environ.update(old)


def _marked(node: Node, tool: str = "gpu_burn") -> Path:
    """The stand-in tool leaves a mark when it runs."""
    marker = node.bin / f"{tool}.ran"
    script = node.bin / tool
    script.write_text(f'#!/bin/sh\ntouch "{marker}"\ncat "{node.bin}/{tool}.out"\n')
    return marker


def _setup(tmp: Path):
    """A historian and five healthy peers that passed (or bootstrapped) the tier."""
    cfg = _config(tmp)
    db = f"sqlite:///{tmp / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    healthy = _root(tmp, "healthy")
    peers = [_qualify(Node(tmp, f"gpu{i:03d}"), cfg, db, healthy) for i in range(5)]
    assert [r.exit_code for r in peers] == [4, 4, 4, 4, 0], [r.output[-300:] for r in peers]
    return cfg, db


def _runs(db: str, node: str) -> list[tuple[str, str]]:
    engine = create_engine(db)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT verdict, reason FROM qualify_runs WHERE node = :n"), {"n": node})]
    finally:
        engine.dispose()


def test_a_node_showing_7_of_8_gpus_fails_a_gpu_burn_only_tier_before_any_test_runs(tmp_path):
    cfg, db = _setup(tmp_path)
    root = _root(tmp_path, "seven")
    _nvml(root, lambda d: (d["devices"].pop(), d.update(device_count=7)))
    node = Node(tmp_path, "gpu100", gflops=(16950.0,) * 7)  # gpu_burn finds seven, all fast
    ran = _marked(node)
    res = _qualify(node, cfg, db, root)
    doc = json.loads(res.output)
    assert res.exit_code == 3 and doc["verdict"] == "fail", res.output[-600:]
    assert doc["reason"].startswith("node_checks: gpu_missing on gpus: 7 of 8 GPUs visible")
    assert not ran.exists() and doc["results"] == []
    assert [(f["code"], f["severity"]) for f in doc["node_checks"]] == [
        ("gpu_missing", "drain_now")]
    [(verdict, reason)] = _runs(db, "gpu100")  # recorded like any fail: the flow drains on it
    assert verdict == "fail" and "gpu_missing" in reason


def test_an_xid79_in_the_kernel_log_fails_qualification_and_moves_no_cursor(tmp_path):
    cfg, db = _setup(tmp_path)
    root = _root(tmp_path, "xid79")
    with (root / "dev" / "kmsg").open("a") as fh:
        fh.write(XID79)
    node = Node(tmp_path, "gpu101")
    ran = _marked(node)
    res = _qualify(node, cfg, db, root, "--no-record")  # --no-record still judges
    doc = json.loads(res.output)
    assert res.exit_code == 3 and doc["verdict"] == "fail", res.output[-600:]
    assert doc["reason"] == "node_checks: xid79: gpu3 XID 79 GPU has fallen off the bus"
    assert not ran.exists()
    assert _runs(db, "gpu101") == []
    # Read-only: the XID stays new for the sweep, which consumes and acts on it.
    assert not (root / NODE_STATE).exists()
    again = _qualify(node, cfg, db, root)
    assert again.exit_code == 3 and [v for v, _ in _runs(db, "gpu101")] == ["fail"]


def test_a_checker_error_is_inconclusive_never_a_pass(tmp_path):
    cfg, db = _setup(tmp_path)
    root = _root(tmp_path, "nvml-timeout")
    _nvml(root, lambda d: d["devices"][2]["remapped_rows"].update(
        pending={"error": "NVML_ERROR_TIMEOUT"}))
    node = Node(tmp_path, "gpu102")
    ran = _marked(node)
    res = _qualify(node, cfg, db, root)
    doc = json.loads(res.output)
    assert res.exit_code == 4 and doc["verdict"] == "inconclusive", res.output[-600:]
    assert doc["reason"].startswith("node_checks: the node's checks could not look")
    # The tests still ran (a fault they find would fail it), every metric passed: not a pass.
    assert ran.exists() and {r["status"] for r in doc["results"]} == {"pass"}
    assert [v for v, _ in _runs(db, "gpu102")] == ["inconclusive"]


def test_a_healthy_node_passes_with_the_same_figures_and_a_warning_does_not_block(tmp_path):
    cfg, db = _setup(tmp_path)
    node = Node(tmp_path, "gpu103")
    res = _qualify(node, cfg, db, _root(tmp_path, "ok"))
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["verdict"] == "pass", res.output[-600:]
    assert doc["node_checks"] == [] and [o["test"] for o in doc["outcomes"]] == ["burn"]
    burn = sorted((r["index"], r["value"], r["status"]) for r in doc["results"])
    assert burn == [(str(i), 16950.0, "pass") for i in range(8)]

    warned = _root(tmp_path, "xid13")
    with (warned / "dev" / "kmsg").open("a") as fh:
        fh.write(XID13)
    res = _qualify(Node(tmp_path, "gpu104"), cfg, db, warned)
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["verdict"] == "pass", res.output[-600:]
    assert [(f["code"], f["status"]) for f in doc["node_checks"]] == [("xid13", "warn")]
    assert sorted((r["index"], r["value"]) for r in doc["results"]) == \
        [(i, v) for i, v, _ in burn]
    text_out = _qualify(Node(tmp_path, "gpu105"), cfg, db, warned, "--no-record")
    assert text_out.exit_code == 0


def test_gate_families_choose_which_checks_gate_and_cannot_be_emptied(tmp_path):
    _cfg, db = _setup(tmp_path)
    only_xid = _config(tmp_path, BURN_ONLY.replace(
        "[qualify]\n", '[qualify]\ngate_families = ["xid"]\n', 1), "only_xid")
    root = _root(tmp_path, "seven")
    _nvml(root, lambda d: (d["devices"].pop(), d.update(device_count=7)))
    res = _qualify(Node(tmp_path, "gpu106", gflops=(16950.0,) * 7), only_xid, db, root)
    # The gpu family does not gate here: no node check fails it; the 7 GPUs gpu-burn tested
    # of [gpu] count 8, still never pass (verdict.missing).
    doc = json.loads(res.output)
    assert res.exit_code == 4 and doc["node_checks"] == [], res.output[-600:]
    assert "burn: the tool ran on 7 of 8 GPUs ([gpu] count)" in doc["reason"]
    with (root / "dev" / "kmsg").open("a") as fh:
        fh.write(XID79)
    res = _qualify(Node(tmp_path, "gpu107", gflops=(16950.0,) * 7), only_xid, db, root)
    assert res.exit_code == 3 and "xid79" in json.loads(res.output)["reason"]
    for bad, said in (("[]", "at least one check family"), ('["gpu", "xdi"]', "xdi")):
        broken = _config(tmp_path, BURN_ONLY.replace(
            "[qualify]\n", f"[qualify]\ngate_families = {bad}\n", 1), "broken")
        res = _qualify(Node(tmp_path, "gpu108"), broken, db, root)
        assert res.exit_code == 1 and said in res.output, res.output[-400:]


def test_an_xid_the_stress_itself_raises_fails_the_run_though_every_figure_passes(tmp_path):
    """The checks look again after the tests: a GPU that logs an XID 48 (DBE) under gpu_burn
    while gpu_burn still prints healthy figures is a node the epilog would drain, never a pass."""
    cfg, db = _setup(tmp_path)
    root = _root(tmp_path, "dbe")
    node = Node(tmp_path, "gpu109")
    xid48 = (f"3,1500,36600000000,-;NVRM: Xid (PCI:{GPU3_PCI}): 48, pid=2814, name=gpu_burn, "
             "An uncorrectable double bit error (DBE) has been detected on GPU in the "
             "framebuffer at partition 6, subpartition 0.")
    (node.bin / "gpu_burn").write_text(
        f'#!/bin/sh\necho "{xid48}" >> "{root}/dev/kmsg"\ncat "{node.bin}/gpu_burn.out"\n')
    res = _qualify(node, cfg, db, root)
    doc = json.loads(res.output)
    assert res.exit_code == 3 and doc["verdict"] == "fail", res.output[-600:]
    assert {r["status"] for r in doc["results"]} == {"pass"}  # every figure was fine
    assert doc["reason"].startswith("node_checks_after: xid48: gpu3 XID 48")
    assert doc["node_checks"] == [] and [f["code"] for f in doc["node_checks_after"]] == ["xid48"]
    assert [v for v, _ in _runs(db, "gpu109")] == ["fail"]


# ---- the node path's pending drain verdict ----------------------------------------------------

def _prolog_with_slurm_away(root: Path, cfg: Path, node: str, monkeypatch) -> int:
    """The real prolog on `root`, slurmctld stopped: it sees the XID, consumes it (cursor
    advanced, the event spooled), cannot drain and keeps the verdict in pending_verdict.json."""
    from rsc_health import nodepath
    from rsc_health.slurm.memory import MemorySlurm

    slurm = MemorySlurm([node])
    slurm.stop()
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(cfg))
    monkeypatch.setenv("SLURMD_NODENAME", node)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for name in ("SLURM_JOBID", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    try:
        return nodepath.run_stage("prolog", slurm_factory=lambda c, deadline: slurm)
    finally:
        for name in ("RSC_HEALTH_ROOT", "RSC_HEALTH_CONFIG", "SLURMD_NODENAME", "SLURM_JOB_ID"):
            monkeypatch.delenv(name)


def _pending_file(root: Path) -> Path:
    from rsc_health.node.store import PENDING_VERDICT_FILE

    return root / NODE_STATE / PENDING_VERDICT_FILE


def test_a_drain_verdict_the_prolog_could_not_carry_out_fails_qualification_before_any_test(
        tmp_path, monkeypatch):
    """An XID 79 seen by the prolog while slurmctld was away: the prolog kept the drain
    verdict pending and its cursor moved past the XID's kmsg line. The gate's fresh look sees
    nothing, and the node was qualified back to service. The pending verdict is a drain-level
    finding now, named with when it was recorded; the gate leaves the file as it found it."""
    cfg, db = _setup(tmp_path)
    root = _root(tmp_path, "pending")
    with (root / "dev" / "kmsg").open("a") as fh:
        fh.write(XID79)
    assert _prolog_with_slurm_away(root, cfg, "gpu110", monkeypatch) == 1
    pending = _pending_file(root)
    kept = pending.read_bytes()
    recorded = datetime.fromisoformat(json.loads(kept)["time"])
    node = Node(tmp_path, "gpu110")
    ran = _marked(node)
    res = _qualify(node, cfg, db, root)
    doc = json.loads(res.output)
    assert res.exit_code == 3 and doc["verdict"] == "fail", res.output[-600:]
    assert doc["reason"] == (
        "node_checks: pending_drain on pending_verdict.json: drain verdict kept since "
        f"{recorded:%Y-%m-%dT%H:%M:%SZ} (Slurm unavailable), not carried out yet: "
        "rsc_health:now:xid79:gpu3 XID 79 GPU has fallen off the bus"), doc["reason"]
    assert not ran.exists() and doc["results"] == []
    # The fresh look saw no XID (the prolog consumed it): the pending verdict alone failed it.
    assert [(f["code"], f["severity"]) for f in doc["node_checks"]] == [
        ("pending_drain", "drain_now")]
    assert pending.read_bytes() == kept  # read-only: still there for the next sweep
    [(verdict, reason)] = _runs(db, "gpu110")
    assert verdict == "fail" and "xid79" in reason


def test_a_pending_verdict_a_worse_fresh_one_supersedes_is_not_named(tmp_path):
    """The node path merges the pending causes into each run's verdict, the worst level
    winning (policy.decide), and forgets the file once that verdict is carried out: a fresh
    drain-now supersedes a pending drain-after-job. The gate follows the same rule: the
    fresh finding is named, not the pending one. Not superseded (same level, or worse than the
    fresh look), the pending verdict is named."""
    from rsc_health.model import Finding, Level, Status, Verdict
    from rsc_health.node.store import save_pending

    cfg, db = _setup(tmp_path)
    remap = Finding("remap", "gpu2", Status.FAIL, Level.DRAIN_AFTER_JOB,
                    "gpu2 row remapping pending", "remap_pending")
    root = _root(tmp_path, "seven-and-pending")
    _nvml(root, lambda d: (d["devices"].pop(), d.update(device_count=7)))
    save_pending(root / NODE_STATE, Verdict(Level.DRAIN_AFTER_JOB, "", (remap,)),
                 why="guard", holds=2)
    res = _qualify(Node(tmp_path, "gpu111", gflops=(16950.0,) * 7), cfg, db, root)
    doc = json.loads(res.output)
    assert res.exit_code == 3, res.output[-600:]
    assert [f["code"] for f in doc["node_checks"]] == ["gpu_missing"]

    healthy = _root(tmp_path, "pending-only")
    save_pending(healthy / NODE_STATE, Verdict(Level.DRAIN_AFTER_JOB, "", (remap,)),
                 why="guard", holds=2)
    res = _qualify(Node(tmp_path, "gpu112"), cfg, db, healthy)
    doc = json.loads(res.output)
    assert res.exit_code == 3, res.output[-600:]
    assert [(f["code"], f["severity"]) for f in doc["node_checks"]] == [
        ("pending_drain", "drain_after_job")]
    assert "(mass-drain guard), not carried out yet: " \
        "rsc_health:job:remap_pending:gpu2 row remapping pending" in doc["reason"]
    assert "mass-drain guard" in doc["reason"]


@pytest.mark.parametrize("kind", ["garbled", "nested", "fifo", "dev_zero", "not_a_drain"])
def test_a_pending_file_the_node_path_would_discard_does_not_block_and_is_left_alone(
        tmp_path, kind):
    """What load_pending discards (garbled JSON, a FIFO, a symlink to /dev/zero) or what never
    drains (a level below drain) blocks nothing, as in the node path; the gate reads it
    without hanging and neither removes nor rewrites it (the node path's own next run does)."""
    cfg, db = _setup(tmp_path)
    root = _root(tmp_path, kind)
    path = _pending_file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "garbled":
        path.write_text('{"level": 3, "causes": [{"family": 7')
    elif kind == "nested":  # deeper than the JSON decoder goes
        path.write_text("[" * 200_000)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(json.dumps({"level": 1, "why": "fault", "time": "2026-11-27T10:00:00+00:00",
                                    "causes": []}))
    res = _qualify(Node(tmp_path, "gpu113"), cfg, db, root)
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["verdict"] == "pass", res.output[-600:]
    codes = [(f["code"], f["status"]) for f in doc["node_checks"]]
    assert codes == ([] if kind == "not_a_drain" else [("pending_unreadable", "warn")]), codes
    assert path.is_symlink() if kind == "dev_zero" else path.exists()


def test_a_symlinked_pending_file_is_followed_as_the_node_path_follows_it(tmp_path):
    """load_pending reads through a symlink at pending_verdict.json (the state dir is
    root's, 0755): so does the gate, and the verdict it holds blocks."""
    from rsc_health.model import Finding, Level, Status, Verdict
    from rsc_health.node.store import PENDING_VERDICT_FILE, save_pending

    cfg, db = _setup(tmp_path)
    root = _root(tmp_path, "linked")
    elsewhere = tmp_path / "kept"
    elsewhere.mkdir()
    dbe = Finding("ecc", "gpu5", Status.FAIL, Level.DRAIN_NOW, "gpu5 DBE", "ecc_dbe")
    save_pending(elsewhere, Verdict(Level.DRAIN_NOW, "", (dbe,)), why="foreign_drain")
    _pending_file(root).parent.mkdir(parents=True, exist_ok=True)
    _pending_file(root).symlink_to(elsewhere / PENDING_VERDICT_FILE)
    res = _qualify(Node(tmp_path, "gpu114"), cfg, db, root)
    assert res.exit_code == 3 and "ecc_dbe" in json.loads(res.output)["reason"], res.output
