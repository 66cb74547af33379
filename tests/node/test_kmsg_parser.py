"""The XID parser on every driver variant and log source, and the file cursor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rsc_health.collect import kmsg
from rsc_health.model import Level


@pytest.mark.parametrize(("line", "xid", "pci", "pid", "name", "sev"), [
    # /dev/kmsg, current driver (pid + name)
    ("3,1834,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has "
     "fallen off the bus.", 79, "0000:3b:00", "1234", "python3", None),
    # older driver: no pid/name
    ("[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
     79, "0000:3b:00", None, None, None),
    ("Nov 21 03:14:15 gpu042 kernel: NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp "
     "Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address", 13, "0000:3b:00", None, None,
     None),
    # very old driver: no "PCI:" in the address, journal keeps the kernel timestamp
    ("May  6 00:38:27 alex kernel: [ 4909.922970] NVRM: Xid (0000:01:00): 13, 0005 00000000 "
     "0000502d 00000104 00000000 00000100", 13, "0000:01:00", None, None, None),
    # pid unknown
    ("[  812.100000] NVRM: Xid (PCI:0000:ba:00): 43, pid='<unknown>', name=<unknown>, "
     "Ch 00000008", 43, "0000:ba:00", "<unknown>", "<unknown>", None),
    # NVLink5 lines carry their own severity (Blackwell; 4-digit PCI domain)
    ("6,99,1,-;NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
     "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
     145, "0018:01:00", None, None, "nonfatal"),
    ("2025-12-08T10:00:00.123456+00:00 node7 kernel: NVRM: Xid (PCI:0000:00:00): 149, "
     "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", 149, "0000:00:00", None, None, "fatal"),
])
def test_every_driver_variant_and_source_parses(line, xid, pci, pid, name, sev):
    ev = kmsg.parse_line(line)
    assert ev is not None
    assert (ev.xid, ev.pci, ev.pid, ev.process, ev.severity) == (xid, pci, pid, name, sev)


@pytest.mark.parametrize("line", [
    "6,1202,3641,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03",
    "NVRM: Xid (PCI:0000:3b:00): , GPU has fallen off the bus.",
    "NVRM: Xid (PCI:zzzz:3b:00): 79, GPU has fallen off the bus.",
    "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up",
    "",
])
def test_non_xid_lines_are_not_events(line):
    assert kmsg.parse_line(line) is None


def test_kmsg_sequence_number_is_kept():
    ev = kmsg.parse_line("3,4711,1,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert ev.seq == 4711


def test_file_source_cursor_reads_each_line_once_and_restarts_on_rotation(tmp_path: Path):
    log = tmp_path / "var/log/kern.log"
    log.parent.mkdir(parents=True)
    line = "Nov 21 03:14:15 h kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    log.write_text(line)
    first = kmsg.read_new_events(tmp_path, ["/var/log/kern.log"], {})
    assert [e.xid for e in first.events] == [79]
    again = kmsg.read_new_events(tmp_path, ["/var/log/kern.log"], first.cursor)
    assert again.events == []
    with log.open("a") as fh:
        fh.write(line.replace(": 79,", ": 48,"))
        fh.write("Nov 21 03:14:16 h kernel: NVRM: Xid (PCI:0000:3b:00): 94, half a li")
    more = kmsg.read_new_events(tmp_path, ["/var/log/kern.log"], again.cursor)
    assert [e.xid for e in more.events] == [48]  # the unfinished line waits for its newline
    log.unlink()
    log.write_text(line.replace(": 79,", ": 63,"))  # logrotate: a new, shorter file
    rotated = kmsg.read_new_events(tmp_path, ["/var/log/kern.log"], more.cursor)
    assert [e.xid for e in rotated.events] == [63]


def test_absent_sources_are_not_errors_while_one_is_read(tmp_path):
    (tmp_path / "var/log").mkdir(parents=True)
    (tmp_path / "var/log/kern.log").write_text("")
    read = kmsg.read_new_events(tmp_path, ["/dev/kmsg", "/var/log/syslog", "/var/log/kern.log"],
                                {})
    assert read.events == [] and read.errors == []


@pytest.mark.parametrize("sources", [[], ["/dev/kmsg", "/var/log/kernel-only.log"]])
def test_no_source_to_read_is_said_not_read_as_a_quiet_kernel(tmp_path, sources):
    """[xid] sources empty, or every name in it absent (a typo pushed to the fleet): no XID
    can be seen, and a node blind to an XID 79 read as healthy (helper-105)."""
    read = kmsg.read_new_events(tmp_path, sources, {})
    assert read.events == [] and len(read.errors) == 1
    assert "no kernel log to read" in read.errors[0] and "no XID can be seen" in read.errors[0]


def test_file_backlog_off_starts_at_the_end_on_first_sight(tmp_path: Path):
    log = tmp_path / "var/log/syslog"
    log.parent.mkdir(parents=True)
    old = "Nov 20 01:00:00 h kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    log.write_text(old)
    first = kmsg.read_new_events(tmp_path, ["/var/log/syslog"], {}, file_backlog=False)
    assert first.events == []
    with log.open("a") as fh:
        fh.write(old.replace(": 79,", ": 48,"))
    later = kmsg.read_new_events(tmp_path, ["/var/log/syslog"], first.cursor, file_backlog=False)
    assert [e.xid for e in later.events] == [48]


def test_kmsg_source_ignores_lines_without_a_sequence_number(tmp_path: Path):
    dev = tmp_path / "dev/kmsg"
    dev.parent.mkdir(parents=True)
    dev.write_text("[1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    assert kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {}).events == []


# XID 154 lines as the driver prints them (NVIDIA's XID catalog: "GPU recovery action changed
# from 0x0 (None) to 0x2 (Node Reboot Required)"; the other values and the "OS Reboot" of
# older drivers as seen in operators' kernel logs).
@pytest.mark.parametrize(("line", "recovery"), [
    ("[Mon Apr  6 07:25:24 2026] NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed "
     "from 0x0 (None) to 0x1 (GPU Reset Required)", "gpu_reset"),
    ("Aug 12 01:22:51 host kernel: NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action "
     "changed from 0x0 (None) to 0x2 (Node Reboot Required)", "node_reboot"),
    ("6,2001,1,-;NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) "
     "to 0x2 (OS Reboot)", "node_reboot"),
    ("6,2002,1,-;NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) "
     "to 0x3 (Drain P2P)", "drain_p2p"),
    ("6,2003,1,-;NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) "
     "to 0x4 (Drain and Reset)", "drain_and_reset"),
    ("6,2004,1,-;NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU "
     "Reset Required) to 0x0 (None)", "none"),
    ("6,2005,1,-;NVRM: Xid 154, GPU recovery action changed from None to Node Reboot Required",
     None),  # no PCI address: not an XID line this parser trusts
    ("6,2006,1,-;NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) "
     "to 0x9 (Something Newer)", "unknown"),
    ("6,2007,1,-;NVRM: Xid (PCI:0000:01:00): 154, truncated", "unknown"),
])
def test_xid154_names_the_recovery_action_it_asks_for(line, recovery):
    ev = kmsg.parse_line(line)
    if recovery is None:
        assert ev is None
        return
    assert (ev.xid, ev.recovery) == (154, recovery)


def test_other_xids_carry_no_recovery_action():
    ev = kmsg.parse_line("[1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    assert ev.recovery is None


# Lines any user (logger, a job's own syslog calls) or a remote one (sshd logs the user name
# it was offered) puts into a syslog file, each holding a well-formed XID after its own tag.
FORGED = [
    "Nov 21 03:14:15 gpu042 alice: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "Nov 21 03:14:15 gpu042 sshd[77]: Invalid user NVRM: Xid (PCI:0000:3b:00): 79, x from "
    "10.0.0.9 port 4242",
    "2026-11-21T03:14:15.123456+00:00 gpu042 python3[99]: NVRM: Xid (PCI:0000:3b:00): 48, x",
    "6,4712,1,-;audit: type=1400 name=NVRM: Xid (PCI:0000:3b:00): 79, x",
    "Nov 21 03:14:15 gpu042 alice: kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen",
]


@pytest.mark.parametrize("line", FORGED)
def test_an_xid_in_text_another_program_logged_is_not_an_event(line):
    assert kmsg.parse_line(line) is None


@pytest.mark.parametrize("line", [
    # journalctl -k -o short-precise and -o short-monotonic, dmesg -T and --time-format=iso
    "Nov 21 03:14:15.123456 gpu042 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off",
    "[ 4909.922970] gpu042 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "[Mon Apr  6 07:25:24 2026] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    "2026-04-06T07:25:24,123456+00:00 NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off",
    "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",  # journalctl -k -o cat
])
def test_the_kernels_own_xid_lines_in_every_log_format_are_events(line):
    ev = kmsg.parse_line(line)
    assert ev is not None and (ev.xid, ev.pci) == (79, "0000:3b:00")


def test_a_user_logging_an_xid_line_to_syslog_does_not_drain_the_node(node):
    """A syslog file as an XID source (README: "dmesg/syslog files"): a user's `logger` line
    holding a perfect XID 79 must not drain the node; the kernel's own line still does."""
    log = node.path("var/log/syslog")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(line + "\n" for line in FORGED[:3]))
    cfg = node.config
    cfg.data["xid"]["sources"] = ["/dev/kmsg", "/var/log/syslog"]
    from rsc_health.engine import run
    from rsc_health.policy import decide

    assert decide(run(cfg, node.root, only={"xid"})).level is Level.OK
    with log.open("a") as fh:
        fh.write("Nov 21 03:15:00 gpu042 kernel: NVRM: Xid (PCI:0000:1b:00): 79, GPU has "
                 "fallen off the bus.\n")
    assert decide(run(cfg, node.root, only={"xid"})).level is Level.DRAIN_NOW


