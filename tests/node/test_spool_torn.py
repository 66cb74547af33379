"""A spool append cut short (the writer killed mid write(2), a full disk) must never cost a
record that is appended later: the next append starts on a fresh line, readers skip the torn
line (the historian quarantines it) and deliver everything around it.

Reproduced for real: a FUSE filesystem that hands the kernel's first chunk of a write to the
file and holds the next, while the test SIGKILLs the writer (tests/fixtures/fault/
tearing_fuse.py); and a 64 KiB tmpfs that fills up mid-record."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import spool

REPO = Path(__file__).resolve().parents[2]
FAULT = REPO / "tests" / "fixtures" / "fault"


def _mounted(point: Path) -> bool:
    return any(f" {point} " in line for line in Path("/proc/mounts").read_text().splitlines())


@pytest.fixture
def tearing_mount(tmp_path):
    try:
        import fuse  # noqa: F401
    except (ImportError, OSError):
        pytest.skip("fusepy is not available here")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount") is None:
        pytest.skip("FUSE is not available here")
    point, control = tmp_path / "spool", tmp_path / "control"
    point.mkdir()
    control.mkdir()
    proc = subprocess.Popen([sys.executable, str(FAULT / "tearing_fuse.py"), str(point),
                             str(control)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(200):
        if _mounted(point):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.skip(f"could not mount FUSE here: {proc.stderr.read().decode()[:200]}")
    yield point, control
    (control / "release").touch()
    subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)
    proc.kill()
    proc.wait(10)


def _records(path: Path) -> tuple[list[dict], list[str]]:
    good, bad = [], []
    for _, rec, raw in spool.read_batch(path):
        (good.append(rec) if rec is not None else bad.append(raw))
    return good, bad


WRITER = """
import sys
from pathlib import Path
from rsc_health import spool
spool.append(Path(sys.argv[1]), [{"kind": "check", "n": 2, "reason": "x" * (1 << 20)}])
"""


def test_a_writer_killed_mid_append_costs_only_its_own_record(tearing_mount):
    point, control = tearing_mount
    spool.append(point, [{"kind": "check", "n": 1}])
    (control / "tear").touch()
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(point)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    for _ in range(400):
        if (control / "blocked").exists():
            break
        time.sleep(0.025)
    else:
        child.kill()
        pytest.fail("the writer never reached its second chunk")
    child.send_signal(signal.SIGKILL)
    (control / "release").touch()
    assert child.wait(20) == -signal.SIGKILL
    (control / "tear").unlink()
    torn = (point / spool.PENDING).read_bytes()
    # The kill really tore the record: its first chunk is in the file, no newline after it.
    assert torn.startswith(b'{"kind":"check","n":1}\n{') and not torn.endswith(b"\n")

    spool.append(point, [{"kind": "check", "n": 3}, {"kind": "check", "n": 4}])
    good, bad = _records(point / spool.PENDING)
    assert [r["n"] for r in good] == [1, 3, 4]
    assert len(bad) == 1 and bad[0].startswith('{"kind":"check","n":2')


@pytest.fixture
def tiny_tmpfs(tmp_path):
    point = tmp_path / "tiny"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode()[:200]}")
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_disk_that_fills_mid_record_keeps_the_spool_whole(tiny_tmpfs):
    """ENOSPC part way through: a short write(2), then nothing. The append is cut back to
    where it started and raises; what was there and what comes after are intact."""
    spool.append(tiny_tmpfs, [{"kind": "check", "n": 1}])
    before = (tiny_tmpfs / spool.PENDING).read_bytes()
    with pytest.raises(OSError):
        spool.append(tiny_tmpfs, [{"kind": "check", "n": 2, "reason": "x" * 200_000}])
    assert (tiny_tmpfs / spool.PENDING).read_bytes() == before
    spool.append(tiny_tmpfs, [{"kind": "check", "n": 3}])
    assert [r["n"] for r in _records(tiny_tmpfs / spool.PENDING)[0]] == [1, 3]


def test_a_torn_last_line_left_by_anyone_is_followed_by_a_fresh_line(tmp_path):
    """Whoever tore it (a kernel crash after a partial writeback, an older writer): the next
    append still lands as whole records of their own."""
    sdir = tmp_path / "spool"
    sdir.mkdir()
    (sdir / spool.PENDING).write_bytes(b'{"kind":"check","n":1}\n{"kind":"check","n":2,"rea')
    spool.append(sdir, [{"kind": "check", "n": 3}])
    good, bad = _records(sdir / spool.PENDING)
    assert [r["n"] for r in good] == [1, 3] and len(bad) == 1
    # A file that ends on a newline gets none added.
    spool.append(sdir, [{"kind": "check", "n": 4}])
    assert (sdir / spool.PENDING).read_bytes().endswith(b'{"kind":"check","n":3}\n'
                                                        b'{"kind":"check","n":4}\n')


def test_a_batch_claimed_with_a_torn_last_line_delivers_the_rest(tmp_path):
    """claim() moves pending.jsonl aside as it is, torn tail and all; the batch reader yields
    every whole record and the torn line as one unreadable line (the historian quarantines
    it); appends after the claim start a new, clean pending file."""
    sdir = tmp_path / "spool"
    spool.append(sdir, [{"kind": "check", "n": 1}])
    with open(sdir / spool.PENDING, "ab") as fh:
        fh.write(b'{"kind":"check","n":2,"rea')
    [batch] = spool.claim(sdir)
    spool.append(sdir, [{"kind": "check", "n": 3}])
    good, bad = _records(batch)
    assert [r["n"] for r in good] == [1] and bad == ['{"kind":"check","n":2,"rea']
    assert [r["n"] for r in _records(sdir / spool.PENDING)[0]] == [3]
    json.loads((sdir / spool.PENDING).read_text())
