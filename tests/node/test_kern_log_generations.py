"""A kernel log file that is rewritten rather than appended to, and a log rotated twice between
two runs.

A `dmesg > /var/log/dmesg.txt` dump (cron, a boot unit) is rewritten whole each time: once the
ring buffer wraps, its first line changes, the cursor took it for a rotated log, read it again
from its start and judged every XID still in the ring again (a repaired node drained again for
the XID 79 it was repaired of), and said each time that a rotated predecessor was missing. The
cursor now keeps the bytes it last read up to (its tail): a rewritten file holding them goes on
after them.

Two logrotate runs between two checker runs (a daily rotation and a size-triggered one, a node
down over two rotations): the oldest generation (the cursor's) was read from its offset, the
newest from its start, and the one between was never read, in silence: an XID there was lost."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from rsc_health.collect import kmsg

DUMP = "/var/log/dmesg.txt"
KERN_LOG = "/var/log/kern.log"


def _dmesg(at: float, msg: str) -> str:
    return f"[{at:12.6f}] {msg}\n"


def _xid(code: int, pci: str = "0000:3b:00") -> str:
    return f"NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python3, GPU has fallen off the bus."


def _write_in_place(path: Path, text: str) -> None:
    with path.open("r+") as fh:  # `dmesg > file`: O_TRUNC on the same inode
        fh.truncate(0)
        fh.write(text)


def _ring(n: int) -> list[str]:
    lines = [_dmesg(1.0 + i, f"usb 1-{i}: new device") for i in range(n)]
    lines[3] = _dmesg(4.0, _xid(79))
    return lines


def test_a_dmesg_dump_rewritten_after_the_ring_wraps_is_not_judged_again(tmp_path):
    dump = tmp_path / DUMP.lstrip("/")
    dump.parent.mkdir(parents=True)
    ring = _ring(8)
    dump.write_text("".join(ring))
    first = kmsg.read_new_events(tmp_path, [DUMP], {})
    assert [e.xid for e in first.events] == [79]
    # The ring wrapped: its two oldest records are gone, two new ones came; the XID 79 is
    # still in it, and in the next dump.
    ring = ring[2:] + [_dmesg(9.0, "eth0: link up"), _dmesg(10.0, "eth1: link up")]
    _write_in_place(dump, "".join(ring))
    again = kmsg.read_new_events(tmp_path, [DUMP], first.cursor)
    assert again.events == [] and again.errors == []
    ring = ring[3:] + [_dmesg(11.0, _xid(48))]  # the repaired node's next XID is judged
    _write_in_place(dump, "".join(ring))
    more = kmsg.read_new_events(tmp_path, [DUMP], again.cursor)
    assert [e.xid for e in more.events] == [48] and more.errors == []


def test_a_dump_replaced_by_rename_after_the_ring_wraps_is_not_judged_again(tmp_path):
    dump = tmp_path / DUMP.lstrip("/")
    dump.parent.mkdir(parents=True)
    ring = _ring(8)
    dump.write_text("".join(ring))
    first = kmsg.read_new_events(tmp_path, [DUMP], {})
    ring = ring[1:] + [_dmesg(9.0, _xid(94))]
    tmp = dump.with_name("dmesg.txt.tmp")
    tmp.write_text("".join(ring))
    os.replace(tmp, dump)  # `dmesg > f.tmp && mv f.tmp f`: another inode
    again = kmsg.read_new_events(tmp_path, [DUMP], first.cursor)
    assert [e.xid for e in again.events] == [94] and again.errors == []


def test_a_dump_rewritten_after_more_than_a_ring_of_records_is_read_whole(tmp_path):
    """Nothing the cursor read is left in it: every line is new."""
    dump = tmp_path / DUMP.lstrip("/")
    dump.parent.mkdir(parents=True)
    dump.write_text("".join(_ring(8)))
    first = kmsg.read_new_events(tmp_path, [DUMP], {})
    _write_in_place(dump, _dmesg(20.0, _xid(48)) + _dmesg(21.0, "eth0: link up"))
    got = kmsg.read_new_events(tmp_path, [DUMP], first.cursor)
    assert [e.xid for e in got.events] == [48]


def _line(xid: int, second: int) -> str:
    return (f"Nov 27 10:00:{second:02d} gpu042 kernel: NVRM: Xid (PCI:0000:3b:00): {xid}, "
            "pid=1, name=python3, GPU has fallen off the bus.\n")


def _aged(path: Path, when: float) -> None:
    os.utime(path, (when, when))


def test_two_rename_rotations_between_runs_read_the_generation_between(tmp_path):
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text(_line(13, 1))
    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    t = time.time()
    with log.open("a") as fh:
        fh.write(_line(79, 2))  # the cursor's generation, after the last run
    _aged(log, t + 10)
    os.rename(log, log.with_name("kern.log.1"))  # rotation 1
    log.write_text(_line(48, 3))  # the generation between
    _aged(log, t + 20)
    os.rename(log.with_name("kern.log.1"), log.with_name("kern.log.2"))  # rotation 2
    os.rename(log, log.with_name("kern.log.1"))
    log.write_text(_line(94, 4))
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], first.cursor)
    assert [e.xid for e in got.events] == [79, 48, 94], got.errors
    assert got.errors == []
    assert len({e.key for e in got.events}) == 3
    again = kmsg.read_new_events(tmp_path, [KERN_LOG], got.cursor)
    assert again.events == [] and again.errors == []


def test_two_copytruncate_rotations_between_runs_read_the_generation_between(tmp_path):
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("".join(_line(13, s) for s in range(3)))
    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    t = time.time()
    with log.open("a") as fh:
        fh.write(_line(79, 10))
    shutil.copyfile(log, log.with_name("kern.log.1"))  # rotation 1: copy, truncate
    _aged(log.with_name("kern.log.1"), t + 10)
    log.write_text(_line(48, 20))  # truncates in place: the same inode
    os.rename(log.with_name("kern.log.1"), log.with_name("kern.log.2"))  # rotation 2
    shutil.copyfile(log, log.with_name("kern.log.1"))
    _aged(log.with_name("kern.log.1"), t + 20)
    log.write_text(_line(94, 30))
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], first.cursor)
    assert [e.xid for e in got.events] == [79, 48, 94], got.errors
    assert got.errors == []


def test_two_rotations_with_the_cursors_generation_compressed_read_the_one_between(tmp_path):
    """logrotate's delaycompress: the cursor's generation is kern.log.2.gz by the second
    rotation (said: its tail cannot be read); kern.log.1, written since the last run (the
    cursor's own mtime), is read."""
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text(_line(13, 1))
    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    t = time.time()
    cursor = {**first.cursor, "mtime": t}  # as load_cursor gives it
    log.unlink()
    log.with_name("kern.log.2.gz").write_bytes(b"\x1f\x8b")
    log.with_name("kern.log.1").write_text(_line(48, 3))
    _aged(log.with_name("kern.log.1"), t + 20)
    older = log.with_name("kern.log.3")
    older.write_text(_line(31, 0))  # an older generation, before the last run: not read
    _aged(older, t - 86400)
    log.write_text(_line(94, 4))
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], cursor)
    assert [e.xid for e in got.events] == [48, 94], got.errors
    assert len(got.errors) == 1 and "rotated" in got.errors[0]



