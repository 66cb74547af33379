"""No silent gaps in the kernel log (issue 21): a line longer than one run's read does not pin
the file cursor, a backlog longer than one run's read is said, a cursor that is valid JSON but
wrong is rebuilt as an unreadable one is (the XID logged just before the sweep that found it is
judged, nothing older is judged again), and syslog headers with a one-digit day are read."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rsc_health import engine
from rsc_health.collect import kmsg
from rsc_health.model import Status
from tests.fixtures.nodes.node_copy import NODE_STATE

KERN_LOG = "/var/log/kern.log"
OLD_GPU, NEW_GPU = "0000:1b:00", "0000:3b:00"


def _syslog(when: float, pci: str, xid: int = 79) -> str:
    """A kern.log line as rsyslog writes it (local time, no year)."""
    stamp = time.strftime("%b %e %H:%M:%S", time.localtime(when))
    return f"{stamp} node01 kernel: NVRM: Xid (PCI:{pci}): {xid}, GPU has fallen off the bus.\n"


def _kern_log(root: Path, text: str | bytes) -> Path:
    log = root / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    log.write_bytes(text)
    return log


def _file_source(node):
    cfg = node.config
    cfg.data["xid"] = {**cfg.data.get("xid", {}), "sources": [KERN_LOG]}
    return cfg


def _xid_gpus(findings) -> list[str]:
    return sorted(f.data["pci"] for f in findings if f.code == "xid79")


def _errors(findings) -> list[str]:
    return [f.reason for f in findings if f.status is Status.ERROR]


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


# ---- 1. a line over the read bound --------------------------------------------------------------

def test_a_kern_log_line_longer_than_one_read_is_cut_and_the_cursor_moves_past_it(tmp_path):
    """On main the read of a 16 MiB window with no newline in it consumed nothing: the cursor
    stayed before the long line for good, every sweep read the same 16 MiB again and the XID
    logged after it was never seen."""
    now = time.time()
    long_line = b"Nov 21 03:14:15 node01 kernel: " + b"A" * (kmsg.MAX_READ + 2**20) + b"\n"
    log = _kern_log(tmp_path, long_line + _syslog(now, NEW_GPU).encode())
    cursor: dict = {}
    seen: list[str] = []
    errors: list[str] = []
    for _ in range(3):
        read = kmsg.read_new_events(tmp_path, [KERN_LOG], cursor)
        seen += [e.pci for e in read.events]
        errors += read.errors
        cursor = read.cursor
    assert seen == [NEW_GPU]  # read once, in the second run
    assert cursor["files"][KERN_LOG]["offset"] == log.stat().st_size
    assert len([e for e in errors if "longer than" in e]) == 1  # said, once


def test_an_xid_at_the_head_of_an_over_long_line_is_still_judged(tmp_path):
    line = _syslog(time.time(), NEW_GPU).rstrip("\n").encode() + b" " + b"B" * kmsg.MAX_READ
    _kern_log(tmp_path, line + b"\n")
    read = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert [e.pci for e in read.events] == [NEW_GPU]
    again = kmsg.read_new_events(tmp_path, [KERN_LOG], read.cursor)
    assert again.events == [] and again.errors == []


# ---- 2. a backlog past one run's read -----------------------------------------------------------

def test_a_kern_log_backlog_past_one_read_is_said_and_no_xid_is_lost(tmp_path):
    """On main the first run read 16 MiB of a 20 MiB backlog and said nothing: the XID 79
    behind it waited for the next sweep without a word."""
    filler = b"Nov 21 03:14:15 node01 kernel: usb 1-1: new high-speed USB device\n"
    backlog = filler * ((kmsg.MAX_READ + 4 * 2**20) // len(filler))
    log = _kern_log(tmp_path, backlog + _syslog(time.time(), NEW_GPU).encode())

    first = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert first.events == []
    [said] = first.errors
    left = log.stat().st_size - first.cursor["files"][KERN_LOG]["offset"]
    assert f"{left} bytes" in said and "next run" in said

    second = kmsg.read_new_events(tmp_path, [KERN_LOG], first.cursor)
    assert [e.pci for e in second.events] == [NEW_GPU]
    assert second.errors == []


# ---- 3. a cursor that is valid JSON but wrong, and an unreadable one, alike ---------------------

def _ring(node, *, uptime_s: float = 7200.0) -> None:
    """A ring buffer holding an XID logged an hour ago (judged by an earlier sweep) and one
    logged a minute ago (after the cursor's last good write, five minutes ago)."""
    node.write("proc/uptime", f"{uptime_s:.2f} 50000.00\n")
    node.write("dev/kmsg",
               f"4,5000,{int((uptime_s - 3600) * 1e6)},-;NVRM: Xid (PCI:{OLD_GPU}): 79, pid=7, "
               "name=python3, GPU has fallen off the bus.\n"
               f"4,5001,{int((uptime_s - 60) * 1e6)},-;NVRM: Xid (PCI:{NEW_GPU}): 79, pid=8, "
               "name=python3, GPU has fallen off the bus.\n")


def _break_cursor(node, how: str) -> Path:
    cursor = node.path(f"{NODE_STATE}/xid_cursor.json")
    cursor.parent.mkdir(parents=True, exist_ok=True)
    boot = node.path("proc/sys/kernel/random/boot_id").read_text().strip()
    good = {"boot_id": boot, "kmsg_seq": 4999, "files": {}}
    if how == "past_newest":
        cursor.write_text(json.dumps({**good, "kmsg_seq": 99_999_999}))
    elif how == "not_a_number":
        cursor.write_text(json.dumps({**good, "kmsg_seq": "many"}))
    elif how == "boot_not_text":
        cursor.write_text(json.dumps({**good, "boot_id": 12}))
    elif how == "unreadable":
        cursor.write_text('{"boot_id": "0b2c')
    else:
        cursor.write_text(json.dumps(good))
    _age(cursor, 300)
    return cursor


@pytest.mark.parametrize("how", ["past_newest", "not_a_number", "boot_not_text", "unreadable"])
def test_a_wrong_or_unreadable_ring_buffer_cursor_judges_what_was_logged_since_its_last_write(
        node, how):
    """On main a sequence number past the ring buffer's newest (or not a number) was
    discarded by reading on from the buffer's end: the XID logged a minute before the sweep
    that found the bad cursor was never judged; a boot id that is not text read the whole
    buffer again (the XID of an hour ago judged twice); an unreadable cursor did judge it."""
    _ring(node)
    _break_cursor(node, how)

    first = engine.run(node.config, node.root)

    assert _xid_gpus(first) == [NEW_GPU]  # the new one judged, the old one not again
    assert len([e for e in _errors(first) if "cursor" in e]) == 1
    second = engine.run(node.config, node.root)
    assert _xid_gpus(second) == [] and _errors(second) == []


def test_a_cursor_past_the_live_ring_buffer_is_rebuilt_from_its_last_write(tmp_path, monkeypatch):
    """The device path: /dev/kmsg hands one record per read() (a SOCK_SEQPACKET pair stands in
    for it, refilled for each open, as the kernel's buffer is). The cursor says seq 10^9, the
    buffer's newest is 301: the records logged since the cursor's last write are read again,
    and the older ones, four times the read bound, neither count against it nor are judged."""
    import socket

    boot = "b0"
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    (tmp_path / "proc/uptime").write_text("7200.00 1.00\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").symlink_to("/dev/null")  # a character device, as the source must be
    monkeypatch.setattr(kmsg, "KMSG_DEVICE", (1, 3))  # /dev/null's number stands in for 1:11
    hour_ago, minute_ago = int(3600 * 1e6), int(7140 * 1e6)
    records = [f"6,{seq},{hour_ago},-;usb 1-1: new high-speed USB device number 3"
               for seq in range(300)]
    records.append(f"4,300,{hour_ago},-;NVRM: Xid (PCI:{OLD_GPU}): 79, GPU has fallen off")
    records.append(f"4,301,{minute_ago},-;NVRM: Xid (PCI:{NEW_GPU}): 79, GPU has fallen off")
    monkeypatch.setattr(kmsg, "MAX_READ", 4096)
    pairs = []

    def open_device(path):
        reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        for rec in records:
            writer.send(rec.encode())
        writer.close()
        pairs.append(reader)
        return os.dup(reader.fileno())

    monkeypatch.setattr(kmsg, "_open_device", open_device)
    cursor = {"boot_id": boot, "kmsg_seq": 10**9, "files": {}, "mtime": time.time() - 300}
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], cursor)
    for reader in pairs:
        reader.close()
    assert [e.pci for e in got.events] == [NEW_GPU]
    assert len(got.errors) == 1 and "past the ring buffer" in got.errors[0]
    assert got.cursor["kmsg_seq"] == 301


