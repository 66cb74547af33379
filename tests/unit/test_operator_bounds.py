"""Bounds on what an operator types: a hostlist typo is one line at once, never gigabytes."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import hostlist

REPO = Path(__file__).resolve().parents[2]


def _stand_in_slurm(tmp_path: Path) -> tuple[Path, Path]:
    """A [slurm] bin_dir whose every command records that it was called."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name in ("scontrol", "sinfo", "squeue"):
        prog = bin_dir / name
        prog.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {calls}\nexit 1\n")
        prog.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'[slurm]\nbin_dir = "{bin_dir}"\n')
    return config, calls


def _limit_memory() -> None:  # main expanded 10^8 names: let it fail fast, not eat the host
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("verb", [["drain", "--reason", "rack swap"], ["resume"]])
def test_a_hostlist_typo_is_refused_in_one_line_before_anything_is_expanded(tmp_path, verb):
    """`healthctl drain 'node[0-99999999]'` (for node[0-99]) expanded 10^8 names: 30-70 s,
    gigabytes, then MemoryError (issue 21). Now the same bound as the sacct ingest, counted
    first: one line, at once, and Slurm is never asked."""
    config, calls = _stand_in_slurm(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), RSC_HEALTH_DB="")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rsc_health.cli", "--config", str(config), verb[0],
         "node[0-99999999]", *verb[1:]],
        capture_output=True, text=True, env=env, timeout=60, preexec_fn=_limit_memory)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert proc.stderr == ("Error: NODES: 'node[0-99999999]' names 100,000,000 hosts, more "
                           "than 100,000\n")
    assert "Traceback" not in proc.stderr and not calls.exists()
    assert elapsed < 15, elapsed


def test_count_matches_expand_and_needs_no_expansion():
    for expr in ("node[001-003,010],gpu7", "rack[1-2]-n[01-02]", "a,b,c[7]", "None assigned"):
        assert hostlist.count(expr) == len(hostlist.expand(expr))
    assert hostlist.count("n[0-99999999999999999999]") == 10**20  # arithmetic, no names
    with pytest.raises(hostlist.HostlistError, match="more than 100,000"):
        hostlist.expand("n[1-100001]")
    assert len(hostlist.expand("n[1-100000]")) == hostlist.MAX_HOSTS
    with pytest.raises(hostlist.HostlistError, match="descending"):
        hostlist.count("n[9-1]")


def test_shadow_mode_drain_and_resume_ask_slurm_nothing_and_record_what_would_have_drained(
        tmp_path):
    """[actions] enabled = false: `healthctl drain` and `resume` called scontrol update all
    the same (lemons --apply and qualify start/cleanup already changed nothing). Now Slurm is
    never asked; the drain is recorded as would_drain."""
    import json

    config, calls = _stand_in_slurm(tmp_path)
    config.write_text(config.read_text() + "[actions]\nenabled = false\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), RSC_HEALTH_DB="")
    root = tmp_path / "root"
    for verb in (["drain", "node[01-02]", "--reason", "rack swap", "--now"],
                 ["resume", "node01", "--force"]):
        proc = subprocess.run(
            [sys.executable, "-m", "rsc_health.cli", "--config", str(config), "--root",
             str(root), *verb], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "shadow mode" in proc.stdout and "nothing changed" in proc.stdout, proc.stdout
    assert not calls.exists(), calls.read_text()
    [pending] = list(root.rglob("pending.jsonl"))
    recs = [json.loads(line) for line in pending.read_text().splitlines()]
    assert [(r["action"], r["node"]) for r in recs] == [("would_drain", "node01"),
                                                        ("would_drain", "node02")]
    assert recs[0]["reason"].startswith("rsc_health:manual:manual:rack swap by ")
