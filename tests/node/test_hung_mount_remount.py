"""A hung mount that the operator remounts (the old one detached with `umount -l`, a healthy
one mounted on the same path) passes again: mount_* findings are transient, "a remount fixes
them, and a clean sweep resumes the node" (checks/mount.py).

The statvfs child a run abandoned on the OLD mount stays stuck on the detached superblock (a
hard NFS mount whose server is gone, a FUSE daemon that holds the request); while it waited
the path was reported hung without being asked again, so every later prolog failed its job
on a healthy mount, and no sweep resumed the node, until a reboot (tester h6). The hang
record now names the mount the child was abandoned on; another one there is asked afresh.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime

from rsc_health.checks.mount import _remounted
from rsc_health.collect import hangs, mounts
from tests.fixtures.nodes.node_copy import NODE_STATE

from .conftest import FAULT, hung_mount, start_fuse  # noqa: F401 - the fixture
from .test_hung_probe_lock import _probes_left_behind, _records, _stage

PROBE = "statvfs /checkpoint"


def _site(root) -> None:
    (root / "site.toml").write_text((root / "config.toml").read_text()
                                    + '\n[slurm]\nbin_dir = "/nonexistent-slurm"\n')


def _hangs(root) -> dict:
    return json.loads((root / NODE_STATE / "probe_hangs.json").read_text())["probes"]


def _remount(point, *mount) -> None:
    subprocess.run(["umount", "-l", str(point)], check=True)
    if mount:
        subprocess.run(["mount", *mount, str(point)], check=True)


def test_a_hung_mount_remounted_by_the_operator_passes_the_next_prolog(hung_mount):  # noqa: F811
    root = hung_mount
    _site(root)
    sweep, _ = _stage(root, "sweep")
    assert sweep.returncode == 0, sweep.stderr
    assert ("mount", "mount_hung") in {(r.get("check"), r.get("code")) for r in _records(root)}
    stuck = _probes_left_behind(root)
    assert stuck  # its statvfs child is stuck on the FUSE mount
    assert _hangs(root)[PROBE]["mount"]  # the mount it was abandoned on
    point = root / "checkpoint"
    _remount(point, "-t", "tmpfs", "tmpfs")  # the operator's cure
    try:
        os.statvfs(point)  # the path answers at once now
        (root / NODE_STATE / "pending_verdict.json").unlink(missing_ok=True)  # dealt with
        prolog, _ = _stage(root, "prolog", SLURM_JOB_ID="78")
        codes = {r.get("code") for r in _records(root) if r.get("source") == "prolog"}
        assert "mount_hung" not in codes, prolog.stderr
        assert prolog.returncode == 0, prolog.stderr
        assert PROBE not in _hangs(root)  # the old child is forgotten, not the answer
        assert _probes_left_behind(root) == stuck  # still stuck on the detached mount
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_remount_that_hangs_again_leaves_one_more_child_and_a_new_hang(hung_mount):  # noqa: F811
    root = hung_mount
    _site(root)
    for _ in range(2):
        assert _stage(root, "sweep")[0].returncode == 0
    first = _hangs(root)[PROBE]
    assert first["sweeps"] == 2 and len(_probes_left_behind(root)) == 1
    point = root / "checkpoint"
    _remount(point)
    again = start_fuse(point, FAULT / "hung_fuse.py", str(point))  # hangs as well
    try:
        for _ in range(3):
            assert _stage(root, "sweep")[0].returncode == 0
        now = _hangs(root)[PROBE]
        assert now["mount"] != first["mount"] and now["pid"] != first["pid"]
        assert now["sweeps"] == 3 and now["since"] > first["since"]  # a new hang, counted anew
        assert len(_probes_left_behind(root)) == 2  # one per mount, not one per run
        assert [r["code"] for r in _records(root) if r.get("code") == "mount_hung"] == \
            ["mount_hung"] * 5
    finally:
        again.kill()
        again.wait(10)
        subprocess.run(["fusermount", "-u", "-z", str(point)], capture_output=True)


def test_the_mount_standing_at_a_path_is_read_from_this_machine_s_mount_table(tmp_path):
    table = mounts.standing("/", ["/", "/proc", str(tmp_path)])
    assert set(table) == {"/", "/proc"}  # tmp_path has no mount of its own
    assert table["/"] != table["/proc"]
    mount_id, dev = table["/proc"].split()
    assert mount_id.isdigit() and ":" in dev


def test_a_record_naming_no_mount_keeps_its_child_as_the_answer():
    """A record written before records named their mount (or a child found in /proc)."""
    live = {"pid": os.getpid(), "start": 1}
    records = {"/": dict(live), "/proc": {**live, "mount": "1 0:1"},
               "/sys": {**live, "mount": mounts.standing("/", ["/sys"])["/sys"]}}
    assert _remounted("/", list(records), records) == {"/proc"}


def test_the_hang_record_keeps_the_mount_and_starts_anew_on_another():
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    t1 = datetime(2026, 11, 1, 0, 5, tzinfo=UTC)
    me = os.getpid()
    first = hangs.update({}, "b", {"statvfs"}, {PROBE: me}, t0, sweep=True,
                         mounts={PROBE: "812 0:61"})
    assert first[PROBE]["mount"] == "812 0:61" and first[PROBE]["sweeps"] == 1
    saved = hangs._parsed({"boot_id": "b", "probes": first})
    assert saved["probes"] == first  # kept through a save and a load
    # The same child still waiting: the same hang, and the same mount.
    assert hangs.update(saved, "b", {"statvfs"}, {PROBE: None}, t1, sweep=True)[PROBE] == {
        **first[PROBE], "sweeps": 2}
    # A new child on another mount: a new hang since now.
    other = hangs.update(saved, "b", {"statvfs"}, {PROBE: me}, t1, sweep=True,
                         mounts={PROBE: "907 0:75"})[PROBE]
    assert (other["since"], other["sweeps"], other["mount"]) == (t1.isoformat(), 1, "907 0:75")
    # A record that names no mount (the previous version's) counts on.
    old = {"boot_id": "b", "probes": {PROBE: {"since": t0.isoformat(), "sweeps": 4}}}
    kept = hangs.update(old, "b", {"statvfs"}, {PROBE: me}, t1, sweep=True,
                        mounts={PROBE: "907 0:75"})[PROBE]
    assert (kept["since"], kept["sweeps"], kept["mount"]) == (t0.isoformat(), 5, "907 0:75")
