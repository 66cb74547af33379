"""`healthctl drain --code LONG`: format is rsc_health:manual:<code>:<text>, clipped to 120
characters AFTER assembly. A code of 103+ characters pushes the third ':' past the clip, so
the reason rsc-health writes to Slurm is not one parse_reason recognises: its own manual drain
is then 'not ours' (resume refuses without --force, status lists it under others)."""
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.policy import parse_reason
from rsc_health.slurm.memory import MemorySlurm


def _slurm(monkeypatch):
    slurm = MemorySlurm(["n1"], partition="gpu")
    monkeypatch.setattr("rsc_health.commands.slurm._slurm", lambda ctx: slurm)
    monkeypatch.setenv("SUDO_USER", "alice")
    return slurm


def test_manual_drain_with_long_code_is_read_back_as_ours(tmp_path, monkeypatch):
    slurm = _slurm(monkeypatch)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    run = CliRunner()
    assert run.invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    code = "psu_" + "x" * 110          # an operator's fault token (e.g. a ticket slug)
    res = run.invoke(cli, ["--db", db, "drain", "n1", "--reason", "bad PSU", "--code", code])
    assert res.exit_code == 0, res.output
    written = [c[2] for c in slurm.calls if c[0] == "drain"][0]
    assert len(written) <= 120
    # rsc-health must recognise the reason it wrote itself
    assert parse_reason(written) is not None, written
    res = run.invoke(cli, ["--db", db, "resume", "n1"])
    assert "refused" not in res.output, res.output