def test_a_ring_buffer_that_never_runs_dry_is_read_to_a_bound(tmp_path: Path, monkeypatch):
    """/dev/kmsg hands one record per read() and EAGAIN once drained; a kernel that logs
    faster than the checker reads (a message storm) never lets it drain. A character device
    that never ends (/dev/zero standing in for it) was read until memory ran out; the read now
    stops at MAX_READ bytes, says so, and the cursor carries the rest to the next run."""
    import threading

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").symlink_to("/dev/zero")
    monkeypatch.setattr(kmsg, "KMSG_DEVICE", (1, 5))  # /dev/zero's number stands in for 1:11
    result: list = []
    reader = threading.Thread(
        target=lambda: result.append(kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {})),
        daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert result, "the read of a never-ending ring buffer did not end"
    assert any("stopped after" in e for e in result[0].errors)


def _boot(root: Path, boot: str = "b0") -> str:
    p = root / "proc/sys/kernel/random/boot_id"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(boot + "\n")
    return boot


def _record(seq: int, msg: str) -> str:
    return f"6,{seq},{1000 + seq},-;{msg}"


def test_a_new_xid_behind_more_judged_records_than_the_read_bound_is_seen(
        tmp_path: Path, monkeypatch):
    """A reader of /dev/kmsg starts at the buffer's oldest record on every run. With the read
    bound counting every byte, a ring buffer holding more than MAX_READ of records already
    judged (log_buf_len=32M on a chatty node) stopped there every run and never reached the
    XID logged after them. A SOCK_SEQPACKET pair stands in for the device: one record per
    read(), as /dev/kmsg hands them."""
    import socket
    import threading

    boot = _boot(tmp_path)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").symlink_to("/dev/null")  # a character device, as the source must be
    monkeypatch.setattr(kmsg, "KMSG_DEVICE", (1, 3))  # /dev/null's number stands in for 1:11
    monkeypatch.setattr(kmsg, "MAX_READ", 4096)
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    monkeypatch.setattr(kmsg, "_open_device", lambda path: os.dup(reader.fileno()))

    def log() -> None:
        for seq in range(300):  # about 18 KiB of judged records, four times the bound
            writer.send(_record(seq, "usb 1-1: new high-speed USB device number 3").encode())
        writer.send(_record(300, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the "
                                 "bus.").encode())
        writer.close()

    t = threading.Thread(target=log, daemon=True)
    t.start()
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {"boot_id": boot, "kmsg_seq": 299})
    t.join(timeout=10)
    reader.close()
    assert [(e.xid, e.seq) for e in got.events] == [(79, 300)]
    assert got.cursor["kmsg_seq"] == 300
    assert got.errors == []


