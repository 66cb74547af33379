"""The historian asks the same Slurm as the node path: [slurm] bin_dir holds sacct and
sacctmgr too (a site whose Slurm is not on root's PATH, or is one of several installed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.historian.ingest.sacct_parse import FIELDS, OPTIONAL_FIELDS

# What each stand-in prints for what it is asked: the header the ingest expects, no rows.
SACCT = "\\037".join((*FIELDS, *OPTIONAL_FIELDS))
SACCTMGR = """case "$*" in
  *reservation*) echo 'Cluster|Name|TimeStart|TimeEnd|Flags|NodeNames' ;;
  *) echo 'Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User' ;;
esac
"""
HEADERS = {"sacct": f"printf '{SACCT}\\n'\n", "sacctmgr": SACCTMGR}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A bin_dir whose sacct and sacctmgr record each call; nothing of that name on PATH."""
    bin_dir, calls = tmp_path / "slurm-bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name, header in HEADERS.items():
        prog = bin_dir / name
        prog.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n{header}')
        prog.chmod(0o755)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # a sacct found on PATH would not be the site's
    config = tmp_path / "config.toml"
    config.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\n[historian]\nsacct_format = "parsable"\n')
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    return ["--config", str(config), "--db", db], calls


@pytest.mark.parametrize(("what", "program"), [("sacct", "sacct"), ("events", "sacctmgr"),
                                               ("reservations", "sacctmgr")])
def test_ingest_runs_slurm_s_accounting_from_bin_dir(stand_in, what, program):
    """`healthctl ingest sacct|events|reservations` ran sacct/sacctmgr from PATH whatever
    [slurm] bin_dir said (issue 21: three modules built their own Slurm handle)."""
    base, calls = stand_in
    result = CliRunner().invoke(cli, [*base, "ingest", what, "--since", "2026-11-01T00:00:00"])
    assert calls.exists(), result.output
    called = calls.read_text().splitlines()
    assert called and all(line.startswith(f"{program} ") for line in called), called
    assert "2026-11-01T00:00:00" in called[0]
    assert result.exit_code == 0, result.output


def test_ingest_events_refuses_tz_for_the_sacctmgr_it_runs_itself(stand_in, tmp_path):
    """sacctmgr is run with TZ=UTC, so its times are UTC already; `--tz Europe/Berlin` without
    --file read them again as Berlin's wall clock and stored every outage an hour early (two
    in summer): a second copy of each event the hourly run had stored (out_count doubled), and
    outages an hour away from the jobs they ended. --tz is for a file made elsewhere."""
    base, calls = stand_in
    prog = tmp_path / "slurm-bin" / "sacctmgr"
    prog.write_text(f'#!/bin/sh\necho "sacctmgr $*" >> {calls}\n'
                    "echo 'Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User'\n"
                    "echo 'c|gpu001|2026-01-10T08:00:00|2026-01-10T09:00:00|DOWN|Not "
                    "responding|slurm'\n")
    result = CliRunner().invoke(cli, [*base, "ingest", "events", "--tz", "Europe/Berlin"])
    assert result.exit_code == 2 and "--tz" in result.output and "--file" in result.output
    assert not calls.exists()  # sacctmgr never asked, nothing stored
    result = CliRunner().invoke(cli, [*base, "ingest", "events", "--json"])
    assert result.exit_code == 0, result.output
    assert '"written": 1' in result.output and '"times": "UTC"' in result.output
