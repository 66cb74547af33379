"""`healthctl resume` asks a qualification pass for a drain that holds a cause never
auto-resumed, whichever cause the verdict listed first and whenever it was found under the
drain: it reads the code Slurm's reason leads with (the node's own record is on the node), so
the node path leads the reason with such a cause (helper-208)."""
from __future__ import annotations

from click.testing import CliRunner

import rsc_health.commands.slurm as cs
from rsc_health.cli import AppContext
from rsc_health.config import load_config
from rsc_health.slurm.memory import MemorySlurm

DEFAULT_NEVER = ('["xid79", "xid48", "xid94", "xid95", "ecc_dbe", "remap_failed", '
                 '"remap_pending", "gpu_lost", "gpu_missing", "aer_fatal"]')
# A site whose H100 nodes treat an IB port going down as a hands-on repair (a flaky cable
# that must be re-seated): [nodes."GLOB".actions] never_resume_codes, a documented override.
SITE = ('[actions]\nenabled = true\n'
        f'[nodes."h100-*".actions]\nnever_resume_codes = {DEFAULT_NEVER[:-1]}, "ib_down"]\n')
OURS = "rsc_health:now:ib_down:mlx5_0 port 1 Down"


def _run(tmp_path, monkeypatch, slurm, cmd, args, site=SITE):
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(site)
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    res = CliRunner().invoke(cmd, args, obj=AppContext(config_path=str(cfg)))
    print(res.output)
    return res


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


def test_resume_of_a_transient_drain_that_an_xid48_was_found_under(tmp_path, monkeypatch):
    """02:00 /scratch goes missing: drain-now `rsc_health:now:mount_missing:...`. 02:10 the
    sweep reads an XID 48 (double-bit ECC) under that drain: the node path adds xid48 to its
    record and never auto-resumes it (actions._note_verdict: 'an XID 79 while drained for a
    lost mount'), but Slurm's reason still says mount_missing and the XID is consumed. 03:00
    the operator remounts /scratch and runs `healthctl resume`: it reads only the reason,
    sees a transient code, and puts a GPU with an uncorrectable ECC error back in service
    with no qualification pass. Nothing drains it again (the XID was consumed)."""
    from rsc_health.actions import Actor
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide

    mount = decide([Finding("mount", "/scratch", Status.FAIL, Severity.DRAIN_NOW,
                            "/scratch not mounted", "mount_missing")])
    xid48 = decide([Finding("xid", "gpu5", Status.FAIL, Severity.DRAIN_NOW,
                            "Xid 48: double-bit ECC error", "xid48", repair=True)])
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE")
    site = tmp_path / "node.toml"
    site.write_text("")
    actor = Actor(slurm, load_config(site), "gpu042", tmp_path / "state")
    actor.apply(mount)
    actor.apply(xid48)
    state = actor.load_state()
    assert "xid48" in state.codes and not state.auto_resumable  # the node path knows
    # ... and Slurm's reason says so now, in the drain's own mode; the record follows it.
    assert slurm.info["gpu042"].reason.startswith("rsc_health:now:xid48:")
    assert state.reason == slurm.info["gpu042"].reason
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu042"], site="")
    assert slurm.info["gpu042"].drain_set, (
        f"XID 48 drain lifted by `healthctl resume` with no qualification pass: {res.output}")
