"""A power cut leaves the node's JSON state files cut short, and the next job start is a fresh
interpreter, as slurmd runs it: one that imported nothing it did not need (issue 25's diet
takes json and json.decoder off the job start). Tests that run the node path inside pytest
cannot see what such an interpreter does with a garbled file (pytest has json loaded), so
this one runs the scripts' own code in a fresh interpreter.

What must hold: every cut-short file is read as lost (said, rebuilt, a pending verdict
discarded), never a checker fault that stops the run before it judges, and never for good:
the next job start is clean of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rsc_health.node.start import JOB_START_CODE
from tests.fixtures.nodes.node_copy import copy_node

REPO = Path(__file__).resolve().parents[2]
STATE = "var/lib/rsc_health"


def _start(root: Path, tmp_path: Path, stage: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "RSC_HEALTH", "PYTHON"))}
    env.update(PYTHONPATH=str(REPO), RSC_HEALTH_ROOT=str(root), SLURMD_NODENAME="node01",
               RSC_HEALTH_CONFIG=str(root / "config.toml"), SLURM_JOB_ID="77",
               SLURM_JOB_NODELIST="node[01-02]")
    return subprocess.run([sys.executable, "-c", JOB_START_CODE, stage], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def _beats(root: Path) -> list[dict]:
    spool = root / STATE / "spool"
    return [json.loads(line) for f in sorted(spool.glob("*.jsonl"))
            for line in f.read_text().splitlines() if '"heartbeat"' in line]


def test_a_job_start_after_a_power_cut_reads_cut_short_state_as_lost_not_as_a_fault(tmp_path):
    root = copy_node(tmp_path / "node")
    first = _start(root, tmp_path, "sweep")
    assert first.returncode == 0, first.stderr[-2000:]
    sdir = root / STATE
    cut = {"xid_cursor.json", "counters.json", "last_good_config.json"}
    assert cut <= {p.name for p in sdir.iterdir()}
    for name in cut:
        text = (sdir / name).read_text()
        (sdir / name).write_text(text[:text.index(":") + 1] + ' "0b2c')  # `{"boot_id": "0b2c`
    (sdir / "pending_verdict.json").write_text('{"level": 3, "why": "slurm_unavail')

    after = _start(root, tmp_path, "prolog")

    assert after.returncode == 0, after.stderr[-2000:]
    assert "checker fault" not in after.stderr and "SystemError" not in after.stderr, \
        after.stderr[-2000:]
    assert "corrupt pending_verdict.json discarded" in after.stderr
    assert not (sdir / "pending_verdict.json").exists()
    assert [b["source"] for b in _beats(root)] == ["sweep", "prolog"]  # it judged, and said so
    again = _start(root, tmp_path, "prolog")
    assert again.returncode == 0 and not again.stderr, again.stderr[-2000:]
    assert _beats(root)[-1]["level"] == "ok"
    for name in cut:
        json.loads((sdir / name).read_text())  # rebuilt whole
