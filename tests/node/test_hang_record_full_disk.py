"""A hung probe leaves one stuck child per probe, whatever the state dir's disk does.

The record of the child a run abandoned (probe_hangs.json: its pid and start time) was saved
with the rest of the node state, after the spool: on a full (ENOSPC) or read-only (EROFS)
state dir it was never saved, and every prolog and sweep forked one more statvfs child to join
the others in the kernel behind the hung mount: one per run, hundreds in a day-long storage
outage. Now the record is also kept in a runtime dir on tmpfs (<root>/run/rsc-health), the
newer copy is read, and a run that finds neither copy it can trust (or a state dir that
refuses writes, or the node lock held) looks for the children earlier runs abandoned in /proc.

Real filesystems: a tiny tmpfs filled to the last block, or mounted read-only, as the state
dir (and the runtime dir); a real FUSE mount whose statfs never answers (conftest.hung_mount).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import durable, engine
from rsc_health.collect import bounded, hangs
from rsc_health.config import load_config
from rsc_health.node.sinks import TEXTFILE
from tests.fixtures.nodes.node_copy import NODE_STATE

from .conftest import FAULT, _fuse_available, start_fuse
from .test_hung_probe_lock import HOLDER, _env, _probes_left_behind, _stage

RUNTIME = Path("run") / "rsc-health"
PROBE = "statvfs /checkpoint"


def _tmpfs(point: Path, size: str = "64k") -> None:
    point.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode()[:200]}")


def _fill(point: Path) -> None:
    """Every block of the filesystem at `point` taken (its inodes are not: as on a real disk
    that filled, an empty file can still be made)."""
    with open(point / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with pytest.raises(OSError) as exc:
        (point / "probe").write_bytes(b"x" * 4096)
    assert exc.value.errno == errno.ENOSPC


def _read_only(point: Path) -> None:
    done = subprocess.run(["mount", "-o", "remount,ro", str(point)], capture_output=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(OSError) as exc:
        (point / "probe").write_bytes(b"x")
    assert exc.value.errno == errno.EROFS


@pytest.fixture
def mounted():
    points: list[Path] = []
    yield points
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _site(root: Path, extra: str = "") -> None:
    (root / "site.toml").write_text(
        (root / "config.toml").read_text().replace("probe_timeout_s = 2.0",
                                                   "probe_timeout_s = 0.5")
        + '\n[node]\ntextfile_dir = "/textfile"\n'
        + '\n[slurm]\nbin_dir = "/nonexistent-slurm"\n' + extra)


def _prologs(root: Path, n: int) -> list[subprocess.CompletedProcess]:
    out = []
    for i in range(n):
        prolog, _ = _stage(root, "prolog", SLURM_JOB_ID=str(100 + i))
        # The mount is hung: every job start is refused (judged from the child still waiting),
        # and each says which probe hangs (the textfile is on a disk with room).
        assert prolog.returncode == 1, prolog.stderr
        text = (root / "textfile" / TEXTFILE).read_text()
        assert f'rsc_health_probe_hung_since_seconds{{source="prolog",probe="{PROBE}"}}' \
            in text, text
        out.append(prolog)
    return out


def test_prologs_on_a_full_state_dir_leave_one_child_stuck_on_a_hung_mount(hung_mount, mounted):
    root, sdir = hung_mount, hung_mount / NODE_STATE
    _site(root)
    _tmpfs(sdir)
    mounted.append(sdir)
    _fill(sdir)
    _prologs(root, 4)
    left = _probes_left_behind(root)
    assert len(left) == 1, left
    # Nothing could be saved in the state dir; the runtime dir (tmpfs) names the child.
    assert not (sdir / engine.HANGS_FILE).exists()
    kept = json.loads((root / RUNTIME / engine.HANGS_FILE).read_text())["probes"]
    assert kept[PROBE]["pid"] == left[0]


def test_prologs_on_a_full_state_dir_and_a_full_runtime_dir_leave_one_stuck_child(
        hung_mount, mounted):
    """No copy of the record can be written: the run leaves an empty one where it can (an
    empty file takes no block), and the next run, finding no record it can read, finds the
    abandoned child in /proc."""
    root, sdir = hung_mount, hung_mount / NODE_STATE
    _site(root)
    for point in (sdir, root / "run"):
        _tmpfs(point)
        mounted.append(point)
        _fill(point)
    _prologs(root, 4)
    left = _probes_left_behind(root)
    assert len(left) == 1, left


def test_prologs_on_a_read_only_state_dir_and_runtime_dir_leave_one_stuck_child(
        hung_mount, mounted):
    """Nothing at all can be written, not even an empty file: the state dir refusing writes
    (the node lock's open says so) is itself the sign to look in /proc."""
    root, sdir = hung_mount, hung_mount / NODE_STATE
    _site(root)
    for point in (sdir, root / "run"):
        _tmpfs(point)
        mounted.append(point)
    (sdir / "node.lock").touch()
    (root / RUNTIME).mkdir()
    for point in (sdir, root / "run"):
        _read_only(point)
    _prologs(root, 4)
    left = _probes_left_behind(root)
    assert len(left) == 1, left


def test_sweeps_that_find_the_node_lock_held_leave_one_stuck_child(hung_mount):
    """A run judging without the lock (held by a run stuck in the kernel, an older release)
    saves no state: it finds the children abandoned before it in /proc."""
    root, sdir = hung_mount, hung_mount / NODE_STATE
    _site(root, "lock_timeout_s = 1\n")
    sdir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(sdir / "node.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for _ in range(3):
            sweep, _ = _stage(root, "sweep")
            assert sweep.returncode == 0, sweep.stderr
            assert "judging without it" in sweep.stderr
        left = _probes_left_behind(root)
        assert len(left) == 1, left
    finally:
        holder.kill()
        holder.wait(10)


# --- in-process: ENOSPC on every write that needs a block ------------------------------------

def _stuck_children() -> list[int]:
    """This process's children with a thread in the kernel (state D): the stuck probes."""
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]) != me:
                continue
            states = [t.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
                      for t in entry.joinpath("task").iterdir()]
        except (OSError, IndexError, ValueError):
            continue
        if "D" in states:
            out.append(int(entry.name))
    return out


