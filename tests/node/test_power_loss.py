"""A power cut on a node never costs a pending drain verdict, a spooled record or the XID cursor.

Reproduced for real: the node's state dir is a FUSE filesystem that keeps only what was made
durable (tests/fixtures/fault/powerloss_fuse.py): a file's bytes as of its last fsync, a
directory's names as of its last fsync of the directory. Cutting the power there and
"rebooting" (a new boot id, a fresh ring buffer) shows what the next run finds on a real disk.

Two disks are modelled: one that forgets every name created or renamed since its directory's
last fsync, and one whose metadata journal committed the renames but not the bytes behind them
(a state file renamed into place unsynced comes back empty)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import nodepath
from rsc_health.slurm.api import NodeInfo
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import NODE, node01_slurm, slurm_away

REPO = Path(__file__).resolve().parents[2]
FAULT = REPO / "tests" / "fixtures" / "fault"
CUTS = (".powerloss", ".powerloss-journaled")
NEW_BOOT = "99999999-8888-7777-6666-555555555555\n"


def _mounted(point: Path) -> bool:
    return any(f" {point} " in line for line in Path("/proc/mounts").read_text().splitlines())


@pytest.fixture
def powerloss_state(node_env):  # noqa: F811 - pytest fixture by name
    """The node's state dir on a filesystem that can lose power; yields (root, cut)."""
    try:
        import fuse  # noqa: F401
    except (ImportError, OSError):
        pytest.skip("fusepy is not available here")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount") is None:
        pytest.skip("FUSE is not available here")
    sdir = node_env / NODE_STATE
    sdir.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, str(FAULT / "powerloss_fuse.py"), str(sdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(200):
        if _mounted(sdir):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.skip(f"could not mount FUSE here: {proc.stderr.read().decode()[:200]}")

    def cut(kind: str) -> None:
        assert not (sdir / kind).exists()  # the lookup is the power cut
        # The node comes back: a new boot, a ring buffer that starts empty.
        (node_env / "proc/sys/kernel/random/boot_id").write_text(NEW_BOOT)

    yield node_env, cut
    subprocess.run(["fusermount", "-u", "-z", str(sdir)], capture_output=True)
    proc.kill()
    proc.wait(10)


def _spooled(root: Path) -> list[dict]:
    path = root / NODE_STATE / "spool" / "pending.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("kind", CUTS)
def test_a_drain_verdict_kept_for_an_absent_slurm_survives_a_power_cut(powerloss_state, kind):
    root, cut = powerloss_state
    kmsg = root / "dev/kmsg"
    ring = kmsg.read_text()
    kmsg.write_text(ring + XID79)
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm_away()) == 0

    cut(kind)
    kmsg.write_text(ring)  # the XID went with the old boot's ring buffer
    slurm = node01_slurm()
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0

    drains = [c for c in slurm.calls if c[0] == "drain"]
    assert len(drains) == 1 and drains[0][2].startswith("rsc_health:now:xid79:")
    records = _spooled(root)
    assert [r["code"] for r in records if r.get("code") == "xid79"] == ["xid79"]
    assert len([r for r in records if r["kind"] == "heartbeat"]) == 2


@pytest.mark.parametrize("kind", CUTS)
def test_a_power_cut_never_has_a_repaired_node_drained_again_for_an_old_logged_xid(
        powerloss_state, kind):
    root, cut = powerloss_state
    log = root / "var/log/kern.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("Nov 21 03:14:15 node01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid=77, "
                   "name=python3, GPU has fallen off the bus.\n")
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text() + '\n[xid]\nsources = ["/var/log/kern.log"]\n')
    first = node01_slurm()
    nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: first)
    assert [c[0] for c in first.calls][:1] == ["drain"]  # the XID, when it was news

    # Repaired and resumed by a person; two clean sweeps since.
    for _ in range(2):
        healthy = node01_slurm()
        assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d, s=healthy: s) == 0
        assert healthy.calls == []
    cut(kind)
    after = node01_slurm()
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: after) == 0
    assert after.calls == []
    assert NodeInfo(NODE, "MIXED", partitions=("gpu",)) == after.info[NODE]
