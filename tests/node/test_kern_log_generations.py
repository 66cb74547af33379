"""A kernel log file that is rewritten rather than appended to.

A `dmesg > /var/log/dmesg.txt` dump (cron, a boot unit) is rewritten whole each time: once the
ring buffer wraps, its first line changes, the cursor took it for a rotated log, read it again
from its start and judged every XID still in the ring again (a repaired node drained again for
the XID 79 it was repaired of), and said each time that a rotated predecessor was missing. The
cursor now keeps the bytes it last read up to (its tail): a rewritten file holding them goes on
after them."""

from __future__ import annotations

import os
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

