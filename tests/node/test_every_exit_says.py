"""Every way a node-path run ends says so in both places a fleet reads: the spool (a
heartbeat) and the Prometheus textfile (this run's verdict level). The watchdog's exit
spooled its heartbeat but left the textfile as the last good run wrote it (or absent), so a
prolog that hung on slurmctld showed verdict 0 to the fleet's alerts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rsc_health import nodepath
from rsc_health.nodepath import node_lock
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import (
    REPO,
    XID79,
    _gauge,
    _no_slurm,
    _records,
    node_env,  # noqa: F401 - the fixture
)
from .test_state_dir_read_only import NODE, node01_slurm, slurm_away


def _level(root: Path, source: str) -> str | None:
    return _gauge(root, f'rsc_health_verdict_level{{source="{source}"}}')


def _says(root: Path, source: str, level: str, fault: str | None) -> None:
    textfile = root / "var/lib/node_exporter" / nodepath.TEXTFILE
    assert textfile.exists(), "no textfile written"
    assert _level(root, source) == level
    records = _records(root)
    assert [r for r in records if r["kind"] == "heartbeat"], "no heartbeat spooled"
    if fault:
        assert fault in [r.get("code") for r in records]


def _set(key_line: str) -> None:
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    text = site.read_text()
    site.write_text(text.replace("[slurm]", f"[slurm]\n{key_line}", 1) if "[slurm]" in text
                    else text + f"\n[slurm]\n{key_line}\n")


def test_a_clean_run_says_it(node_env):  # noqa: F811 - pytest fixture by name
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    _says(node_env, "sweep", "0", None)


def test_a_checker_fault_says_it(node_env, monkeypatch):  # noqa: F811
    def broken(*args, **kwargs):
        raise RuntimeError("bug after the verdict")

    monkeypatch.setattr(nodepath, "_job_records", broken)
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0
    _says(node_env, "prolog", "4", "checker_fault")


def test_a_broken_config_says_it(node_env):  # noqa: F811
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0  # the last good config
    _set("prolog_budgte_s = 1")
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    _says(node_env, "sweep", "4", "config_error")


@pytest.mark.parametrize("healthy_first", [False, True], ids=["first_run", "after_a_good_one"])
def test_the_watchdogs_exit_says_it(node_env, healthy_first):  # noqa: F811
    """A prolog whose drain call hangs past its budget: the watchdog ends it (exit 1, the
    verdict was drain); the textfile says a checker error and the pending drain."""
    if healthy_first:
        assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
        assert _level(node_env, "sweep") == "0"
    _set("prolog_budget_s = 1")
    (node_env / "dev/kmsg").open("a").write(XID79)
    script = ("import time\nfrom rsc_health import nodepath\n"
              "raise SystemExit(nodepath.run_stage('prolog', "
              "slurm_factory=lambda cfg, deadline: time.sleep(600)))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1 and "still running after" in proc.stderr, proc.stderr
    _says(node_env, "prolog", "4", "checker_timeout")
    assert _gauge(node_env, "rsc_health_pending_drain") == "1"
    assert json.loads((node_env / NODE_STATE / nodepath.PENDING_VERDICT_FILE).read_text())[
        "why"] == "fault"


# ---- the rest of the exit paths: each one the fleet reads in the spool and the textfile ----
def _drain_level() -> str:
    from rsc_health.model import Level

    return str(Level.DRAIN_NOW.exit_code)  # an XID 79 drains at once


def test_a_drain_verdict_carried_out_says_it(node_env):  # noqa: F811
    slurm = node01_slurm()
    (node_env / "dev/kmsg").open("a").write(XID79)
    assert nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm) == 1
    # job 777 is another job on the node: a prolog's drain now requeues it
    assert [c[0] for c in slurm.calls] == ["drain", "requeue"]
    _says(node_env, "prolog", _drain_level(), "xid79")
    assert _gauge(node_env, "rsc_health_pending_drain") == "0"


def test_a_drain_verdict_slurm_could_not_take_says_it(node_env):  # noqa: F811
    (node_env / "dev/kmsg").open("a").write(XID79)
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm_away()) == 0
    _says(node_env, "sweep", _drain_level(), "xid79")
    assert _gauge(node_env, "rsc_health_pending_drain") == "1"


def test_a_drain_verdict_held_under_someone_elses_drain_says_it(node_env):  # noqa: F811
    slurm = node01_slurm()
    slurm.set_state(NODE, "MIXED+DRAIN", "alice: BIOS update", user="alice")
    (node_env / "dev/kmsg").open("a").write(XID79)
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    _says(node_env, "sweep", _drain_level(), "xid79")
    assert _gauge(node_env, "rsc_health_pending_drain") == "1"
    # The next sweep backs off (no Slurm call) and still says it.
    slurm.calls.clear()
    assert nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm) == 0
    assert slurm.calls == []
    _says(node_env, "sweep", _drain_level(), None)
    assert _gauge(node_env, "rsc_health_pending_drain") == "1"


def test_shadow_mode_says_the_verdict_it_did_not_carry_out(node_env):  # noqa: F811
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text() + "\n[actions]\nenabled = false\n")
    (node_env / "dev/kmsg").open("a").write(XID79)
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0
    _says(node_env, "prolog", _drain_level(), "xid79")


def test_a_run_that_could_not_take_the_lock_says_it(node_env):  # noqa: F811
    _set("lock_timeout_s = 0.2")
    with node_lock(node_env / NODE_STATE, 1):
        assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    _says(node_env, "sweep", "4", "lock_held")  # judged, read-only: a checker error


def test_a_fault_before_anything_was_spooled_says_it(node_env, monkeypatch):  # noqa: F811
    def broken(*args, **kwargs):
        raise RuntimeError("bug before the spool")

    monkeypatch.setattr(nodepath, "_within_spool_cap", broken)
    assert nodepath.run_stage("epilog", slurm_factory=_no_slurm) == 0
    _says(node_env, "epilog", "4", "checker_fault")
    beats = [r for r in _records(node_env) if r["kind"] == "heartbeat"]
    assert [b["level"] for b in beats] == ["checker_error"]


def test_a_config_with_no_fallback_says_it_where_it_can(
        node_env, monkeypatch, capsys):  # noqa: F811
    """A broken config on a node that never ran with a good one and whose packaged defaults
    cannot be read either: nowhere to spool or write the textfile, so the one line on stderr
    and syslog is all that can be said; the job runs."""
    from rsc_health.config import ConfigError

    def no_fallback(root):
        raise ConfigError("packaged defaults unreadable")

    monkeypatch.setattr("rsc_health.config.fallback_config", no_fallback)
    _set("prolog_budgte_s = 1")
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0
    assert "prolog: bad config:" in capsys.readouterr().err
    assert not (node_env / "var/lib/node_exporter" / nodepath.TEXTFILE).exists()


def test_the_textfile_is_what_prometheus_client_parses(node_env, monkeypatch):  # noqa: F811
    """The node path writes the text format by hand (standard library only); the exporter's
    own library reads it back, hostile label values (a probe named with quotes, a backslash
    and a newline) included, as node_exporter's textfile collector would."""
    from prometheus_client.parser import text_string_to_metric_families

    from rsc_health.config import load_config
    from rsc_health.model import Finding, Level, Severity, Status
    from rsc_health.node import sinks
    from rsc_health.node.stage import STAGES

    probe = 'mount:/mnt/we"ird\\path\nx'
    hung = Finding("mount", probe, Status.ERROR, Severity.NONE, "statvfs hung", "mount_hung",
                   data={"probe": probe, "since": "2026-11-26T10:00:00+00:00"})
    cfg = load_config()
    sinks.write_textfile(cfg, node_env, "node01", STAGES["sweep"], Level.CHECKER_ERROR,
                         [hung], 1.5, pending=True, spool_bytes=1234)
    text = (node_env / "var/lib/node_exporter" / nodepath.TEXTFILE).read_text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("rsc_health_probe_hung_since_seconds",
                    (("probe", probe), ("source", "sweep")))] == datetime(
        2026, 11, 26, 10, tzinfo=UTC).timestamp()
    assert samples[("rsc_health_verdict_level", (("source", "sweep"),))] == 4.0
    assert samples[("rsc_health_family_status", (("family", "mount"),))] == 3.0
    assert samples[("rsc_health_pending_drain", ())] == 1.0
    assert samples[("rsc_health_spool_bytes", ())] == 1234.0
