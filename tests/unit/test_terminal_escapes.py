"""Others' text printed for a person: a terminal escape in a drain reason, a ticket or a job
name reaches the operator's terminal as its escape, never as the sequence itself."""

from __future__ import annotations

from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.terminal import shown

# Retitle the terminal, reset it (clears the screen), forge a line, reverse the text after it.
EVIL = "\x1b]0;owned\x07\x1bc\nnode99  0m  IDLE+DRAIN  fake\u202e"
ESCAPED = "\\x1b]0;owned\\x07\\x1bc\\nnode99  0m  IDLE+DRAIN  fake\\u202e"
# The CLI backend reads scontrol's record across its lines: the newline comes back a space.
SLURM_ESCAPED = ESCAPED.replace("\\n", " ")
# `scontrol -o show node node02` from Slurm 22.05.8 (tests/slurm/test_cli_backend.py).
NODE_LINE = (
    "NodeName=node02 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.32 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=43023 Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=22826 Sockets=2 Boards=1 "
    "State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu  BootTime=2026-11-22T01:09:11 SlurmdStartTime=2026-11-22T01:22:21 "
    "LastBusyTime=2026-11-22T01:22:21 CfgTRES=cpu=2,mem=1000M,billing=2,gres/gpu=8 AllocTRES= "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    f"ExtSensorsTemp=n/s Reason=fan noisy {EVIL} [alice@2026-11-22T01:22:26]"
)


def _stand_in_slurm(tmp_path):
    """[slurm] bin_dir whose scontrol prints one drained node with a hostile reason."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "show_node.txt").write_text(NODE_LINE + "\n")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ncat {tmp_path / 'show_node.txt'}\n")
    scontrol.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\n')
    return config


def _assert_escaped(output: str, shown_as: str = ESCAPED) -> None:
    assert "\x1b" not in output and "\x07" not in output and "\u202e" not in output
    assert shown_as in output
    assert not any(line.startswith("node99") for line in output.splitlines())


def test_status_prints_a_person_s_drain_reason_with_its_escapes_escaped(tmp_path, monkeypatch):
    """`healthctl status` printed the reason raw (issue 21)."""
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    config = _stand_in_slurm(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(config), "status"])
    assert "node02" in result.output and "fan noisy" in result.output, result.output
    _assert_escaped(result.output, SLURM_ESCAPED)


def test_node_prints_slurm_s_reason_escaped(tmp_path, monkeypatch):
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    config = _stand_in_slurm(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(config), "node", "node02"])
    assert result.exit_code == 0 and "reason: fan noisy" in result.output, result.output
    _assert_escaped(result.output, SLURM_ESCAPED)


def test_ticket_list_prints_the_historian_s_text_escaped(tmp_path):
    db = ["--db", f"sqlite:///{tmp_path / 'h.db'}"]
    runner = CliRunner()
    assert runner.invoke(cli, [*db, "db", "upgrade"]).exit_code == 0
    assert runner.invoke(cli, [*db, "ticket", "open", "gpu7", "--reason", EVIL]).exit_code == 0
    result = runner.invoke(cli, [*db, "ticket", "list"])
    assert result.exit_code == 0 and "gpu7" in result.output
    _assert_escaped(result.output)


def test_printable_text_is_left_as_it_was():
    text = "rsc_health:now:xid79:gpu3 XID 79 — GPU fell off the bus [héllo] \\x1b 日本"
    assert shown(text) == text
    assert shown("a\tb\x9bc\x7f") == "a\\tb\\x9bc\\x7f"
