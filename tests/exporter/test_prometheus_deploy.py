"""The shipped Prometheus configuration and alert rules (deploy/prometheus/, issue 26): promtool
accepts them and their unit tests pass, every metric they name is one rsc-health writes, and a
real Prometheus, loading the shipped prometheus.yml and rules, scrapes real node_exporters that
serve real textfiles (a healthy sweep, a sweep holding a drain verdict, a node that never
swept, the fleet export of a historian with a stale node and a guard trip); each alert's
expression then names exactly the nodes it should."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert

from rsc_health import nodepath
from rsc_health.historian import db, schema
from rsc_health.model import ActionKind
from rsc_health.node import sinks
from tests.fixtures.nodes.node_copy import copy_node
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "rsc-health.rules.yml"
SWEEP = REPO / "checks" / "rsc-health-sweep"
XID79 = "4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool (Debian: prometheus) not installed")


def _promtool(*args: str, cwd: Path = PROM) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


@needs_promtool
def test_promtool_accepts_the_shipped_config_and_rules():
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", RULES.name)):
        out = _promtool(*args)
        assert out.returncode == 0, out.stdout + out.stderr
    assert "15 rules found" in _promtool("check", "rules", RULES.name).stdout


@needs_promtool
def test_the_rules_unit_tests_pass():
    out = _promtool("test", "rules", "rsc-health.rules.test.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_rsc_health_metric_the_rules_use_is_written():
    source = (REPO / "rsc_health/exporter/historian.py").read_text()
    written = set(sinks.HELP) | set(re.findall(r'"(rsc_health_[a-z0-9_]+)"', source))
    used = set(re.findall(r"rsc_health_[a-z0-9_]+", RULES.read_text())) - {
        "rsc_health_fleet"}  # the export's file name in the mtime rule
    assert used and used <= written, used - written
    tested = (PROM / "rsc-health.rules.test.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", RULES.read_text())
    # Every alert is exercised: by promtool's unit tests or by the real Prometheus below.
    live = set(EXPECTED)
    assert all(a in tested or a in live for a in alerts), alerts


def _sweep(tmp_path: Path, name: str, *, xid79: bool) -> Path:
    """A real sweep through the shipped script; returns the directory its textfile is in.
    No scontrol on PATH: a drain verdict cannot reach Slurm and stays pending."""
    root = copy_node(tmp_path / name)
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text() + '\n[node]\ntextfile_dir = "/textfile"\n')
    (root / "textfile").mkdir()
    if xid79:
        with open(root / "dev" / "kmsg", "a") as fh:
            fh.write(XID79)
    defaults = tmp_path / f"{name}.defaults"
    defaults.write_text("")
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir(exist_ok=True)
    env = {"PATH": f"{empty_bin}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "RSC_HEALTH_DEFAULTS": str(defaults), "RSC_HEALTH_ROOT": str(root),
           "RSC_HEALTH_CONFIG": str(site), "SLURMD_NODENAME": name,
           "RSC_HEALTH_PYTHON": sys.executable}
    subprocess.run([str(SWEEP)], env=env, capture_output=True, timeout=120, check=True)
    assert (root / "textfile" / nodepath.TEXTFILE).exists()
    return root / "textfile"


def _fleet_export(tmp_path: Path) -> Path:
    """`healthctl metrics export` of a historian where node gpu-stale last ran 3 hours ago
    and the mass-drain guard held a drain back an hour ago."""
    url = f"sqlite:///{tmp_path / 'historian.db'}"
    engine = create_engine(url)
    db.create(engine)
    now = datetime.utcnow()
    with engine.begin() as conn:
        conn.execute(insert(schema.node_runs).values(
            node="gpu-stale", source="sweep", last_seen=now - timedelta(hours=3), level="ok",
            checker_errors=0, version="test"))
        conn.execute(insert(schema.node_runs).values(
            node="gpu-fresh", source="sweep", last_seen=now - timedelta(minutes=2), level="ok",
            checker_errors=0, version="test"))
        conn.execute(insert(schema.node_actions).values(
            id="guard-1", time=now - timedelta(hours=1), node="gpu-fresh",
            action=ActionKind.GUARD_TRIPPED, reason="rsc_health:xid79", job_id=None))
    engine.dispose()
    out_dir = tmp_path / "fleet-textfile"
    out_dir.mkdir()
    done = subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config", os.devnull,
                           "--db", url, "metrics", "export", "--out",
                           str(out_dir / "rsc_health_fleet.prom")],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out_dir


# Each alert's expression (its `for:` aside) against the real scrape: the instances or
# nodes it names. 127.0.0.1 swept healthy, 127.0.0.2 holds a drain verdict (XID 79, no
# Slurm to take it), 127.0.0.3 answers but has never swept; the fleet export names nodes.
EXPECTED = {
    "RscHealthNodeNotChecking": {"127.0.0.3"},
    "RscHealthPendingDrainHeld": {"127.0.0.2"},
    "RscHealthCheckerErrors": set(),
    "RscHealthProbeHung": set(),
    "RscHealthSpoolUndelivered": set(),
    "RscHealthHistorianDown": set(),
    "RscHealthNodesReportingDropped": set(),  # the real fleet export: as many as ever
    "RscHealthFleetExportStale": set(),
    "RscHealthSacctIngestStopped": set(),
    "RscHealthNodeStale": {"gpu-stale"},
    "RscHealthNodeCheckerBroken": set(),
    "RscHealthGuardTripped": {""},  # fleet-wide: one series, no node
    "RscHealthQualifyFailing": set(),
    "RscHealthXidCatalogUnusable": set(),
    "RscHealthLemonCandidate": set(),
}


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read().decode())


@needs_promtool
@pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("prometheus-node-exporter")),
                    reason="prometheus / prometheus-node-exporter (Debian packages) not installed")
def test_a_real_prometheus_loads_the_shipped_files_and_each_alert_names_the_right_nodes(
        tmp_path):
    dirs = {"127.0.0.1": _sweep(tmp_path, "gpu-ok", xid79=False),
            "127.0.0.2": _sweep(tmp_path, "gpu-bad", xid79=True),
            "127.0.0.3": tmp_path / "never-swept"}
    dirs["127.0.0.3"].mkdir()
    fleet_dir = _fleet_export(tmp_path)
    port = free_port()
    fleet_port, prom_port = free_port(), free_port()
    daemons = [subprocess.Popen(
        ["prometheus-node-exporter", f"--web.listen-address={addr}:{p}",
         f"--collector.textfile.directory={d}", "--collector.disable-defaults",
         "--collector.textfile"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for addr, p, d in [*((a, port, d) for a, d in dirs.items()),
                           ("127.0.0.1", fleet_port, fleet_dir)]]
    # The shipped files, installed as the comment in prometheus.yml says; only the intervals
    # (1 s so the test does not wait minutes) and the addresses change.
    etc = tmp_path / "etc"
    (etc / "targets").mkdir(parents=True)
    shutil.copy(RULES, etc / RULES.name)
    config = (PROM / "prometheus.yml").read_text()
    for old, new in (("scrape_interval: 60s", "scrape_interval: 1s"),
                     ("evaluation_interval: 60s", "evaluation_interval: 1s"),
                     ('"rsc-manager:9100"', f'"127.0.0.1:{fleet_port}"'),
                     ('"localhost:9093"', f'"127.0.0.1:{free_port()}"')):
        assert old in config, old
        config = config.replace(old, new)
    (etc / "prometheus.yml").write_text(config)
    (etc / "targets" / "rsc-health-nodes.yml").write_text(
        "- targets: [" + ", ".join(f'"{a}:{port}"' for a in dirs) + "]\n")
    assert _promtool("check", "config", "prometheus.yml", cwd=etc).returncode == 0
    daemons.append(subprocess.Popen(
        ["prometheus", f"--config.file={etc / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    api = f"http://127.0.0.1:{prom_port}/api/v1"
    try:
        def query(q: str) -> list:
            return _get(f"{api}/query?" + urllib.parse.urlencode({"query": q}))["data"]["result"]

        deadline = time.monotonic() + 60
        ready = False
        while time.monotonic() < deadline and not ready:
            try:
                ready = (len(query('up{job="rsc-health-nodes"} == 1')) == 3
                         and bool(query("rsc_health_historian_up"))
                         and len(query("rsc_health_pending_drain")) == 2)
            except OSError:
                pass
            time.sleep(0.5)
        assert ready, "the scrape never came up"
        groups = _get(f"{api}/rules")["data"]["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        assert set(rules) == set(EXPECTED)
        assert all(r["health"] in ("ok", "unknown") for r in rules.values()), rules
        named = {}
        for name, rule in rules.items():
            result = query(rule["query"])
            named[name] = {s["metric"].get("instance") or s["metric"].get("node", "")
                           for s in result}
        print("alert expressions ->", json.dumps({k: sorted(v) for k, v in named.items()}))
        assert named == EXPECTED
        # The fleet export's age is read from node_exporter's own label as it spells it.
        assert query('node_textfile_mtime_seconds{file=~"(.*/)?rsc_health_fleet\\\\.prom"}')
        # Instances are the nodes' names without the port (the shipped relabelling).
        assert {s["metric"]["instance"] for s in query("rsc_health_verdict_level")} == {
            "127.0.0.1", "127.0.0.2"}
        # Rules without `for:` fire on the next evaluation: the guard trip is an alert now.
        deadline = time.monotonic() + 20
        firing: set[str] = set()
        while time.monotonic() < deadline and "RscHealthGuardTripped" not in firing:
            firing = {a["labels"]["alertname"] for a in _get(f"{api}/alerts")["data"]["alerts"]
                      if a["state"] == "firing"}
            time.sleep(0.5)
        assert "RscHealthGuardTripped" in firing
    finally:
        for d in daemons:
            d.terminate()
        for d in daemons:
            d.wait(10)


def test_a_stopped_sacct_ingest_is_alerted():
    """The export writes rsc_health_data_age_seconds{source="sacct"} so that a stopped
    `ingest sacct` is seen; no shipped rule read it (helper 203): with the ingest timer dead
    every fleet alert stayed green while r_f, MTTF, triage, lemon candidates and the suspect
    tier's job evidence froze."""
    text = RULES.read_text()
    exprs = re.findall(r"^\s*expr:\s*(.+)$", text, re.M)
    assert len(exprs) > 10, exprs  # the rules were read at all
    assert any("rsc_health_data_age_seconds" in e and 'source="sacct"' in e for e in exprs), exprs
