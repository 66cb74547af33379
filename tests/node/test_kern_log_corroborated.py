"""Any user can put a line into a kern.* syslog file that reads exactly as the kernel's own:
rsyslog takes the facility a /dev/log datagram names ("<3>kernel: NVRM: Xid (...): 79, ...",
checked with rsyslog 8.2302). No text in the file tells the two apart, but the kernel's ring
buffer does: every XID the kernel printed since the buffer's oldest record is in it. An XID
line in a kernel log file, logged (by its syslog header) at a time the ring buffer covers,
that no record of the ring buffer holds (the same XID on the same GPU, logged before it) is
not the kernel's: said, not judged. A line the ring cannot vouch for either way (logged before
its oldest record: an earlier boot, an overrun; no /dev/kmsg to read; no syslog header) is
judged as before."""

from __future__ import annotations

import time
from pathlib import Path

from rsc_health.collect import kmsg

UPTIME = 1000.0  # seconds since boot; the ring holds records from usec 100e6 on (t0 + 100 s)
KERN_LOG = "/var/log/kern.log"


def _node(root: Path, ring: list[tuple[int, float, str]]) -> float:
    """A node booted UPTIME seconds ago; `ring`: (seq, seconds since boot, message)."""
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("b0\n")
    (root / "proc/uptime").write_text(f"{UPTIME:.2f} 4000.00\n")
    (root / "dev").mkdir()
    (root / "dev/kmsg").write_text("".join(f"3,{seq},{int(at * 1e6)},-;{msg}\n"
                                           for seq, at, msg in ring))
    return time.time() - UPTIME


def _syslog(when: float, msg: str) -> str:
    return time.strftime("%b %e %H:%M:%S", time.localtime(when)) + f" gpu042 kernel: {msg}\n"


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
CHATTER = [(s, 100.0 + s, "eth0: link up") for s in range(10)]


def _read(root: Path, *lines: str):
    log = root / KERN_LOG.lstrip("/")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(lines))
    return kmsg.read_new_events(root, [KERN_LOG], {})


def test_an_xid_line_the_kernel_never_logged_is_said_not_judged(tmp_path):
    booted = _node(tmp_path, CHATTER)
    got = _read(tmp_path, _syslog(booted + 700, XID79))  # the ring covers t0+100 s onwards
    assert got.events == []
    assert len(got.errors) == 1 and "not the kernel's" in got.errors[0]


def test_the_kernels_own_xid_line_is_judged(tmp_path):
    booted = _node(tmp_path, [*CHATTER, (10, 690.0, XID79)])
    got = _read(tmp_path, _syslog(booted + 700, XID79))  # rsyslog wrote it 10 s later
    assert [e.xid for e in got.events] == [79] and got.errors == []


def test_a_line_older_than_the_ring_buffer_is_judged(tmp_path):
    booted = _node(tmp_path, CHATTER)  # overrun, or an earlier boot: the ring cannot vouch
    got = _read(tmp_path, _syslog(booted - 3600, XID79), _syslog(booted + 50, XID79))
    assert [e.xid for e in got.events] == [79, 79] and got.errors == []


def test_without_a_ring_buffer_to_read_the_file_is_judged(tmp_path):
    booted = _node(tmp_path, CHATTER)
    (tmp_path / "dev/kmsg").unlink()
    got = _read(tmp_path, _syslog(booted + 700, XID79))
    assert [e.xid for e in got.events] == [79] and got.errors == []


def test_the_kernels_line_is_judged_however_far_the_ring_clock_drifted(tmp_path):
    """The ring's times are the kernel's local clock, not NTP's: over months of uptime it
    drifts minutes from the wall clock rsyslog stamps. The same XID on the same GPU anywhere
    in the ring vouches for the line."""
    booted = _node(tmp_path, [*CHATTER, (10, 300.0, XID79)])
    got = _read(tmp_path, _syslog(booted + 900, XID79))
    assert [e.xid for e in got.events] == [79] and got.errors == []