def test_sweeps_whose_every_state_write_fails_with_enospc_leave_one_stuck_child(
        hung_mount, monkeypatch):
    root = hung_mount
    _site(root)
    cfg = load_config(root / "site.toml")
    real = durable.write_atomic

    def full(path, data, **kw):
        if data:  # an empty file needs no block: a full disk still takes it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data, **kw)

    monkeypatch.setattr(durable, "write_atomic", full)
    before = set(_stuck_children())
    for _ in range(3):
        findings = engine.run(cfg, root, only={"mount"}, sweep=True)
        assert "mount_hung" in {f.code for f in findings}
        assert any("No space left" in f.reason for f in findings if f.family == "checker")
    assert len(set(_stuck_children()) - before) == 1


# --- the scan: who counts as an abandoned child ------------------------------------------------

@pytest.fixture
def shared_hung_mount(tmp_path):
    """A FUSE mount whose statfs never answers, open to every user (allow_other)."""
    if not _fuse_available():
        pytest.skip("FUSE (fusepy and /dev/fuse) is not available here")
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="rsc-shared-"))  # reachable by every user
    top.chmod(0o755)
    point = top / "mnt"
    point.mkdir()
    proc = start_fuse(point, FAULT / "hung_fuse.py", str(point), "--allow-other")
    yield point
    proc.kill()
    proc.wait(10)
    subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)
    shutil.rmtree(top, ignore_errors=True)


STUCK = """import os, sys
fd = os.memfd_create(sys.argv[1])
print("marked", flush=True)
os.statvfs(sys.argv[2])
"""


def _stuck_as(uid: int, name: str, point: Path) -> subprocess.Popen:
    """A process of `uid` that carries the probe marker `name`, stuck in statfs on `point`,
    then killed (SIGKILL pending, as an abandoned probe child's)."""
    python = Path("/usr/bin/python3")  # one every user may run (this venv's may be root's)
    if not python.exists():
        pytest.skip("no /usr/bin/python3 to run as another user")
    proc = subprocess.Popen([str(python), "-c", STUCK, name, str(point)],
                            stdout=subprocess.PIPE, text=True, user=uid, group=uid,
                            extra_groups=[], cwd="/")
    assert proc.stdout.readline().strip() == "marked"
    time.sleep(0.3)  # into statfs (FUSE waits interruptibly until a signal comes)
    proc.kill()  # now it waits for the daemon's answer, killable by nothing
    for _ in range(100):
        if Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "D":
            return proc
        time.sleep(0.02)
    pytest.fail("the marked process is not stuck in statfs")


