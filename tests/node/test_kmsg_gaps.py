"""No silent gaps in the kernel log (issue 21): a line longer than one run's read does not pin
the file cursor, a backlog longer than one run's read is said, a cursor that is valid JSON but
wrong is rebuilt as an unreadable one is (the XID logged just before the sweep that found it is
judged, nothing older is judged again), and syslog headers with a one-digit day are read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rsc_health.collect import kmsg

KERN_LOG = "/var/log/kern.log"
NEW_GPU = "0000:3b:00"


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
