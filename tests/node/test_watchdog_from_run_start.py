"""The watchdog counts the run's budget from the run's start, as its deadline does.

It was armed with the packaged budget before the config is read and re-armed with the config's
once it was, counted from then: a config that took long to load (its filesystem slow to
answer, a server retrying) moved the watchdog that far past the run's own deadline
(run.started + budget), and a run then stuck in the kernel (its textfile dir on a server that
went away) overran its budget, and slurm.conf's PrologEpilogTimeout, by that much.

Real filesystems: the site config on a FUSE mount whose every read of it takes seconds
(tests/fixtures/fault/hung_read_fuse.py), the textfile dir on one whose lookups never answer
(hung_lookup_fuse.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health.node.exits import Watchdog
from tests.fixtures.nodes.node_copy import copy_node

from .conftest import FAULT, _fuse_available, start_fuse

REPO = Path(__file__).resolve().parents[2]
BUDGET = 5
SLOW_READ_S = 2.5  # each read of the config: its load takes two (the text, then its end)


@pytest.fixture
def slow_config_hung_textfile(tmp_path):
    if not _fuse_available():
        pytest.skip("FUSE (fusepy and /dev/fuse) is not available here")
    root = copy_node(tmp_path / "node")
    source = tmp_path / "etc-source"
    source.mkdir()
    os.chmod(source, 0o755)
    (source / "site.toml").write_text(
        (root / "config.toml").read_text()
        + '\n[node]\ntextfile_dir = "/var/lib/node_exporter"\n'
        + f'\n[slurm]\nbin_dir = "/nonexistent-slurm"\nprolog_budget_s = {BUDGET}\n')
    etc = tmp_path / "etc"
    etc.mkdir()
    procs = [start_fuse(etc, FAULT / "hung_read_fuse.py", str(source), str(etc), "site.toml",
                        str(SLOW_READ_S))]
    textfile = root / "var/lib/node_exporter"
    textfile.mkdir(parents=True)
    procs.append(start_fuse(textfile, FAULT / "hung_lookup_fuse.py", str(textfile)))
    # The one thread serving the mount is taken by this lookup; the run's own waits queued.
    holder = subprocess.Popen(["stat", str(textfile / "holder" / "held")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    yield root, etc / "site.toml"
    for proc in reversed(procs):
        proc.kill()  # the kernel fails every waiter (the holder too)
        proc.wait(10)
    holder.wait(10)
    for point in (textfile, etc):
        subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)
    shutil.rmtree(source, ignore_errors=True)


def test_a_slow_config_load_does_not_push_the_watchdog_past_the_runs_budget(
        slow_config_hung_textfile):
    root, site = slow_config_hung_textfile
    env = {**os.environ, "PYTHONPATH": str(REPO), "RSC_HEALTH_ROOT": str(root),
           "RSC_HEALTH_CONFIG": str(site), "SLURMD_NODENAME": "node01", "SLURM_JOB_ID": "4242"}
    env.pop("SLURM_JOB_PARTITION", None)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "prolog"],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    took = time.monotonic() - started
    # The config was read (slowly) and the run went on to hang in its textfile.
    assert "during textfile" in out.stderr, out.stderr
    assert "bad config" not in out.stderr, out.stderr
    assert took >= SLOW_READ_S, (took, out.stderr)
    # Gone by the budget, the watchdog's 2 s past it and its 1 s backstop (plus the
    # interpreter's start), not that plus the config's load.
    assert took < BUDGET + 2.0 + Watchdog.BACKSTOP_S + 1.5, (took, out.stderr)
    assert out.returncode == 0, out.stderr  # a checker fault lets the job run


def test_the_lock_wait_is_a_third_of_what_the_config_load_left(monkeypatch, tmp_path):
    """The wait for the node lock was a third of the whole budget whatever the config's load had
    already spent, so after a slow load the wait plus the checks ran into the watchdog instead
    of ending inside the budget (helper-117). It is a third of what is left."""
    from rsc_health import nodepath
    from rsc_health.node.store import LockTimeout

    from .test_nodepath_faults import node_env

    root = node_env.__wrapped__(tmp_path, monkeypatch)
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text() + "\n[slurm]\nprolog_budget_s = 3\nlock_timeout_s = 10\n"
                    'bin_dir = "/nonexistent-slurm"\n')
    real_load, waits = nodepath.load_config_compiled, []

    def slow_load(where):
        cfg = real_load(where)
        time.sleep(1.5)  # half of the budget
        return cfg

    class HeldLock:  # another run holds it: record how long this one would wait
        def __init__(self, sdir, timeout_s):
            waits.append(timeout_s)

        def __enter__(self):
            raise LockTimeout("held")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(nodepath, "load_config_compiled", slow_load)
    monkeypatch.setattr(nodepath, "node_lock", HeldLock)
    assert nodepath.run_stage("prolog") == 0
    assert root.exists() and len(waits) == 1
    assert 0 <= waits[0] <= 0.5 + 0.05, waits  # (3 - 1.5) / 3, not 3 / 3