def test_only_a_process_of_root_counts_as_an_abandoned_probe_child(shared_hung_mount, tmp_path):
    """Anyone can name a memfd like a probe's marker and get stuck on a FUSE mount of their
    own: a process not owned by root (or by the user running the check) must never count,
    or any user could blind a probe for as long as their process sits there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    root = tmp_path / "node"
    name = hangs.marker(PROBE, root)
    nobody = _stuck_as(65534, name, shared_hung_mount)
    try:
        assert PROBE not in hangs.find_waiting(root)
        ours = _stuck_as(0, name, shared_hung_mount)
        found = hangs.find_waiting(root)
        assert found[PROBE]["pid"] == ours.pid
        assert hangs.still_waiting(found[PROBE])
        # Another root's probe is not this one's.
        assert PROBE not in hangs.find_waiting(tmp_path / "other")
    finally:
        for proc in (nobody, locals().get("ours")):
            if proc is not None:
                proc.kill()


def test_a_marked_child_still_answering_is_not_counted_as_abandoned(tmp_path):
    """A concurrent run's probe child, alive and not killed, is in flight, not stuck: counting
    it would report a hang (mount_hung drains) that is not there."""
    root = tmp_path / "node"
    pid, fd = bounded.start(lambda: time.sleep(5) or 1, mark=hangs.marker(hangs.NVML, root))
    try:
        time.sleep(0.3)
        assert hangs.NVML not in hangs.find_waiting(root)
    finally:
        os.close(fd)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


# --- the two copies ----------------------------------------------------------------------------

def test_the_newer_copy_of_the_record_is_the_one_read(tmp_path, monkeypatch):
    sdir, rdir = tmp_path / "state", tmp_path / "run"
    one = {hangs.NVML: {"since": "2026-01-01T00:00:00+00:00", "sweeps": 1}}
    two = {hangs.NVML: {"since": "2026-01-01T00:00:00+00:00", "sweeps": 2}}
    assert hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot").save(one, "boot") is None
    assert hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot").record["probes"] == one
    real = durable.write_atomic

    def state_dir_full(path, data, **kw):
        if Path(path).parent == sdir:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data, **kw)

    monkeypatch.setattr(durable, "write_atomic", state_dir_full)
    problem = hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot").save(two, "boot")
    assert problem is not None and "No space left" in problem and str(rdir) in problem
    read = hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot")
    assert read.record["probes"] == two and not read.lost
    # The state dir's copy (older, still there) is not what the run believes.
    assert json.loads((sdir / engine.HANGS_FILE).read_text())["probes"] == one


def test_a_runtime_dir_that_is_a_symlink_is_neither_written_through_nor_believed(tmp_path):
    sdir, elsewhere = tmp_path / "state", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run").symlink_to(elsewhere)
    rdir = tmp_path / "run"
    record = {hangs.NVML: {"since": "2026-01-01T00:00:00+00:00", "sweeps": 1}}
    hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot").save(record, "boot")
    assert list(elsewhere.iterdir()) == []
    # A record standing behind the symlink (planted: it names a live process, which would
    # blind the probe for as long as that process lives) is not believed: the run looks in
    # /proc instead.
    planted = {"boot_id": "boot", "seq": 99, "probes": {hangs.NVML: {
        "since": "2026-01-01T00:00:00+00:00", "sweeps": 1, "pid": 1,
        "start": hangs._start_time(1)}}}
    (elsewhere / engine.HANGS_FILE).write_text(json.dumps(planted))
    kept = hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot")
    assert kept.lost
    assert kept.record["probes"] == record


def test_a_healthy_run_makes_no_runtime_dir(node):
    node.check(only={"mount", "gpu", "infiniband"})
    assert not (node.root / "run").exists()


def test_snapshots_of_a_node_whose_mount_hangs_leave_one_stuck_child(hung_mount):
    """`healthctl snapshot` forked a statvfs child on every call and kept no record: run by
    hand through a storage outage it left one more stuck child each time. It keeps the
    check's record now (both are read-only looks an operator takes; one record keeps one
    child between them), and a check after it does not ask again either."""
    root = hung_mount
    _site(root)
    sdir = root / NODE_STATE
    sdir.mkdir(parents=True)
    for _ in range(3):
        out = subprocess.run([sys.executable, "-m", "rsc_health.cli", "snapshot", "--out", "-"],
                             env=_env(root), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["mount_probes"]["/checkpoint"]["hung"] is True
        assert doc["mount_probes"]["/home"]["ok"] is True
    assert len(_probes_left_behind(root)) == 1
    out = subprocess.run([sys.executable, "-m", "rsc_health.cli", "check", "--json", "--only",
                          "mount"], env=_env(root), capture_output=True, text=True, timeout=60)
    assert "mount_hung" in {f["code"] for f in json.loads(out.stdout)["findings"]}
    assert len(_probes_left_behind(root)) == 1
    assert not (sdir / engine.HANGS_FILE).exists()  # the sweep's record is not the snapshot's


def test_a_snapshot_does_not_ask_nvml_while_a_child_left_before_still_waits(node, monkeypatch):
    """The check's record names an NVML child still waiting in the driver (here: this live
    process, pid and start time): the snapshot asks NVML no more (it forks no NVML child) and
    carries NVML's own timeout, as a check would judge it."""
    from rsc_health.collect import gpu
    from rsc_health.collect import node as node_mod
    from rsc_health.commands.node import take_snapshot
    from rsc_health.config import state_dir

    forked: list[str | None] = []
    real_start = bounded.start

    def start(fn, **kw):
        forked.append(kw.get("mark"))
        return real_start(fn, **kw)

    monkeypatch.setattr(bounded, "start", start)
    monkeypatch.setattr(node_mod, "gpu_backend",
                        lambda cfg, root, telemetry=False: gpu.NvmlBackend())
    cfg = node.config
    sdir = Path(state_dir(cfg, node.root))
    sdir.mkdir(parents=True)
    boot = (node.root / "proc/sys/kernel/random/boot_id").read_text().strip()
    me = {"since": "2026-01-01T00:00:00+00:00", "sweeps": 0, "pid": os.getpid(),
          "start": hangs._start_time(os.getpid())}
    hangs.save(sdir / engine.CHECK_HANGS_FILE, {hangs.NVML: me}, boot)
    doc = take_snapshot(cfg, node.root, "node01")
    assert doc["nvml"] == gpu.UNANSWERED
    assert hangs.marker(hangs.NVML, node.root) not in forked
    assert forked  # the other probes (mounts, IB ports) were asked


