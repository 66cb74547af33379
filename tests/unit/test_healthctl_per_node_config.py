"""`healthctl resume` and `drain` judge a drain with the node's own config ([nodes."GLOB"]
[actions] never_resume_codes), not the site-wide one (helper-208)."""
from __future__ import annotations

from functools import partial

import rsc_health.commands.slurm as cs
from rsc_health.config import load_config
from rsc_health.slurm.memory import MemorySlurm
from tests.unit.conftest import run_slurm_command

DEFAULT_NEVER = ('["xid79", "xid48", "xid94", "xid95", "ecc_dbe", "remap_failed", '
                 '"remap_pending", "gpu_lost", "gpu_missing", "aer_fatal"]')
# A site whose H100 nodes treat an IB port going down as a hands-on repair (a flaky cable
# that must be re-seated): [nodes."GLOB".actions] never_resume_codes, a documented override.
SITE = ('[actions]\nenabled = true\n'
        f'[nodes."h100-*".actions]\nnever_resume_codes = {DEFAULT_NEVER[:-1]}, "ib_down"]\n')
OURS = "rsc_health:now:ib_down:mlx5_0 port 1 Down"


_run = partial(run_slurm_command, site=SITE)


def test_node_override_never_resume_is_what_the_node_path_keeps(tmp_path):
    """Sanity: the node's own view of the config says ib_down is a repair on h100-01."""
    p = tmp_path / "c.toml"
    p.write_text(SITE)
    cfg = load_config(p)
    assert "ib_down" in cfg.for_node("h100-01").get("actions.never_resume_codes")


def test_resume_asks_for_qualification_under_a_per_node_never_resume_code(tmp_path, monkeypatch):
    """The node path kept this drain as a repair (its view of the config lists ib_down in
    never_resume_codes); `healthctl resume` judges it with the site-wide list and puts the
    node back with no qualification pass (and no historian to find one in)."""
    slurm = MemorySlurm()
    slurm.add_node("h100-01", "IDLE+DRAIN", OURS)
    res = _run(tmp_path, monkeypatch, slurm, cs.resume, ["h100-01"])
    info = slurm.info["h100-01"]
    assert info.drain_set, f"repair drain lifted with no qualification pass: {res.output}"


def test_drain_over_a_per_node_repair_drain_keeps_over_code(tmp_path, monkeypatch):
    """A person's `healthctl drain` over that repair drain must write over_ib_down, so the
    maintenance's resume still asks for a pass."""
    slurm = MemorySlurm()
    slurm.add_node("h100-01", "IDLE+DRAIN", OURS)
    _run(tmp_path, monkeypatch, slurm, cs.drain, ["h100-01", "--reason", "cable reseat"])
    reason = slurm.info["h100-01"].reason
    assert reason.startswith("rsc_health:manual:over_ib_down:"), reason


def test_the_site_wide_list_still_judges_nodes_without_the_override(tmp_path, monkeypatch):
    """gpu001 is no h100-*: ib_down is transient there, and its drain resumes."""
    slurm = MemorySlurm()
    slurm.add_node("gpu001", "IDLE+DRAIN", OURS)
    _run(tmp_path, monkeypatch, slurm, cs.resume, ["gpu001"])
    assert not slurm.info["gpu001"].drain_set


def test_a_drain_over_an_over_drain_keeps_one_over(tmp_path, monkeypatch):
    """The same person draining again over their own over_ib_down drain keeps its code
    (not over_over_ib_down)."""
    monkeypatch.setenv("SUDO_USER", "bob")
    slurm = MemorySlurm()
    slurm.add_node("h100-01", "IDLE+DRAIN", "rsc_health:manual:over_ib_down:reseat by bob")
    _run(tmp_path, monkeypatch, slurm, cs.drain, ["h100-01", "--reason", "still reseating"])
    assert slurm.info["h100-01"].reason.startswith("rsc_health:manual:over_ib_down:still ")
