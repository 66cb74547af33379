"""Every kernel-log file format a site writes an XID line in is read, and one the reader does
not know is said, never judged healthy in silence.

The reader knew the traditional syslog header, RFC 3339 (rsyslog's RSYSLOG_FileFormat, Debian
12's default), dmesg's `[12.3]` and `dmesg -T`. A file written in any other common shape held
XID lines the kernel-lead rule took for another program's text: `journalctl -o short-full`
("Fri 2026-11-27 03:14:15 UTC host kernel: ..."), `-o short-unix` ("1795749255.123456 host
kernel: ..."), `dmesg -x` ("kern  :warn  : [12.3] ..."), `dmesg -r` ("<4>[12.3] ..."), RFC 5424
(rsyslog's RSYSLOG_SyslogProtocol23Format, "<4>1 2026-...T... host kernel - - -  ..."). An XID
79 there was no event and the family said "no new XID events". The shapes are the tools' own
(util-linux dmesg.c's "%-6s:%-6s: " decode prefix and "<%d>[%5ld.%06ld] " raw prefix;
systemd's short-full "%a %Y-%m-%d %H:%M:%S %Z" and short-unix "sec.usec"; rsyslog's
"<%PRI%>1 %TIMESTAMP:::date-rfc3339% %HOSTNAME% %APP-NAME% %PROCID% %MSGID%
%STRUCTURED-DATA% %msg%", whose msg keeps its leading space)."""

from __future__ import annotations

import time

import pytest

from rsc_health.collect import kmsg

KERN_LOG = "/var/log/kern.log"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
SXID = "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up"

FORMATS = {
    "journalctl -o short-full": "Fri 2026-11-27 03:14:15 UTC gpu042 kernel: {}",
    "journalctl -o short-full, kernel time kept": (
        "Fri 2026-11-27 03:14:15 CET gpu042 kernel: [12345.678901] {}"),
    "journalctl -o short-unix": "1795749255.123456 gpu042 kernel: {}",
    "journalctl -o short-iso-precise (systemd < 250)": (
        "2026-11-27T03:14:15.123456+0000 gpu042 kernel: {}"),
    "journalctl -o short-iso-precise": "2026-11-27T03:14:15.123456+00:00 gpu042 kernel: {}",
    "journalctl -o short-precise": "Nov 27 03:14:15.123456 gpu042 kernel: {}",
    "journalctl -o short-monotonic": "[12345.678901] gpu042 kernel: {}",
    "dmesg -x": "kern  :warn  : [12345.678901] {}",
    "dmesg -x -T": "kern  :err   : [Fri Nov 27 03:14:15 2026] {}",
    "dmesg -x -t": "kern  :warn  : {}",
    "dmesg -r": "<4>[12345.678901] {}",
    "dmesg -T": "[Fri Nov 27 03:14:15 2026] {}",
    "dmesg --time-format=iso": "2026-11-27T03:14:15,123456+00:00 {}",
    "RFC 5424 (RSYSLOG_SyslogProtocol23Format)": (
        "<4>1 2026-11-27T03:14:15.123456+00:00 gpu042 kernel - - -  {}"),
    "RFC 5424, kernel time kept": (
        "<3>1 2026-11-27T03:14:15.123456+00:00 gpu042 kernel - - - [12345.678901] {}"),
    "RFC 3339 (RSYSLOG_FileFormat)": "2026-11-27T03:14:15.123456+00:00 gpu042 kernel: {}",
    "RFC 3339, kernel time kept": (
        "2026-11-27T03:14:15.123456+01:00 gpu042 kernel: [12345.678901] {}"),
}


@pytest.mark.parametrize("shape", FORMATS.values(), ids=list(FORMATS))
def test_an_xid_line_in_every_common_log_format_is_an_event(shape):
    ev = kmsg.parse_line(shape.format(XID79))
    assert ev is not None
    assert (ev.xid, ev.pci, ev.pid, ev.process) == (79, "0000:3b:00", "1234", "python3")
    sx = kmsg.parse_sxid_line(shape.format(SXID))
    assert sx is not None and (sx.sxid, sx.severity) == (20034, "fatal")