def _kmsg_file(root: Path, seqs: list[int]) -> None:
    dev = root / "dev/kmsg"
    dev.parent.mkdir(parents=True, exist_ok=True)
    dev.write_text("".join(_record(s, "eth0: link up") + "\n" for s in seqs))


def test_records_overwritten_before_they_were_read_are_said_not_hidden(tmp_path: Path):
    """The kernel numbers its records one after another. The cursor says the last run read up
    to seq 10; the buffer now starts at 15: records 11..14 were overwritten unread, and an XID
    among them was never judged. That is said as a checker error (the node is not drained for
    it); a jump inside the read (an EPIPE from /dev/kmsg) is counted the same way."""
    boot = _boot(tmp_path)
    _kmsg_file(tmp_path, [15, 16, 18, 19])
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {"boot_id": boot, "kmsg_seq": 10})
    assert len(got.errors) == 1
    assert "5 kernel log record(s) (seq 11..17) were overwritten" in got.errors[0]
    assert got.cursor["kmsg_seq"] == 19


@pytest.mark.parametrize("cursor", [
    {"boot_id": "b0", "kmsg_seq": 14},  # read up to 14 last time: nothing lost
    {},  # the first run: what went before it was never ours to read
    {"boot_id": "an earlier boot", "kmsg_seq": 3},  # a new boot numbers from 0 again
])
def test_no_loss_is_claimed_where_none_can_be_known(tmp_path: Path, cursor):
    _boot(tmp_path)
    _kmsg_file(tmp_path, [15, 16, 17])
    assert kmsg.read_new_events(tmp_path, ["/dev/kmsg"], cursor).errors == []
