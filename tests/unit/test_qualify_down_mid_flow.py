"""A DOWN set while a qualification flow holds the node (a person's, right after the flow's
read; or Slurm's own "Not responding" under the stress test): the flow lifted it with State=
RESUME and then wrote its inconclusive drain over the person's reason. Now it lifts only its
drain (UNDRAIN: the DOWN stays) and drains the node all the same when the run proved nothing
(a Slurm DOWN would return to service by itself with ReturnToService), their words first in
its reason."""

from __future__ import annotations

from click.testing import CliRunner

from rsc_health.cli import AppContext, cli
from rsc_health.commands.qualify import qualify
from rsc_health.slurm.memory import MemorySlurm

OURS = "rsc_health:now:xid79:gpu3 fell off the bus"
PERSON = "bob: PSU smoking, do not power on"


def test_a_down_set_while_the_flow_holds_the_node_stays_down_and_drained(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    slurm = MemorySlurm()
    slurm.add_node("gpu042", "IDLE+DRAIN", OURS)
    # once reserved, the flow reads the node again; right after that read, bob sets it DOWN
    slurm.after("create_reservation", lambda: slurm.after(
        "node", lambda: slurm.set_state("gpu042", "DOWN+DRAIN", PERSON, user="bob")))
    cfg = tmp_path / "cli.toml"
    cfg.write_text("")
    obj = AppContext(config_path=str(cfg), db_url=url)
    obj.slurm = slurm
    res = CliRunner().invoke(qualify, ["start", "gpu042", "--timeout", "0.5"], obj=obj)
    assert "inconclusive" in res.output, res.output
    assert ("resume", "gpu042") not in slurm.calls and ("undrain", "gpu042") in slurm.calls
    info = slurm.info["gpu042"]
    assert info.down and info.drain_set, info.state
    assert info.reason.startswith("rsc_health:qualify:inconclusive:")
    assert "DOWN by bob: bob: PSU smoking" in info.reason