@pytest.mark.parametrize("shape", FORMATS.values(), ids=list(FORMATS))
def test_a_kern_log_in_every_common_format_yields_its_xid_and_no_complaint(tmp_path, shape):
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text(shape.format("eth0: link up") + "\n" + shape.format(XID79) + "\n")
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert [e.xid for e in got.events] == [79] and got.errors == []


@pytest.mark.parametrize("line", [
    # another program's text in the same shapes: not the kernel's line
    "Fri 2026-11-27 03:14:15 UTC gpu042 sshd[77]: Invalid user " + XID79,
    "1795749255.123456 gpu042 alice: " + XID79,
    "<4>1 2026-11-27T03:14:15.123456+00:00 gpu042 alice - - -  " + XID79,
    # logger -t kernel sends facility user (PRI 13): the kernel logs under facility kern alone
    "<13>1 2026-11-27T03:14:15.123456+00:00 gpu042 kernel - - -  " + XID79,
    # a record root wrote to /dev/kmsg (facility user), as dmesg -x and -r print it
    "user  :warn  : [12345.678901] " + XID79,
    "<12>[12345.678901] " + XID79,
])
def test_another_programs_xid_text_in_the_new_shapes_is_not_an_event(line):
    assert kmsg.parse_line(line) is None


@pytest.mark.parametrize(("header", "expect"), [
    ("Fri 2026-11-27 03:14:15 UTC gpu042 kernel: x", "2026-11-27T03:14:15+00:00"),
    ("1795749255.123456 gpu042 kernel: x", "2026-11-27T03:14:15.123456+00:00"),
    ("2026-11-27T03:14:15.123456+0000 gpu042 kernel: x", "2026-11-27T03:14:15.123456+00:00"),
    ("2026-11-27T03:14:15+0100 gpu042 kernel: x", "2026-11-27T02:14:15+00:00"),
    ("<4>1 2026-11-27T03:14:15.123456+00:00 gpu042 kernel - - -  x",
     "2026-11-27T03:14:15.123456+00:00"),
])
def test_the_time_each_header_says_is_read(header, expect):
    """What a lost cursor is rebuilt from and what the ring buffer corroborates a file's XID
    line by: a header whose time is not read has its forged XID line judged."""
    from datetime import datetime

    assert kmsg.logged_at(header[:64], time.time()) == datetime.fromisoformat(expect).timestamp()


def test_a_forged_xid_line_in_journal_short_full_format_is_said_not_judged(tmp_path):
    """`logger -t kernel` through journald, exported with `journalctl -o short-full`: the ring
    buffer covers the time the line names and holds no XID 79: not the kernel's."""
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("b0\n")
    (tmp_path / "proc/uptime").write_text("1000.00 4000.00\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("".join(f"6,{s},{(100 + s) * 10**6},-;eth0: link up\n"
                                               for s in range(10)))
    when = time.time() - 300  # 700 s after boot; the ring's oldest record is 100 s after
    header = time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text(f"{header} gpu042 kernel: {XID79}\n")
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert got.events == []
    assert len(got.errors) == 1 and "not the kernel's" in got.errors[0]


def test_a_log_in_a_format_the_reader_does_not_know_is_said(tmp_path):
    """A site template ("host|facility|severity|message") or `journalctl -o json`: no line
    has a header the reader knows, so none of its XID lines could ever be one. It said nothing
    and the xid family said "no new XID events"."""
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("gpu042|kern|info|eth0: link up\ngpu042|kern|info|eth1: link up\n")
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert got.events == []
    assert len(got.errors) == 1 and "format" in got.errors[0] and KERN_LOG in got.errors[0]
    again = kmsg.read_new_events(tmp_path, [KERN_LOG], got.cursor)
    assert again.errors == []  # said for the lines read, not again for nothing new


def test_an_xid_line_in_a_format_the_reader_does_not_know_is_said(tmp_path):
    """The same template among lines the reader knows (a second rsyslog rule writing the same
    file): the XID line is not judged, and that is said, with the line."""
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("Nov 27 03:14:15 gpu042 kernel: eth0: link up\n"
                   f"gpu042|kern|warning|{XID79}\n")
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert got.events == []
    assert len(got.errors) == 1 and "Xid" in got.errors[0] and "format" in got.errors[0]


