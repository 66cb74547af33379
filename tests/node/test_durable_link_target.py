"""durable.write_atomic judges the symlinks on the named path, but not those on the way to a
link's target: root's own link (made once by an installer, say /var/lib/prometheus/
node-exporter -> /srv/metrics/textfile) that leads through a directory another user owns lets
that user plant a link there and have root write wherever it leads."""

from __future__ import annotations

import os

import pytest

from rsc_health.durable import UnsafeDirectory, ready_dir, write_atomic

NOBODY = 65534


@pytest.fixture
def through_theirs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: another user's directory and symlink")
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"  # e.g. /srv/metrics, owned by the exporter's user
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    planted = theirs / "textfile"
    planted.symlink_to(target)  # what the owner of theirs/ may put there at any time
    os.lchown(planted, NOBODY, NOBODY)
    site = tmp_path / "site"  # root's, 0755
    site.mkdir()
    (site / "node-exporter").symlink_to(planted)  # root's own link, in root's directory
    return site, target


def test_a_planted_link_on_the_way_to_roots_own_links_target_is_refused(through_theirs):
    site, target = through_theirs
    with pytest.raises(UnsafeDirectory):
        write_atomic(site / "node-exporter" / "rsc_health.prom", "x")
    assert list(target.iterdir()) == []


def test_a_relative_root_link_through_their_directory_is_refused(through_theirs):
    site, target = through_theirs
    rel = site / "relative"
    rel.symlink_to(os.path.join("..", "theirs", "textfile"))
    with pytest.raises(UnsafeDirectory):
        ready_dir(rel / "spool")
    assert list(target.iterdir()) == []
