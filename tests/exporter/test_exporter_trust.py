"""`healthctl metrics export` under hostile names and an unreachable historian, read back the
way Prometheus reads it: prometheus_client's own text parser and a real node_exporter's
textfile collector over HTTP."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine

from rsc_health.historian import db, schema
from rsc_health.historian.ingest import sacct
from tests.historian.test_ingest_adversarial import _parsable, _row
from tests.ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
HOSTILE = ['q"uote', "back\\slash", "new\nline", "br{ace}s", "caf\ufffd\u00e9", "x,y=z"]


def export(url: str, out: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config", os.devnull,
                           "--db", url, "metrics", "export", "--out", str(out)],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=timeout)


def samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


@pytest.fixture
def historian(tmp_path):
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    eng = create_engine(url)
    db.create(eng)
    old = datetime.utcnow() - timedelta(days=2)
    with eng.begin() as conn:
        conn.execute(schema.node_runs.insert(), [
            {"node": n, "source": "sweep", "last_seen": old, "level": "ok"} for n in HOSTILE])
    eng.dispose()
    return url


def test_hostile_node_names_come_back_whole_through_the_text_parser(historian, tmp_path):
    out = tmp_path / "fleet.prom"
    proc = export(historian, out)
    assert proc.returncode == 0, proc.stderr
    got = samples(out.read_text())
    assert sorted(s.labels["node"] for s in got["rsc_health_node_stale"]) == sorted(HOSTILE)
    assert got["rsc_health_historian_up"][0].value == 1


def test_qualification_verdicts_are_exported_per_node_and_per_day(historian, tmp_path):
    eng = create_engine(historian)
    now = datetime.utcnow()
    with eng.begin() as conn:
        for run_id, node, ago_h, verdict in (("a", HOSTILE[0], 30, "fail"), ("b", HOSTILE[0], 1,
                                              "pass"), ("c", "gpu9", 2, "inconclusive")):
            conn.execute(schema.qualify_runs.insert().values(
                run_id=run_id, node=node, tier="full", started=now - timedelta(hours=ago_h + 1),
                ended=now - timedelta(hours=ago_h), verdict=verdict, reason="", gpu_model="",
                driver=""))
    eng.dispose()
    out = tmp_path / "fleet.prom"
    assert export(historian, out).returncode == 0
    got = samples(out.read_text())
    assert {s.labels["verdict"]: s.value for s in got["rsc_health_qualify_runs_24h"]} == {
        "pass": 1, "fail": 0, "inconclusive": 1}
    assert {s.labels["node"]: s.value for s in got["rsc_health_node_qualify_passed"]} == {
        HOSTILE[0]: 1, "gpu9": 0}



def test_a_site_catalog_the_historian_cannot_use_is_a_metric_not_a_warning_every_export(
        historian, tmp_path):
    """[xid] catalog_override names a file that is not on the historian host (or not
    root's): the export judges by the packaged catalog. Before, every export (every 5
    minutes, rsc-health-export.timer) wrote the same long warning to the journal twice and
    nothing in the metrics said it; now the export says it once per run as
    rsc_health_xid_catalog_override_unusable 1 (the RscHealthXidCatalogUnusable alert), and
    not on stderr; 0 when the override is usable or none is set."""
    missing = tmp_path / "policy" / "xid_site.toml"
    config = tmp_path / "config.toml"
    config.write_text(f'[xid]\ncatalog_override = "{missing}"\n')
    out = tmp_path / "fleet.prom"

    def run(config_path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config",
                               str(config_path), "--db", historian, "metrics", "export",
                               "--out", str(out)],
                              env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                              text=True, timeout=120)

    for _ in range(2):
        proc = run(config)
        assert proc.returncode == 0, proc.stderr
        assert "not used" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [f"wrote {out}"], proc.stderr
        got = samples(out.read_text())
        assert [s.value for s in got["rsc_health_xid_catalog_override_unusable"]] == [1]
    assert run(os.devnull).returncode == 0
    assert [s.value for s in samples(out.read_text())[
        "rsc_health_xid_catalog_override_unusable"]] == [0]




@pytest.mark.skipif(not shutil.which("prometheus-node-exporter"),
                    reason="prometheus-node-exporter (Debian) not installed")
def test_node_exporter_serves_hostile_names_and_an_unreachable_historian(historian, tmp_path):
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    prom = textdir / "rsc_health_fleet.prom"
    assert export(historian, prom).returncode == 0
    port = _free_port()
    ne = subprocess.Popen(
        ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{port}",
         f"--collector.textfile.directory={textdir}", "--collector.disable-defaults",
         "--collector.textfile"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def scrape() -> dict[str, list]:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=5) as resp:
                        return samples(resp.read().decode())
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        got = scrape()
        assert got["node_textfile_scrape_error"][0].value == 0
        assert sorted(s.labels["node"] for s in got["rsc_health_node_stale"]) == sorted(HOSTILE)
        # The historian goes away: the next export says so as a metric, in bounded time, and
        # the fleet numbers of the last good export are not served as if they were current.
        gone = f"sqlite:///{tmp_path / 'no/such/dir/historian.db'}"
        t0 = time.monotonic()
        proc = export(gone, prom, timeout=60)
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        got = scrape()
        assert got["node_textfile_scrape_error"][0].value == 0
        assert got["rsc_health_historian_up"][0].value == 0
        assert "rsc_health_node_stale" not in got and "rsc_health_lemon_candidates" not in got
    finally:
        ne.terminate()
        ne.wait(10)


def test_a_historian_that_is_not_a_database_is_one_line_and_up_0(tmp_path):
    bad = tmp_path / "historian.db"
    bad.write_bytes(b"\xff" * 4096)
    out = tmp_path / "fleet.prom"
    proc = export(f"sqlite:///{bad}", out, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert samples(out.read_text())["rsc_health_historian_up"][0].value == 0


def test_a_symlink_planted_at_the_textfile_name_is_replaced_never_followed(historian, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir(mode=0o1777)  # a shared, sticky directory: allowed
    os.chmod(textfiles, 0o1777)
    (textfiles / "fleet.prom").symlink_to(victim)
    proc = export(historian, textfiles / "fleet.prom", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "keep me\n"
    assert not (textfiles / "fleet.prom").is_symlink()
    assert "rsc_health_historian_up" in samples((textfiles / "fleet.prom").read_text())


def test_a_textfile_directory_anyone_may_write_without_the_sticky_bit_is_refused(historian,
                                                                                 tmp_path):
    textfiles = tmp_path / "open"
    textfiles.mkdir()
    os.chmod(textfiles, 0o777)
    proc = export(historian, textfiles / "fleet.prom", timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "writable by others" in proc.stderr and list(textfiles.iterdir()) == []


def test_a_full_disk_keeps_the_last_file_whole_and_leaves_no_temporary(historian, tmp_path):
    """RLIMIT_FSIZE makes the write fail (EFBIG) as ENOSPC would, at the same step."""
    import resource
    import signal

    out = tmp_path / "fleet.prom"
    out.write_text("# the last good export\n")

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    proc = subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config", os.devnull,
                           "--db", historian, "metrics", "export", "--out", str(out)],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=60, preexec_fn=small_files)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write" in proc.stderr
    assert out.read_text() == "# the last good export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.prom", "historian.db"]


def test_a_job_or_run_stamped_in_the_future_does_not_make_stale_data_look_fresh(historian,
                                                                                tmp_path):
    """slurmctld with a clock years ahead stamped one job's End 2099 (sacct takes it: it ran
    an hour), and a node whose clock runs a day fast delivered a run. rsc_health_data_age_
    seconds was the age of the newest End and node run, clamped at 0: 0 for ever, so a
    dashboard showed the sacct and spool feeds fresh while the ingest had stopped days ago.
    Now only times up to the export's own now count (as the report's stale-inputs line
    does): the real newest job ended two days ago, and the real newest run is too."""
    eng = create_engine(historian)
    now = datetime.utcnow()
    sacct.ingest_text(eng, _parsable([
        _row("1", Start=f"{now - timedelta(days=2, hours=1):%Y-%m-%dT%H:%M:%S}",
             End=f"{now - timedelta(days=2):%Y-%m-%dT%H:%M:%S}"),
        _row("2", Submit="2099-01-01T00:00:00", Eligible="2099-01-01T00:00:00",
             Start="2099-01-01T00:00:05", End="2099-01-01T01:00:05")]))
    with eng.begin() as conn:
        conn.execute(schema.node_runs.insert().values(
            node="fast-clock", source="sweep", last_seen=now + timedelta(days=1), level="ok"))
    eng.dispose()
    out = tmp_path / "fleet.prom"
    assert export(historian, out).returncode == 0
    age = {s.labels["source"]: s.value for s in samples(out.read_text())[
        "rsc_health_data_age_seconds"]}
    assert 2 * 86400 - 600 < age["sacct"] < 2 * 86400 + 600, age
    assert 2 * 86400 - 600 < age["spool"] < 2 * 86400 + 600, age


def test_an_export_whose_sqlite_historian_file_is_gone_says_up_0_and_creates_none(tmp_path):
    """The historian's file vanished (deleted, restored elsewhere, its volume not mounted
    over the directory): the export created a new, empty historian in its place and wrote
    rsc_health_historian_up 1 with no lemon, no stale node and nothing reporting, so every
    RscHealthLemonCandidate / NodeStale alert resolved at once and RscHealthHistorianDown
    never fired; the next ingest then filled the stray empty file."""
    gone = tmp_path / "historian.db"
    out = tmp_path / "rsc_health_fleet.prom"
    proc = export(f"sqlite:///{gone}", out, timeout=60)
    assert proc.returncode == 1 and "does not exist" in proc.stderr, proc.stderr
    assert samples(out.read_text())["rsc_health_historian_up"][0].value == 0
    assert not gone.exists()


def test_an_export_of_a_historian_with_no_schema_says_up_0_and_creates_none(tmp_path):
    """An empty file (or an empty PostgreSQL database) is no historian yet: not initialised,
    up 0, and no schema made in it by a reader."""
    empty = tmp_path / "historian.db"
    empty.touch()
    out = tmp_path / "rsc_health_fleet.prom"
    proc = export(f"sqlite:///{empty}", out, timeout=60)
    assert proc.returncode == 1 and "not initialised" in proc.stderr, proc.stderr
    assert samples(out.read_text())["rsc_health_historian_up"][0].value == 0
    import sqlite3

    with sqlite3.connect(empty) as conn:  # the reader's WAL pragma writes a header, no table
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
