"""Shadow mode at the one door to Slurm: with [actions] enabled = false, `slurm.from_config`
hands out a backend that only reads. Each caller already says "would drain" itself; this is for
one that forgets (a new flow, a new command): its change is refused before any command runs,
and reads go on as before."""

from __future__ import annotations

import pytest

from rsc_health.config import Config, load_config
from rsc_health.slurm import ShadowMode, SlurmCommandError, from_config
from rsc_health.slurm.cli_backend import _reads

# Every change the backend can make, as its callers make it.
CHANGES = {
    "drain": lambda s: s.drain("node01", "rsc_health:now:xid79:gpu3"),
    "resume": lambda s: s.resume("node01"),
    "undrain": lambda s: s.undrain("node01"),
    "update_node": lambda s: s.update_node("node01", features=["rsc_trusted"], weight=1000),
    "requeue": lambda s: s.requeue("42"),
    "create_reservation": lambda s: s.create_reservation("rsc_qualify_node01", "node01"),
    "cancel": lambda s: s.cancel("42"),
}


def _recording_bin(tmp_path):
    """scontrol/squeue/sbatch/scancel/sinfo that record their argv and answer nothing."""
    log = tmp_path / "argv.log"
    for name in ("scontrol", "squeue", "sbatch", "scancel", "sinfo"):
        script = tmp_path / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n')
        script.chmod(0o755)
    return log


def _config(tmp_path, enabled: bool) -> Config:
    site = tmp_path / "site.toml"
    site.write_text(f'[actions]\nenabled = {str(enabled).lower()}\n[slurm]\nbin_dir = '
                    f'"{tmp_path}"\n')
    return load_config(site)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_in_shadow_mode_a_change_is_refused_before_any_command_runs(tmp_path, change):
    log = _recording_bin(tmp_path)
    slurm = from_config(_config(tmp_path, enabled=False))
    with pytest.raises(ShadowMode, match="shadow mode"):
        CHANGES[change](slurm)
    assert not log.exists()  # nothing ran
    assert issubclass(ShadowMode, SlurmCommandError)  # callers' error handling applies


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_with_actions_enabled_the_same_change_reaches_slurm(tmp_path, change):
    log = _recording_bin(tmp_path)
    slurm = from_config(_config(tmp_path, enabled=True))
    try:
        CHANGES[change](slurm)
    except SlurmCommandError as exc:  # the stand-in answers nothing: some calls say so
        assert not isinstance(exc, ShadowMode)
    assert log.exists() and log.read_text().strip()


def test_in_shadow_mode_reads_still_run(tmp_path):
    log = _recording_bin(tmp_path)
    slurm = from_config(_config(tmp_path, enabled=False))
    assert slurm.nodes() == []
    assert slurm.jobs_on_node("node01") == []
    assert log.read_text().startswith("scontrol -a -o show node")


@pytest.mark.parametrize("argv,reads", [
    (["scontrol", "-o", "show", "node", "node01"], True),
    (["scontrol", "show", "reservation"], True),
    (["scontrol", "ping"], True),
    (["squeue", "-h", "-w", "node01"], True),
    (["sinfo", "-h"], True),
    (["sacct", "-a", "-X"], True),
    (["sacctmgr", "-P", "show", "event"], True),
    (["scontrol", "update", "NodeName=node01", "State=RESUME"], False),
    (["scontrol", "-o", "update", "NodeName=node01"], False),
    (["scontrol", "reboot", "node01"], False),
    (["scontrol", "requeue", "42"], False),
    (["scontrol", "create", "reservation"], False),
    (["scontrol", "delete", "ReservationName=x"], False),
    (["scontrol"], False),
    (["sacctmgr", "-i", "modify", "user"], False),
    (["sbatch", "--wrap", "true"], False),
    (["scancel", "42"], False),
    (["strigger", "--set"], False),
])
def test_what_counts_as_a_read(argv, reads):
    assert _reads(argv) is reads


@pytest.mark.slurm
def test_shadow_mode_on_the_real_cluster_leaves_the_node_as_it_was(
        slurm_cluster, monkeypatch):
    """A drain asked through the shadow-mode door on the real 22.05 cluster: refused, and
    slurmctld's record of the node is unchanged."""
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    before = c.node_state("node01")
    slurm = from_config(Config({"actions": {"enabled": False}}))
    with pytest.raises(ShadowMode):
        slurm.drain("node01", "rsc_health:now:xid79:gpu3 fell off the bus")
    assert c.node_state("node01") == before and "DRAIN" not in before
    assert slurm.node("node01").name == "node01"  # a read through the same door
