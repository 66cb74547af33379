"""One forked child asks every mount its statvfs, a thread per mount: a hung mount holds only
its own thread, every other mount still answers within the deadline. A child left stuck on two
mounts cannot later say which of them answered since, so the next run asks each of those in a
child of its own (checks.mount)."""

from __future__ import annotations

import errno
import os
import time

from rsc_health.checks.mount import _sharing_a_child
from rsc_health.collect import mounts

PATHS = ["/", "/home", "/checkpoint"]


def _blocking(*hung: str):
    real = mounts.statvfs

    def statvfs(path: str):
        if any(path.endswith(h) for h in hung):
            time.sleep(30)  # in the child: killed when the parent gives up on it
        return real(path)

    return statvfs


def test_a_hung_mount_does_not_hide_the_other_mounts_answers(node, monkeypatch):
    monkeypatch.setattr(mounts, "statvfs", _blocking("/home"))
    started = time.monotonic()
    results = mounts.probe(node.root, PATHS, 1.0)
    assert time.monotonic() - started < 5
    assert [(p, r.ok, r.hung) for p, r in results.items()] == [
        ("/", True, False), ("/home", False, True), ("/checkpoint", True, False)]
    assert results["/home"].pid is not None and results["/home"].pid != os.getpid()


def test_every_mount_of_one_run_is_asked_by_one_child(node, monkeypatch):
    monkeypatch.setattr(mounts, "statvfs", _blocking("/home", "/checkpoint"))
    results = mounts.probe(node.root, PATHS, 1.0)
    assert results["/"].ok
    assert results["/home"].pid == results["/checkpoint"].pid  # one fork for the run


def test_mounts_asked_alone_each_get_a_child_of_their_own(node, monkeypatch):
    monkeypatch.setattr(mounts, "statvfs", _blocking("/home", "/checkpoint"))
    results = mounts.probe(node.root, PATHS, 1.0, alone={"/home", "/checkpoint"})
    assert results["/"].ok
    assert results["/home"].hung and results["/checkpoint"].hung
    assert results["/home"].pid != results["/checkpoint"].pid


def test_a_mount_whose_statvfs_fails_says_why(node, monkeypatch):
    real = mounts.statvfs

    def statvfs(path: str):
        if path.endswith("/home"):
            raise OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN), path)
        return real(path)

    monkeypatch.setattr(mounts, "statvfs", statvfs)
    results = mounts.probe(node.root, PATHS, 2.0)
    home = results["/home"]
    assert (home.ok, home.hung, home.error) == (False, False, os.strerror(errno.ENOTCONN))
    assert results["/"].ok and results["/checkpoint"].ok


def test_mounts_whose_hang_shared_one_child_are_asked_again_alone():
    records = {"/home": {"pid": 41, "start": 7}, "/checkpoint": {"pid": 41, "start": 7},
               "/scratch": {"pid": 52, "start": 9}}
    assert _sharing_a_child(list(records), records) == {"/home", "/checkpoint"}
    assert _sharing_a_child(["/scratch"], records) == set()
