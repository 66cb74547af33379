"""`healthctl qualify start`: a person's drain that lands after the flow read the node (during
the historian's strikes query / the reservation) is lifted by the flow's State=RESUME and then
replaced by a qualification drain of ours: the person's drain and reason are gone."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsc_health.cli import AppContext, cli
from rsc_health.commands.qualify import qualify
from rsc_health.slurm.memory import MemorySlurm

OURS = "rsc_health:now:xid79:gpu3 fell off the bus"
PERSON = "bob: reseating the GPU baseboard, do not touch"


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    return url


def test_a_persons_drain_landing_after_the_flows_read_is_never_lifted(url, tmp_path):
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", OURS)
    # The person drains the node right after the flow read it (scontrol update ...).
    slurm.after("node", lambda: slurm.set_state("gpu042", "IDLE+DRAIN", PERSON, user="bob"))
    cfg = tmp_path / "cli.toml"
    cfg.write_text("")
    obj = AppContext(config_path=str(cfg), db_url=url)
    obj.slurm = slurm
    res = CliRunner().invoke(qualify, ["start", "gpu042", "--timeout", "0.5"], obj=obj)
    print(res.output, slurm.calls)
    info = slurm.info["gpu042"]
    assert ("resume", "gpu042") not in slurm.calls, (
        f"the flow resumed over the person's drain: {slurm.calls}")
    assert info.reason == PERSON, f"the person's drain was replaced: {info.state} {info.reason!r}"