@pytest.mark.parametrize("how", ["past_end", "garbage_offset", "entry_null", "files_not_object",
                                 "unreadable", "garbage_head"])
def test_a_wrong_or_unreadable_file_cursor_judges_what_was_logged_since_its_last_write(
        node, how):
    """A kern.log holding an XID of two days ago (judged then) and one of a minute ago. On
    main an offset past the end of the same file (same inode, same head: not a rotation), an
    offset that is not a number, or a file entry (or "files") that is not an object read the
    file again from its start (the old XID drained the repaired node again), and an unreadable
    cursor read it from its end (the new XID was never judged)."""
    now = time.time()
    log = _kern_log(node.root, _syslog(now - 2 * 86400, OLD_GPU) + _syslog(now - 60, NEW_GPU))
    cfg = _file_source(node)
    cursor = _break_cursor(node, "unreadable" if how == "unreadable" else "good")
    if how != "unreadable":
        st = log.stat()
        head = log.read_bytes()[: kmsg.HEAD_BYTES].hex()
        offset = st.st_size + 10_000 if how == "past_end" else "12x"
        if how == "garbage_head":  # the right inode and offset, a head this code never wrote
            offset, head = st.st_size, "not a hex head"
        doc = json.loads(cursor.read_text())
        doc["files"] = {KERN_LOG: {"inode": st.st_ino, "offset": offset, "head": head}}
        if how == "entry_null":
            doc["files"] = {KERN_LOG: None}
        elif how == "files_not_object":
            doc["files"] = [KERN_LOG]
        cursor.write_text(json.dumps(doc))
        _age(cursor, 300)

    first = engine.run(cfg, node.root)

    assert _xid_gpus(first) == [NEW_GPU]
    assert len([e for e in _errors(first) if "cursor" in e]) == 1
    with log.open("a") as fh:
        fh.write(_syslog(time.time(), OLD_GPU, xid=48))
    second = engine.run(cfg, node.root)
    assert [f.code for f in second if f.family == "xid" and f.status is not Status.OK] \
        == ["xid48"]
    assert _errors(second) == []