def test_a_journal_export_with_its_boot_markers_is_no_complaint(tmp_path):
    log = tmp_path / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("-- Boot 1c3a6c6ee9a04c1d9b5f3b2c6b3f0a4e --\n"
                   "Fri 2026-11-27 03:14:15 UTC gpu042 kernel: eth0: link up\n")
    got = kmsg.read_new_events(tmp_path, [KERN_LOG], {})
    assert got.events == [] and got.errors == []


def test_a_ring_buffer_stand_in_with_no_kmsg_record_is_said(tmp_path):
    """--root naming a tree whose dev/kmsg is a saved `dmesg` (not /dev/kmsg's records): no
    line has a sequence number, and every one was dropped in silence."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text(f"[12345.678901] {XID79}\n")
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {})
    assert got.events == []
    assert len(got.errors) == 1 and "/dev/kmsg" in got.errors[0]


def test_a_kern_log_in_an_unknown_format_is_a_checker_error_not_an_all_clear(node):
    """What the family says: before, one OK row "no new XID events" and nothing else."""
    from rsc_health.engine import run
    from rsc_health.model import Status

    log = node.path("var/log/kernel-only.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"gpu042|kern|warning|{XID79}\n")
    cfg = node.config
    cfg.data["xid"]["sources"] = ["/var/log/kernel-only.log"]
    findings = run(cfg, node.root, only={"xid"})
    errors = [f for f in findings if f.status is Status.ERROR]
    assert len(errors) == 1 and "format" in errors[0].reason, findings


# Records user space wrote into /dev/kmsg (helper-207). The kernel forces a facility other
# than kern on every write to /dev/kmsg (root's `echo`, a privileged container, journald's
# ForwardToKMsg relaying any user's `logger`); the reader refused such a record as `dmesg -r`
# and `dmesg -x` print it, but read the ring's own records without looking at the priority.
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
SXID_FATAL = ("nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM "
              "Fault Up")


def _ring_node(tmp_path, records):
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("b0\n")
    (tmp_path / "proc/uptime").write_text("1000.00 4000.00\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("".join(r + "\n" for r in records))


def test_a_user_facility_kmsg_record_is_not_an_xid(tmp_path):
    _ring_node(tmp_path, [
        "6,1,1000000,-;eth0: link up",
        # journald ForwardToKMsg: "<prio>IDENT[PID]: MESSAGE", facility user (13 = user.notice)
        "13,2,2000000,-;alice[4242]: kernel: " + XID79,
        # root (or a privileged container) writing /dev/kmsg without a prefix: user facility
        "12,3,3000000,-;" + XID79,
        # a facility named outright ("<30>": daemon.info); the kernel keeps it, never kern
        "30,4,4000000,-;" + XID79,
    ])
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {})
    assert [e.xid for e in got.events] == []
    assert got.cursor["kmsg_seq"] == 4  # read past, not waited on


def test_a_user_facility_record_is_refused_as_dmesg_r_prints_it():
    assert kmsg.parse_line("<12>[3.000000] " + XID79) is None
    assert kmsg.parse_line("12,3,3000000,-;" + XID79) is None
    assert kmsg.parse_line("4,3,3000000,-;" + XID79).xid == 79  # the kernel's own: kern.warn


def test_a_user_facility_kmsg_record_is_not_an_sxid(tmp_path):
    _ring_node(tmp_path, ["13,2,2000000,-;alice[4242]: kernel: " + SXID_FATAL,
                          "12,3,3000000,-;" + SXID_FATAL])
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {}, parse=kmsg.parse_sxid_line)
    assert got.events == []
    assert kmsg.parse_sxid_line("4,5,5000000,-;" + SXID_FATAL).sxid == 20034


@pytest.mark.parametrize("line", ["alice[4242]: kernel: " + XID79,
                                  "alice: kernel: " + XID79,
                                  "[12.000000] alice[4242]: kernel: " + XID79])
def test_a_programs_tag_before_kernel_is_no_host(line):
    """A `logger` line as journald forwards it ("IDENT[PID]: MESSAGE") is not a syslog
    header "<host> kernel:": a host holds no bracket and ends in no colon."""
    assert kmsg.parse_line(line) is None
    assert kmsg.parse_sxid_line(line.replace(XID79, SXID_FATAL)) is None
