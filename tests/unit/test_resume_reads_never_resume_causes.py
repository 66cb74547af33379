"""`healthctl resume` asks a qualification pass for a drain that holds a cause never
auto-resumed, whichever cause the verdict listed first and whenever it was found under the
drain: it reads the code Slurm's reason leads with (the node's own record is on the node), so
the node path leads a drain's reason with such a cause, and `resume` asks the historian for
one found under or before a drain whose reason names a transient fault (helper-208)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

import rsc_health.commands.slurm as cs
from rsc_health.cli import cli
from rsc_health.config import load_config
from rsc_health.historian.schema import check_results, node_actions, qualify_runs
from rsc_health.model import ActionKind
from rsc_health.slurm.memory import MemorySlurm
from tests.unit.conftest import run_slurm_command

_run = run_slurm_command


def test_resume_of_a_drain_whose_never_resume_code_is_not_the_first_cause(tmp_path,
                                                                          monkeypatch):
    """A GPU fell off the bus: the gpu family (first in the engine's order) says NVML cannot
    reach it (gpu_inaccessible) and the xid family finds XID 79, both drain-now. The node
    path drains with the first cause's code, `...:gpu_inaccessible:... (+1 more)`, and keeps
    the drain as a repair (xid79 is a never-resume code). `healthctl resume` reads only the
    reason's code, finds no never-resume code, and puts the node back with no qualification
    pass (no historian configured: it could not even have looked for one)."""
    from rsc_health.actions import Actor
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide

    findings = [
        Finding("gpu", "gpu3", Status.FAIL, Severity.DRAIN_NOW,
                "NVML_ERROR_UNKNOWN reading GPU 3", "gpu_inaccessible", repair=True),
        Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW,
                "Xid 79: GPU has fallen off the bus", "xid79", repair=True),
    ]
    verdict = decide(findings)
    assert verdict.reason.startswith("rsc_health:now:gpu_inaccessible:"), verdict.reason
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE")
    site = tmp_path / "node.toml"
    site.write_text("")
    Actor(slurm, load_config(site), "gpu042", tmp_path / "state").apply(verdict)
    assert slurm.info["gpu042"].drain_set
    assert slurm.info["gpu042"].reason.startswith("rsc_health:now:xid79:")
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu042"], site="")
    assert slurm.info["gpu042"].drain_set, (
        f"an XID 79 drain lifted by `healthctl resume` with no qualification pass: {res.output}")


def _check(engine, node, code, when, status="fail"):
    with engine.begin() as conn:
        conn.execute(insert(check_results).values(
            id=uuid.uuid4().hex, time=when, node=node, source="sweep", check="xid",
            component="gpu5", status=status, severity="drain_now", code=code,
            reason="Xid 48: double-bit ECC error"))


@pytest.mark.parametrize("found", ["under", "before"])
def test_resume_of_a_transient_drain_with_a_never_resume_fault_on_record_asks_a_pass(
        db, monkeypatch, found):
    """02:00 /scratch goes missing: drain-now `rsc_health:now:mount_missing:...`. 02:10 the
    sweep reads an XID 48 (double-bit ECC) under that drain (or it was found at 01:50 and the
    mount's drain-now escalated over its after-job drain): the node's record keeps it from
    auto-resume and its line is consumed, but Slurm's reason says mount_missing. 03:00 the
    operator remounts /scratch and runs `healthctl resume`: the historian has the XID 48 since
    the node was last put back, and no pass after it: sent to qualification (helper-208,
    helper-211). Setting the drain again to lead with it moved Slurm's reason time, which the
    mass-drain guard counts as a drain made now."""
    url, engine = db
    drained = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", "rsc_health:now:mount_missing:/scratch not mounted",
                   when=drained)
    at = drained + (timedelta(minutes=10) if found == "under" else -timedelta(minutes=10))
    _check(engine, "gpu042", "xid48", at.replace(tzinfo=None))
    out = _cli(url, slurm, monkeypatch, "resume", "gpu042")
    assert out.exit_code == 1, out.output
    assert "xid48 was found on it" in out.output and "qualify start gpu042" in out.output
    assert slurm.info["gpu042"].drain_set


def test_a_fault_behind_a_resume_or_a_pass_after_it_does_not_hold_a_transient_drain(
        db, monkeypatch):
    """The XID 48 of an earlier episode, before the node's last resume, is not this drain's;
    nor one a qualification pass came after."""
    url, engine = db
    now = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    slurm = MemorySlurm()
    reason = "rsc_health:now:mount_missing:/scratch not mounted"
    slurm.add_node("resumed", "IDLE+DRAIN", reason, when=datetime.now(UTC) - timedelta(hours=1))
    slurm.add_node("passed", "IDLE+DRAIN", reason, when=datetime.now(UTC) - timedelta(hours=1))
    _check(engine, "resumed", "xid48", now - timedelta(days=3))
    _check(engine, "passed", "xid48", now - timedelta(hours=3))
    with engine.begin() as conn:
        conn.execute(insert(node_actions).values(
            id=uuid.uuid4().hex, time=now - timedelta(days=2), node="resumed",
            action=ActionKind.RESUME.value, reason="rsc_health:now:xid48:gpu5 (by alice)"))
        conn.execute(insert(qualify_runs).values(
            run_id=uuid.uuid4().hex, node="passed", tier="full",
            started=now - timedelta(hours=2, minutes=9), ended=now - timedelta(hours=2),
            verdict="pass", reason="", gpu_model="NVIDIA H100 80GB HBM3", driver="550.54.15",
            job_id="77"))
    out = _cli(url, slurm, monkeypatch, "resume", "resumed,passed")
    assert out.exit_code == 0, out.output


def test_without_a_historian_a_transient_drain_resumes_as_its_reason_says(
        tmp_path, monkeypatch):
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", "rsc_health:now:mount_missing:/scratch not mounted")
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu042"], site="")
    assert res.exit_code == 0, res.output
    assert not slurm.info["gpu042"].drain_set



def _cli(url, slurm, monkeypatch, *args):
    monkeypatch.setattr("rsc_health.commands.slurm._slurm", lambda ctx: slurm)
    monkeypatch.setenv("SUDO_USER", "alice")
    res = CliRunner().invoke(cli, ["--db", url, *args])
    print(res.output)
    return res

def test_a_persons_drain_over_a_transient_drain_does_not_lose_the_xid48_under_it(
        db, monkeypatch):
    """02:00 /scratch goes missing: `rsc_health:now:mount_missing:...`. 02:10 the sweep reads
    an XID 48 under that drain (the historian has it; Slurm's reason still says
    mount_missing). The operator marks the node as hers while she remounts (`healthctl drain
    gpu042 --reason 'remounting /scratch'`): her drain goes over the XID 48 as over_xid48,
    and her `healthctl resume` asks the qualification pass (helper-214)."""
    url, engine = db
    drained = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", "rsc_health:now:mount_missing:/scratch not mounted",
                   when=drained)
    _check(engine, "gpu042", "xid48", (drained + timedelta(minutes=10)).replace(tzinfo=None))
    # control: resumed straight away, it is refused (1029dbf)
    out = _cli(url, slurm, monkeypatch, "resume", "gpu042")
    assert out.exit_code == 1 and slurm.info["gpu042"].drain_set, out.output
    out = _cli(url, slurm, monkeypatch, "drain", "gpu042", "--reason", "remounting /scratch")
    assert out.exit_code == 0, out.output
    out = _cli(url, slurm, monkeypatch, "resume", "gpu042")
    assert slurm.info["gpu042"].drain_set, (
        "an XID 48 found under the drain was put back in service with no qualification pass "
        f"once a person's drain went over it: {out.output}")


def test_node_path_then_a_persons_drain_then_resume_asks_a_pass(db, tmp_path, monkeypatch):
    """The same end to end through the node path (Actor): the person's drain goes over the
    fault the historian holds under ours as over_xid48, and resume asks the pass (helper-214:
    it was a plain manual drain, resumed with nothing asked)."""
    from rsc_health.actions import Actor
    from rsc_health.config import load_config
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide

    url, engine = db
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE")
    site = tmp_path / "node.toml"
    site.write_text("[actions]\nenabled = true\n")
    actor = Actor(slurm, load_config(site), "gpu042", tmp_path / "state")
    mount = Finding("mounts", "/scratch", Status.FAIL, Severity.DRAIN_NOW,
                    "/scratch not mounted", "mount_missing")
    actor.apply(decide([mount]))
    xid = Finding("xid", "gpu5", Status.FAIL, Severity.DRAIN_NOW,
                  "Xid 48: double-bit ECC error", "xid48", repair=True)
    actor.apply(decide([mount, xid]))
    _check(engine, "gpu042", "xid48", datetime.now(UTC).replace(tzinfo=None, microsecond=0))
    print("Slurm reason:", slurm.info["gpu042"].reason)
    out = _cli(url, slurm, monkeypatch, "drain", "gpu042", "--reason", "remounting /scratch")
    assert out.exit_code == 0, out.output
    print("after drain:", slurm.info["gpu042"].reason)
    out = _cli(url, slurm, monkeypatch, "resume", "gpu042")
    assert slurm.info["gpu042"].drain_set, (
        f"XID 48 under the drain, a person's drain over it, then resume: resumed: {out.output}")