def test_a_generation_between_compressed_already_is_said(tmp_path):
    """Three rotations between two runs with delaycompress: the cursor's generation is
    kern.log.3.gz, the one after it kern.log.2.gz (unreadable here), kern.log.1 is read. The
    compressed one between was lost in silence."""
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text(_line(13, 1))
    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    t = time.time()
    cursor = {**first.cursor, "mtime": t}
    log.unlink()
    for name, age in (("kern.log.3.gz", 5), ("kern.log.2.gz", 15)):
        log.with_name(name).write_bytes(b"\x1f\x8b")
        _aged(log.with_name(name), t + age)
    log.with_name("kern.log.1").write_text(_line(48, 3))
    _aged(log.with_name("kern.log.1"), t + 25)
    log.write_text(_line(94, 4))
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], cursor)
    assert [e.xid for e in got.events] == [48, 94], got.errors
    assert len(got.errors) == 2 and "compressed already" in got.errors[1], got.errors


BANNER = ("[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) "
          "(x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0) #45-Ubuntu SMP\n")


def _boot_dump(lines: list[str]) -> str:
    return BANNER + "".join(f"[{10 + i:5d}.000000] {ln}\n" for i, ln in enumerate(lines))


def test_a_dmesg_dump_rewritten_after_a_reboot_is_read_from_its_start(tmp_path):
    """helper-207: boot 1's dump was taken early (short); after the reboot boot 2's, written
    into the same inode, is longer and starts with the same 64 bytes (the kernel banner). The
    reader took it for the same file grown and went on at boot 1's offset: boot 2's XID 79 at
    driver load, before that offset, was never read. The bytes before the offset are not the
    ones the cursor read (its tail): rewritten, read from its start."""
    dump = tmp_path / DUMP.lstrip("/")
    dump.parent.mkdir(parents=True)
    dump.write_text(_boot_dump([f"eth{i}: link up, boot one" for i in range(40)]))
    first = kmsg.read_new_events(tmp_path, [DUMP], {}, file_backlog=True)
    assert first.events == []
    boot2 = _boot_dump(["nvidia: loading out-of-tree module",
                        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
                        _xid(79)]
                       + [f"eth{i}: link up, boot two, after the GPU fell off" for i in range(80)])
    _write_in_place(dump, boot2)
    assert dump.stat().st_size > first.cursor["files"][DUMP]["offset"]
    again = kmsg.read_new_events(tmp_path, [DUMP], first.cursor)
    assert 79 in [e.xid for e in again.events], again.errors
    # and once read, nothing of it is judged again
    more = kmsg.read_new_events(tmp_path, [DUMP], again.cursor)
    assert more.events == [] and more.errors == []


def test_a_log_truncated_and_regrown_past_the_offset_with_the_same_head_is_read_whole(tmp_path):
    """The same class within one boot: a log whose first line never changes (a fixed banner),
    emptied in place and written past the old offset before the next run. Its new lines before
    the offset are new, not read already."""
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    banner = "Nov 27 10:00:00 gpu042 kernel: Linux version 6.8.0-45-generic (buildd@lcy02) #45\n"
    log.write_text(banner + "".join(f"Nov 27 10:00:{s:02d} gpu042 kernel: eth0: link flap "
                                    f"number {s}\n" for s in range(1, 20)))
    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    _write_in_place(log, banner + _line(79, 30) + "".join(
        f"Nov 27 10:01:{s:02d} gpu042 kernel: usb 1-{s}: new high-speed USB device, "
        f"the second time round\n" for s in range(40)))
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], first.cursor)
    assert [e.xid for e in got.events] == [79], got.errors


def test_a_log_only_appended_to_goes_on_at_its_offset(tmp_path):
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text(_line(13, 1) + _line(48, 2))
    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    with log.open("a") as fh:
        fh.write(_line(79, 3))
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], first.cursor)
    assert [e.xid for e in got.events] == [79] and got.errors == []
