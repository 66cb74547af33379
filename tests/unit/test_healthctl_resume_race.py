"""`healthctl resume`: it reads the node, asks the historian (tickets, a qualification pass),
then sends State=RESUME. A DOWN a person (or slurmctld) set after the read is lifted with it
(and its reason lost): the node path's own resume uses State=UNDRAIN for exactly this."""
from __future__ import annotations

from click.testing import CliRunner

import rsc_health.commands.slurm as cs
from rsc_health.cli import AppContext
from rsc_health.slurm.memory import MemorySlurm

OURS = "rsc_health:job:mount_missing:/scratch not mounted"
PERSON = "bob: PSU smoking, do not power on"


def test_a_down_set_after_healthctl_resume_read_the_node_stays(tmp_path, monkeypatch):
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(tmp_path / "root"))
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", OURS)
    slurm.after("node", lambda: slurm.set_state("gpu042", "DOWN+DRAIN", PERSON, user="bob"))
    monkeypatch.setattr(cs, "_slurm", lambda ctx: slurm)
    cfg = tmp_path / "cli.toml"
    cfg.write_text("")
    res = CliRunner().invoke(cs.resume, ["gpu042"], obj=AppContext(config_path=str(cfg)))
    print(res.output)
    info = slurm.info["gpu042"]
    assert info.down and info.reason == PERSON, (
        f"the person's DOWN was lifted by healthctl resume: {info.state} {info.reason!r}")
