"""Every source bounded (issue 11): a mount whose statfs blocks in the kernel (a real FUSE
mount), an NVML that never answers (a pynvml that blocks) and a FIFO kernel-log source, all at
once: the prolog still returns within its budget, says what it could not look at, and exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.fixtures.nodes.node_copy import NODE_STATE

REPO = Path(__file__).resolve().parents[2]
FAULT = REPO / "tests" / "fixtures" / "fault"


def test_prolog_returns_within_its_budget_with_hung_mount_wedged_nvml_and_fifo(
        tmp_path, hung_mount):
    root = hung_mount
    fifo = root / "var/log/kern.fifo"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text().replace("[mounts]", "[mounts]\n") + """
[xid]
sources = ["/dev/kmsg", "/var/log/kern.fifo"]
[slurm]
bin_dir = "/nonexistent-slurm"
prolog_budget_s = 12
""")
    text = site.read_text().replace(
        "[gpu]\n", '[gpu]\nbackend = "nvml"\nnvml_binding = "pynvml"\nnvml_timeout_s = 2.0\n')
    site.write_text(text)
    env = dict(os.environ, RSC_HEALTH_ROOT=str(root), RSC_HEALTH_CONFIG=str(site),
               SLURMD_NODENAME="node01", SLURM_JOB_ID="77",
               PYTHONPATH=f"{FAULT / 'wedged_nvml'}:{REPO}")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rsc_health.nodepath", "prolog"], env=env,
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert took < 12 + 3, (took, proc.stderr)
    records = [json.loads(x) for x in
               (root / NODE_STATE / "spool/pending.jsonl").read_text().splitlines()]
    checks = {(r["check"], r["code"]) for r in records if r["kind"] == "check"}
    assert ("mount", "mount_hung") in checks
    reasons = " ".join(r["reason"] for r in records if r["kind"] == "check")
    assert "nvml" in reasons.lower() and "not a regular file" in reasons
    assert any(r["kind"] == "heartbeat" for r in records)
    # The hung mount is a real fault: the prolog fails the job start (Slurm is away here, so
    # the verdict is also kept for the next run).
    assert proc.returncode == 1
    assert (root / NODE_STATE / "pending_verdict.json").exists()
