"""Metrics in Prometheus (issue 14): the node path's textfile and `healthctl metrics export`,
scraped by a real node_exporter's textfile collector, scraped in turn by a real Prometheus,
and asked with PromQL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import copy_node
from tests.ports import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]




def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _node_path_textfile(tmp_path, textdir: Path) -> None:
    """A real sweep of the healthy fixture, writing its textfile (Slurm is not asked: the
    actions step is out of this test)."""
    root = copy_node(tmp_path / "node")
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text()
                    + f'\n[node]\ntextfile_dir = "{textdir}"\n')
    env = dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(site),
               SLURMD_NODENAME="node01", PYTHONPATH=str(REPO))
    code = ("import sys; from rsc_health import nodepath; "
            "nodepath._act = lambda ctx, verdict, pending, **kw: (0, False); "
            "sys.exit(nodepath.main(['sweep']))")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    # textfile_dir is under the root (like every node path), so the file is in the root copy.
    written = root / str(textdir).lstrip("/") / nodepath.TEXTFILE
    shutil.copy(written, textdir / nodepath.TEXTFILE)


@pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("prometheus-node-exporter")),
                    reason="prometheus / prometheus-node-exporter (Debian packages) not installed")
def test_prometheus_scrapes_the_sweep_textfile_and_the_fleet_export(tmp_path, fleet):
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    _node_path_textfile(tmp_path, textdir)
    now = datetime.utcnow()
    for k in range(6):
        fleet.xid("bad1", now - timedelta(days=2 * k + 1))  # separate days: 6 episodes
    url = fleet.engine.url.render_as_string(hide_password=False)
    out = subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config", os.devnull,
                          "--db", url, "metrics", "export", "--out",
                          str(textdir / "rsc_health_fleet.prom")],
                         env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ne_port, prom_port = _free_port(), _free_port()
    exporter = subprocess.Popen(
        ["prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{ne_port}",
         f"--collector.textfile.directory={textdir}", "--collector.disable-defaults",
         "--collector.textfile"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: node\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{ne_port}']}}]\n")
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def query(q: str) -> list:
            body = _get(f"http://127.0.0.1:{prom_port}/api/v1/query?"
                        + urllib.parse.urlencode({"query": q}))
            return json.loads(body)["data"]["result"]

        deadline = time.monotonic() + 40
        result = []
        while time.monotonic() < deadline:
            try:
                result = query('rsc_health_verdict_level{source="sweep"}')
                if result and query("rsc_health_lemon_candidates"):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert result and result[0]["value"][1] == "0"  # the healthy sweep: OK
        assert query('rsc_health_family_status{family="gpu"}')[0]["value"][1] == "0"
        assert query("rsc_health_lemon_candidates")[0]["value"][1] == "1"
        assert query('rsc_health_lemon_candidate{node="bad1"}')
        assert query("rsc_health_pending_drain")[0]["value"][1] == "0"
        # Shown with `pytest -s`: what an operator's PromQL gets back.
        for q in ('rsc_health_verdict_level{source="sweep"}', "rsc_health_lemon_candidates"):
            print("PromQL", q, "->", json.dumps(query(q)))
        assert query("rsc_health_textfile_scrape_error") == [] or query(
            "node_textfile_scrape_error")[0]["value"][1] == "0"
    finally:
        prom.terminate()
        exporter.terminate()
        prom.wait(10)
        exporter.wait(10)


def test_the_grafana_dashboard_only_uses_metrics_that_are_written():
    """Every rsc_health_* name the shipped dashboard queries is one the node path's textfile
    or `metrics export` writes."""
    import re

    from rsc_health.node import sinks

    dash = json.loads((REPO / "deploy/grafana/rsc-health.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"]
            for m in re.findall(r"rsc_health_[a-z0-9_]+", t["expr"])}
    source = (REPO / "rsc_health/exporter/historian.py").read_text()
    written = set(sinks.HELP) | set(re.findall(r'"(rsc_health_[a-z0-9_]+)"', source))
    assert used and used <= written, used - written