@pytest.mark.parametrize("how", ["garbled", "huge", "fifo", "directory", "others_may_write",
                                 "nested_too_deep"])
def test_a_runtime_copy_that_cannot_be_believed_is_lost_and_written_again(tmp_path, how):
    """Whatever stands at the runtime copy's name, the run neither blocks on it (a FIFO) nor
    believes it: the record is lost (the run looks in /proc), and the next save replaces it."""
    sdir, rdir = tmp_path / "state", tmp_path / "run"
    rdir.mkdir()
    path = rdir / engine.HANGS_FILE
    good = {"boot_id": "boot", "seq": 7, "probes": {hangs.NVML: {
        "since": "2026-01-01T00:00:00+00:00", "sweeps": 1}}}
    if how == "garbled":
        path.write_bytes(b'{"boot_id": "boot", "probes": {\xff')
    elif how == "huge":
        path.write_text(json.dumps({**good, "pad": "x" * hangs.RECORD_BYTES}))
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "directory":
        path.mkdir()
    elif how == "nested_too_deep":
        # RecursionError, not ValueError: it failed the engine of every run (every family
        # unjudged, an XID 79 unseen) until a reboot emptied /run.
        path.write_text("[" * 5000)
    else:
        path.write_text(json.dumps(good))
        path.chmod(0o666)
    started = time.monotonic()
    kept = hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot")
    assert time.monotonic() - started < 1
    assert kept.lost and kept.record["probes"] == {}
    record = {hangs.IB: {"since": "2026-01-01T00:00:00+00:00", "sweeps": 2}}
    assert kept.save(record, "boot") is None
    again = hangs.Kept(engine.HANGS_FILE, sdir, rdir, "boot")
    assert not again.lost and again.record["probes"] == record
