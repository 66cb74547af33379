"""durable.write_atomic promises root never writes through a name someone else could have
planted: a symlink another user owns is refused anywhere on the way to the file's directory,
not only at the directory itself (helper-96: one level higher, root followed it, made the
missing directory wherever it led and wrote there), nor on the way to the target of root's
own link (helper-108: an installer's /var/lib/prometheus/node-exporter -> /srv/metrics/textfile
through a directory another user owns, where that user planted a link)."""

from __future__ import annotations

import os

import pytest

from rsc_health.durable import UnsafeDirectory, ready_dir, write_atomic

NOBODY = 65534


@pytest.fixture
def planted(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: another user's directory and symlink")
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"  # e.g. /var/lib/prometheus, owned by its daemon's user
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    link = theirs / "node-exporter"
    link.symlink_to(target)  # what the owner of theirs/ may put there
    os.lchown(link, NOBODY, NOBODY)
    return theirs, target


def test_a_planted_symlink_at_the_files_directory_is_refused(planted):
    theirs, target = planted
    with pytest.raises(UnsafeDirectory):
        write_atomic(theirs / "node-exporter" / "rsc_health.prom", "x")
    assert list(target.iterdir()) == []


def test_a_planted_symlink_above_the_files_directory_is_refused_too(planted):
    theirs, target = planted
    with pytest.raises(UnsafeDirectory):
        write_atomic(theirs / "node-exporter" / "textfile" / "rsc_health.prom", "x")
    # Root made a directory and wrote a file where the other user's link led.
    assert list(target.iterdir()) == []


def test_a_planted_symlink_above_a_directory_that_exists_is_refused(planted):
    """The directory the link leads to has the file's directory already (root made it once):
    nothing is made, but root would still write through the other user's link."""
    theirs, target = planted
    (target / "textfile").mkdir()
    with pytest.raises(UnsafeDirectory):
        write_atomic(theirs / "node-exporter" / "textfile" / "rsc_health.prom", "x")
    assert list((target / "textfile").iterdir()) == []


def test_roots_own_link_in_a_directory_only_root_writes_is_followed(tmp_path):
    """/var/run -> /run: a link root made where no one else may write stands for its target."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "run").symlink_to(real)
    write_atomic(tmp_path / "run" / "sub" / "state.json", "{}")
    assert (real / "sub" / "state.json").read_text() == "{}"


@pytest.fixture
def through_theirs(planted, tmp_path):
    """Root's own link, in root's directory, whose target runs through theirs/ (and its
    planted link)."""
    theirs, target = planted
    site = tmp_path / "site"  # root's, 0755
    site.mkdir()
    (site / "node-exporter").symlink_to(theirs / "node-exporter")
    return site, target


def test_a_planted_link_on_the_way_to_roots_own_links_target_is_refused(through_theirs):
    site, target = through_theirs
    with pytest.raises(UnsafeDirectory):
        write_atomic(site / "node-exporter" / "rsc_health.prom", "x")
    assert list(target.iterdir()) == []


def test_a_relative_root_link_through_their_directory_is_refused(through_theirs):
    site, target = through_theirs
    rel = site / "relative"
    rel.symlink_to(os.path.join("..", "theirs", "node-exporter"))
    with pytest.raises(UnsafeDirectory):
        ready_dir(rel / "spool")
    assert list(target.iterdir()) == []
