"""A clean sweep's import budget: every node runs one every few minutes, for ever.

A sweep that finds nothing wrong and has no drain of ours on record asks Slurm nothing
(node.act), so it has no use for the Slurm side either: rsc_health.actions alone brought
json, dataclasses, typing, rsc_health.slurm and its command-line backend (subprocess) into
every clean sweep, only to read the name of the drain record (store.has_drain_state).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rsc_health.node import store
from tests.fixtures.nodes.node_copy import copy_node

REPO = Path(__file__).resolve().parents[2]

PROBE = ("import sys; sys.path[:] = [p for p in sys.path if p]; import os\n"
         "from rsc_health.nodepath import main\n"
         "code = main(['sweep'])\n"
         "ours = sorted(m for m in sys.modules if m.startswith('rsc_health'))\n"
         "print('MODULES', ' '.join(ours))\n"
         "sys.stdout.flush(); os._exit(code)\n")


def test_a_clean_sweep_loads_nothing_of_the_slurm_side(tmp_path):
    root = copy_node(tmp_path / "node")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "RSC_HEALTH", "PYTHON"))}
    env.update(PYTHONPATH=str(REPO), RSC_HEALTH_ROOT=str(root), SLURMD_NODENAME="node01",
               RSC_HEALTH_CONFIG=str(root / "config.toml"))
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("MODULES ")]
    loaded = set(line.split()[1:])
    assert "rsc_health.engine" in loaded and "rsc_health.node.act" in loaded  # it judged
    spool = root / "var/lib/rsc_health/spool"
    beats = [json.loads(x) for f in sorted(spool.glob("*.jsonl"))
             for x in f.read_text().splitlines() if '"heartbeat"' in x]
    assert [(b["source"], b["level"]) for b in beats] == [("sweep", "ok")]  # a clean one
    slurm_side = sorted(m for m in loaded
                        if m == "rsc_health.actions" or m.startswith("rsc_health.slurm"))
    assert not slurm_side, slurm_side


def test_a_drain_record_is_on_record_only_when_a_file_stands_at_its_name(tmp_path):
    """store.has_drain_state, as Path.exists said it: none for a missing name, a dangling or
    looping symlink, a state dir that is a file; on record for a file (or a symlink to
    one) and a directory there."""
    record = tmp_path / store.DRAIN_RECORD
    assert store.has_drain_state(tmp_path) is False
    record.symlink_to(tmp_path / "gone")
    assert store.has_drain_state(str(tmp_path)) is False
    record.unlink()
    record.symlink_to(record)
    assert store.has_drain_state(tmp_path) is False
    record.unlink()
    record.write_text("{}")
    assert store.has_drain_state(tmp_path) is True
    assert store.has_drain_state(str(tmp_path) + "/") is True
    assert store.has_drain_state(record) is False  # a file where the state dir should be
    record.unlink()
    record.mkdir()
    assert store.has_drain_state(tmp_path) is True
