"""Node fixtures: a private copy of `healthy` per test, edited into one failure mode."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health.config import load_config
from rsc_health.engine import run
from rsc_health.policy import decide
from tests.fixtures.nodes.node_copy import copy_node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
FAULT = FIXTURES.parent / "fault"


class Node:
    def __init__(self, root: Path):
        self.root = root

    @property
    def config(self):
        return load_config(self.root / "config.toml")

    def path(self, rel: str) -> Path:
        return self.root / rel

    def write(self, rel: str, text: str) -> None:
        p = self.path(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def append(self, rel: str, text: str) -> None:
        with self.path(rel).open("a") as fh:
            fh.write(text)

    def nvml(self, edit) -> None:
        import json

        p = self.path("rsc_health/nvml.json")
        doc = json.loads(p.read_text())
        edit(doc)
        p.write_text(json.dumps(doc))

    def check(self, **kw):
        findings = run(self.config, self.root, **kw)
        return findings, decide(findings)


def bad(findings):
    return [f for f in findings if f.status.value != "ok"]


@pytest.fixture
def node(tmp_path) -> Node:
    root = tmp_path / "node"
    copy_node(root, FIXTURES / "healthy")
    return Node(root)


def _fuse_available() -> bool:
    try:
        import fuse  # noqa: F401
    except (ImportError, OSError):
        return False
    return os.path.exists("/dev/fuse") and shutil.which("fusermount") is not None


def start_fuse(point: Path, script: Path, *args: str) -> subprocess.Popen:
    """Start a FUSE stand-in (tests/.../fault/*.py) and wait until `point` is mounted; the
    test is skipped when FUSE cannot mount here."""
    proc = subprocess.Popen([sys.executable, str(script), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(100):
        if any(f" {point} " in line for line in Path("/proc/mounts").read_text().splitlines()):
            return proc
        time.sleep(0.05)
    proc.kill()
    pytest.skip(f"could not mount FUSE here: {proc.stderr.read().decode()[:200]}")


@pytest.fixture
def hung_mount(tmp_path):
    if not _fuse_available():
        pytest.skip("FUSE (fusepy and /dev/fuse) is not available here")
    root = copy_node(tmp_path / "node", FIXTURES / "healthy")
    point = root / "checkpoint"
    proc = start_fuse(point, FAULT / "hung_fuse.py", str(point))
    yield root
    proc.kill()  # the kernel then fails every waiting statfs; then unmount
    proc.wait(10)
    subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)
