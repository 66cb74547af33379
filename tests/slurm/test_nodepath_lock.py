"""The per-node lock: a sweep and a prolog never act over each other."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health.nodepath import LockTimeout, node_lock
from tests.fixtures.nodes.node_copy import HEALTHY, copy_node

REPO = Path(__file__).resolve().parents[2]


def test_second_holder_waits_then_gives_up(tmp_path):
    with node_lock(tmp_path, 1):
        t0 = time.monotonic()
        with pytest.raises(LockTimeout), node_lock(tmp_path, 0.3):
            pass
        assert 0.3 <= time.monotonic() - t0 < 2
    with node_lock(tmp_path, 0.3):  # released: free again
        pass


def test_sweep_judges_read_only_while_a_prolog_holds_the_lock(tmp_path):
    root = tmp_path / "node"
    copy_node(root, HEALTHY)
    (root / "site.toml").write_text((HEALTHY / "config.toml").read_text()
                                    + "\n[slurm]\nlock_timeout_s = 0.5\n")
    env = dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(root / "site.toml"),
               SLURMD_NODENAME="node01", PYTHONPATH=str(REPO))
    sdir = root / "var/lib/rsc_health"
    with node_lock(sdir, 1):
        out = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "sweep"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "judging without it" in out.stderr
    # It looked and spooled, but consumed nothing: the cursor is the lock holder's.
    assert "lock_held" in (sdir / "spool" / "pending.jsonl").read_text()
    assert not (sdir / "xid_cursor.json").exists()