def test_a_truncated_log_is_still_read_from_its_start(node):
    """copytruncate: the file was copied (kern.log.1), cut to nothing and written again,
    shorter than the old offset. Its head changed, so it is a new log, read whole (not a wrong
    cursor)."""
    import shutil

    now = time.time()
    log = _kern_log(node.root, "".join(_syslog(now - 600, OLD_GPU, xid=13) for _ in range(20)))
    cfg = _file_source(node)
    engine.run(cfg, node.root)
    shutil.copyfile(log, log.with_name("kern.log.1"))
    log.write_text(_syslog(now - 3600, NEW_GPU))  # logged before the cursor's last write
    findings = engine.run(cfg, node.root)
    assert _xid_gpus(findings) == [NEW_GPU] and _errors(findings) == []


# ---- 4. one- and two-digit days, and RFC 3339 ---------------------------------------------------

@pytest.mark.parametrize("header", [
    "May 6 00:38:27 node01 kernel:",   # one space before a one-digit day
    "May  6 00:38:27 node01 kernel:",  # padded to two
    "Nov 21 03:14:15 node01 kernel:",
    "May 6 00:38:27 node01 kernel: [ 4909.922970]",
    "2026-05-06T00:38:27.123456+02:00 node01 kernel:",
])
def test_syslog_headers_with_a_one_or_two_digit_day_are_read_from_a_kern_log(tmp_path, header):
    _kern_log(tmp_path, f"{header} NVRM: Xid (PCI:{NEW_GPU}): 79, GPU has fallen off the bus.\n")
    read = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert [(e.xid, e.pci) for e in read.events] == [(79, NEW_GPU)]
    assert read.errors == []


def test_a_one_digit_day_still_refuses_text_another_program_logged(tmp_path):
    _kern_log(tmp_path, f"May 6 00:38:27 node01 sshd[77]: Invalid user NVRM: Xid (PCI:{NEW_GPU}):"
                        " 79, GPU has fallen off the bus.\n")
    assert kmsg.read_new_events(tmp_path, [KERN_LOG], {}).events == []


@pytest.mark.parametrize(("line", "expect"), [
    # no year in a traditional header: the latest such time not past tomorrow
    ("Dec 31 23:59:00 n kernel: x", (2025, 12, 31)),
    ("Jan 1 00:01:00 n kernel: x", (2026, 1, 1)),
    ("Jan  1 00:01:00 n kernel: x", (2026, 1, 1)),
    ("2026-01-01T11:00:00Z n kernel: x", (2026, 1, 1)),
    ("Foo 1 00:01:00 n kernel: x", None),
    ("[ 12.345] NVRM: Xid (PCI:0000:3b:00): 79, x", None),  # uptime of some boot: unknown
])
def test_when_a_kern_log_line_was_logged_is_read_from_its_header(line, expect):
    now = time.mktime((2026, 1, 1, 12, 0, 0, 0, 0, -1))
    when = kmsg.logged_at(line, now)
    assert (None if when is None else time.localtime(when)[:3]) == expect
