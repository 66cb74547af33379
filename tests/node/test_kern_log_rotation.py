"""A kern.log source across logrotate. The file cursor is inode + offset + the file's head; a
rotated file (another inode, or the same one cut short by copytruncate) is a new log, read from
its start. What the old file took after the last run read it and before the rotation (rsyslog
keeps writing the renamed file until its HUP) was never read: an XID 79 logged there let the
node take jobs with its GPU off the bus. The rotated predecessor (kern.log.1, kern.log-DATE: the
old inode, or copytruncate's copy with the old head) is now read from the old offset first.

And an event's record id (its key: where it sits in its source) was inode:offset, which every
copytruncate generation of the same file repeats: the historian stored the first XID at an
offset and dropped every later one there as already stored."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rsc_health.collect import kmsg

KERN_LOG = "/var/log/kern.log"


def _line(xid: int, second: int = 0, pci: str = "0000:3b:00") -> str:
    return (f"Nov 27 10:00:{second:02d} gpu042 kernel: NVRM: Xid (PCI:{pci}): {xid}, pid=1, "
            "name=python3, GPU has fallen off the bus.\n")


def _log(root: Path) -> Path:
    log = root / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True, exist_ok=True)
    return log


def _read(root: Path, cursor: dict):
    return kmsg.read_new_events(root, [KERN_LOG], cursor)


def test_an_xid_logged_just_before_a_rename_rotation_is_judged(tmp_path):
    log = _log(tmp_path)
    log.write_text(_line(13, 1))
    first = _read(tmp_path, {})
    assert [e.xid for e in first.events] == [13]
    with log.open("a") as fh:
        fh.write(_line(79, 2))  # after the last run, before the rotation
    os.rename(log, log.with_name("kern.log.1"))  # logrotate (create): a new, empty kern.log
    log.write_text(_line(48, 3))
    got = _read(tmp_path, first.cursor)
    assert sorted(e.xid for e in got.events) == [48, 79], got.errors
    assert got.errors == []
    again = _read(tmp_path, got.cursor)
    assert again.events == []


def test_an_xid_logged_just_before_a_copytruncate_rotation_is_judged(tmp_path):
    log = _log(tmp_path)
    log.write_text("".join(_line(13, s) for s in range(5)))
    first = _read(tmp_path, {})
    with log.open("a") as fh:
        fh.write(_line(79, 10))
    shutil.copyfile(log, log.with_name("kern.log.1"))  # logrotate copytruncate
    with log.open("r+") as fh:
        fh.truncate(0)
    with log.open("a") as fh:
        fh.write(_line(48, 11))
    got = _read(tmp_path, first.cursor)
    assert sorted(e.xid for e in got.events) == [48, 79], got.errors
    assert got.errors == []


def test_a_compressed_predecessor_is_said_not_hidden(tmp_path):
    """logrotate with compress and no delaycompress: the old file is gone (kern.log.1.gz);
    what it took after the last run cannot be read, and the checker says so."""
    log = _log(tmp_path)
    log.write_text(_line(13, 1))
    first = _read(tmp_path, {})
    log.unlink()
    log.write_text(_line(48, 3))
    got = _read(tmp_path, first.cursor)
    assert [e.xid for e in got.events] == [48]
    assert len(got.errors) == 1 and "rotated" in got.errors[0]


def test_each_copytruncate_generation_gives_its_events_their_own_record_ids(tmp_path):
    log = _log(tmp_path)
    log.write_text(_line(79, 1))
    first = _read(tmp_path, {})
    reread = _read(tmp_path, {})  # a cursor that could not be saved: the same event again
    assert first.events[0].key == reread.events[0].key
    shutil.copyfile(log, log.with_name("kern.log.1"))
    with log.open("r+") as fh:
        fh.truncate(0)
    log.write_text(_line(79, 9, pci="0000:1b:00"))  # another GPU, same offset, same inode
    second = _read(tmp_path, first.cursor)
    assert [e.pci for e in second.events] == ["0000:1b:00"]
    assert second.events[0].key != first.events[0].key


def test_a_short_log_rotated_and_written_past_its_old_end_is_read_from_its_start(tmp_path):
    """A kern.log holding one line shorter than the head kept in the cursor: after
    copytruncate the new file grew past the old offset before the next run. The head check
    was skipped below HEAD_BYTES, so the new file was read from the old offset, mid-line, and
    its XID 79 at byte 0 was never judged."""
    log = _log(tmp_path)
    log.write_text("Nov 27 10:00:00 gpu042 kernel: eth0 up\n")
    first = _read(tmp_path, {})
    shutil.copyfile(log, log.with_name("kern.log.1"))
    with log.open("r+") as fh:
        fh.truncate(0)
    log.write_text(_line(79, 5))
    got = _read(tmp_path, first.cursor)
    assert [e.xid for e in got.events] == [79] and got.errors == []
    with log.open("a") as fh:
        fh.write(_line(48, 6))
    grown = _read(tmp_path, got.cursor)  # a log that only grew is no rotation
    assert [e.xid for e in grown.events] == [48] and grown.errors == []


def test_a_short_log_that_only_grew_is_read_on_from_its_offset(tmp_path):
    log = _log(tmp_path)
    log.write_text("Nov 27 10:00:00 gpu042 kernel: eth0 up\n")
    first = _read(tmp_path, {})
    with log.open("a") as fh:
        fh.write(_line(79, 5))
    got = _read(tmp_path, first.cursor)
    assert [e.xid for e in got.events] == [79] and got.errors == []


def test_a_log_absent_for_a_run_after_its_rotation_keeps_its_cursor(tmp_path):
    """logrotate without `create`: kern.log is renamed and rsyslog makes a new one only at its
    next message. The run in between found no kern.log and dropped its cursor entry, so the
    new file was a first sight: the old file's tail was never read, and with file_backlog =
    false the new file's own first lines (an XID 48) were skipped as history too."""
    log = _log(tmp_path)
    log.write_text(_line(13, 1))
    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {}, file_backlog=False)
    with log.open("a") as fh:
        fh.write(_line(79, 2))
    os.rename(log, log.with_name("kern.log.1"))
    between = kmsg.read_new_events(tmp_path, [KERN_LOG], first.cursor, file_backlog=False)
    assert between.events == [] and between.errors == []
    log.write_text(_line(48, 3))
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], between.cursor, file_backlog=False)
    assert sorted(e.xid for e in got.events) == [48, 79], got.errors


def test_a_kern_log_that_fails_to_read_once_keeps_its_cursor(tmp_path, monkeypatch):
    """A read of kern.log that fails (EIO from a failing disk, or ENOENT: renamed between the
    run's stat and its open) dropped the file's cursor entry; the next run took the file as
    a first sight and judged all of it again (with file_backlog, the default): the XID 79 of
    a node repaired since drained it again."""
    import errno

    log = _log(tmp_path)
    log.write_text(_line(79, 1))
    first = _read(tmp_path, {})
    assert [e.xid for e in first.events] == [79]
    real = kmsg._read_log_file

    def eio(*args, **kw):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(kmsg, "_read_log_file", eio)
    failed = _read(tmp_path, first.cursor)
    assert failed.events == [] and len(failed.errors) == 1
    monkeypatch.setattr(kmsg, "_read_log_file", real)
    with log.open("a") as fh:
        fh.write(_line(48, 2))
    got = _read(tmp_path, failed.cursor)
    assert [e.xid for e in got.events] == [48]
