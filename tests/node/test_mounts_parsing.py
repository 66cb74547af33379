"""/proc/mounts and /proc/self/mountinfo in their real shapes (proc(5))."""

from __future__ import annotations

from rsc_health.collect import mounts
from rsc_health.model import Level

from .conftest import bad

MOUNTINFO = (
    "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/md0 rw\n"
    "95 22 0:52 / /home rw,relatime shared:50 - nfs4 nfs01:/export/home rw,vers=4.2,hard\n"
    "97 22 0:53 / /checkpoint rw,relatime shared:52 - lustre 10.20.0.1@o2ib:/ckpt ro,flock\n"
    "98 22 0:54 / /my\\040scratch rw,relatime - tmpfs tmpfs rw\n"
)


def test_mountinfo_gives_type_source_and_superblock_read_only():
    by_path = {m.path: m for m in mounts.parse_mountinfo(MOUNTINFO)}
    assert by_path["/home"].fstype == "nfs4" and not by_path["/home"].read_only
    assert by_path["/checkpoint"].read_only  # ro on the superblock
    assert by_path["/my scratch"].device == "tmpfs"


def test_proc_mounts_octal_escapes():
    (m,) = mounts.parse_mounts("//srv/a\\040b /mnt/a\\040b cifs rw 0 0\n")
    assert (m.device, m.path) == ("//srv/a b", "/mnt/a b")


def test_node_without_proc_mounts_falls_back_to_mountinfo(node):
    node.path("proc/mounts").unlink()
    node.write("proc/self/mountinfo", MOUNTINFO)
    found, verdict = node.check(only={"mount"})
    assert [(f.component, f.code) for f in bad(found)] == [("/checkpoint", "mount_ro")]
    assert verdict.level is Level.DRAIN_NOW
