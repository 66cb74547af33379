"""`healthctl status` prints others' text (node names, probe names, reasons) for a person:
every line goes through rsc_health.terminal.echo, which escapes what a terminal would act on.
The 'probes hanging' lines went to click.echo raw: a hung probe's component (a path, or
whatever a record ingested from another tool named) could clear the operator's screen,
retitle the terminal or forge a line."""

from __future__ import annotations

from click.testing import CliRunner

from rsc_health import spool
from rsc_health.cli import cli
from rsc_health.historian.db import connect
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.model import utcnow
from tests.lemons.lemon_fleet import fleet_slurm


def test_a_hung_probe_named_with_terminal_escapes_is_shown_escaped(tmp_path, monkeypatch):
    hostile = "/mnt/\x1b]0;owned\x07\x1b[2J\nfake-node  statvfs ok"
    now = utcnow()
    spool_dir = tmp_path / "spool"
    spool.append(spool_dir, [
        spool.record("check", "gpu042", now, source="sweep", job_id=None, check="mount",
                     component=hostile, status="fail", severity="drain_now", code="mount_hung",
                     reason="did not answer statvfs"),
        spool.record("heartbeat", "gpu042", now, source="sweep", level="drain_now",
                     checker_errors=0, duration_s=1.0, families={"mount": "fail"},
                     version="0.1.0"),
    ])
    url = f"sqlite:///{tmp_path / 'history.db'}"
    engine = connect(url, create_missing=True)
    try:
        deliver(engine, spool_dir)
    finally:
        engine.dispose()
    fleet = fleet_slurm({"gpu042": ("MIXED", "")}, size=0)
    monkeypatch.setattr("rsc_health.commands.slurm._slurm", lambda ctx: fleet)
    out = CliRunner().invoke(cli, ["--db", url, "status"]).output
    assert "probes hanging: 1" in out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned" in out
    assert not any(line.startswith("fake-node") for line in out.splitlines())
