"""XID events from the kernel log: /dev/kmsg, or a file in dmesg or journal/syslog format.

Line shapes the NVIDIA driver prints (after the source's own prefix):
    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.          (older drivers)
    NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d ...               (older, no "PCI:")
    NVRM: Xid (PCI:0000:3b:00): 43, pid='<unknown>', name=<unknown>, Ch 00000008
    NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 ...)
    NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 ...)
    NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU ...)
Source prefixes:
    /dev/kmsg   "6,1234,5678901,-;NVRM: Xid ..."     (prio,seq,usec,flags;message)
    dmesg       "[12345.678901] NVRM: Xid ..."
    syslog      "Nov 21 03:14:15 host kernel: [12345.678901] NVRM: Xid ..." (timestamp optional)

A cursor under the state dir (boot id + kmsg sequence number; file inode + offset) makes each
event count once across sweeps and reboots. Malformed input is skipped, never raised on.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r" (?P<xid>\d{1,5}),(?P<rest>.*)$"
)
_KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_DMESG = re.compile(r"^\[\s*(?P<ts>\d+\.\d+)\]\s?(?P<msg>.*)$")
_KTIME = r"(?:\[\s*\d+\.\d+\]\s?)?"  # the kernel timestamp journald/rsyslog may keep
_SYSLOG = re.compile(r"^\w{3} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: " + _KTIME + r"(?P<msg>.*)$")
_ISO_SYSLOG = re.compile(r"^\d{4}-\d\d-\d\dT\S+ \S+ kernel: " + _KTIME + r"(?P<msg>.*)$")
_PID = re.compile(r"^\s*pid=(?P<pid>'?<unknown>'?|\d+)\s*,")
_NAME = re.compile(r"^\s*name=(?P<name>[^,]*),")
# NVLink5 XIDs (144-150) carry their own severity word after the unit name.
_NVL5_SEVERITY = re.compile(r"\b(?P<sev>Nonfatal|Non-fatal|Fatal)\b")
NVLINK5_XIDS = range(144, 151)
# XID 154 (R550+) states what the GPU now needs after another XID: the text after "to" is
# None, Drain P2P, Drain and Reset, GPU Reset Required or Node Reboot Required (older drivers:
# "OS Reboot"), with NVML's nvmlGpuRecoveryAction_t number in hex before it.
RECOVERY_XID = 154
_RECOVERY = re.compile(r"recovery action changed from .*? to (?:(?P<hex>0x[0-9a-fA-F]+) ?)?\(?"
                       r"(?P<text>[^()]*?)\)?\s*$")
_RECOVERY_BY_NUMBER = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                       4: "drain_and_reset"}


def recovery_action(message: str) -> str | None:
    """The recovery action an XID 154 line names: none, drain_p2p, drain_and_reset, gpu_reset,
    node_reboot; "unknown" when the line is 154's but names none of them."""
    m = _RECOVERY.search(message)
    if not m:
        return "unknown"
    text = m.group("text").strip().lower()
    if text == "none":
        return "none"
    if "drain" in text and "reset" in text:
        return "drain_and_reset"
    if "drain" in text:
        return "drain_p2p"
    if "reboot" in text:
        return "node_reboot"
    if "reset" in text:
        return "gpu_reset"
    if m.group("hex"):
        return _RECOVERY_BY_NUMBER.get(int(m.group("hex"), 16), "unknown")
    return "unknown"


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str  # as printed, e.g. "0000:3b:00"
    message: str
    pid: str | None = None
    process: str | None = None
    severity: str | None = None  # "fatal" / "nonfatal" for 144-150 when printed
    seq: int | None = None  # /dev/kmsg sequence number when known
    source: str = ""
    recovery: str | None = None  # XID 154: the recovery action it names (recovery_action())

    def to_dict(self) -> dict:
        return asdict(self)


def strip_prefix(line: str) -> tuple[str, int | None]:
    """(message, kmsg seq or None) for one line of any supported source."""
    m = _KMSG.match(line)
    if m:
        return m.group("msg"), int(m.group("seq"))
    for rx in (_SYSLOG, _ISO_SYSLOG, _DMESG):
        m = rx.match(line)
        if m:
            return m.group("msg"), None
    return line, None


def parse_line(line: str, source: str = "") -> XidEvent | None:
    """One XidEvent, or None when the line is not a well-formed XID line."""
    msg, seq = strip_prefix(line.rstrip("\r\n"))
    m = _XID.search(msg)
    if not m:
        return None
    xid = int(m.group("xid"))
    rest = m.group("rest")
    pid = name = None
    pm = _PID.match(rest)
    if pm:
        pid = pm.group("pid").strip("'")
        rest = rest[pm.end() :]
        nm = _NAME.match(rest)
        if nm:
            name = nm.group("name").strip()
            rest = rest[nm.end() :]
    severity = None
    if xid in NVLINK5_XIDS:
        sm = _NVL5_SEVERITY.search(rest)
        if sm:
            severity = "fatal" if sm.group("sev") == "Fatal" else "nonfatal"
    recovery = recovery_action(rest) if xid == RECOVERY_XID else None
    return XidEvent(xid, m.group("pci").lower(), rest.strip(), pid, name, severity, seq, source,
                    recovery)


def parse_text(text: str, source: str = "") -> list[XidEvent]:
    events = []
    for line in text.splitlines():
        try:
            ev = parse_line(line, source)
        except Exception:  # noqa: BLE001 - a parser bug must not lose the other lines
            ev = None
        if ev:
            events.append(ev)
    return events


def boot_id(root: Path) -> str:
    try:
        return (root / "proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _read_kmsg_device(path: Path) -> str:
    """Drain the live ring buffer without blocking (each read() returns one record)."""
    records = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten record: skip it
                    continue
                if exc.errno == errno.EAGAIN:
                    break
                raise
            if not chunk:
                break
            records.append(chunk.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return "\n".join(records)


@dataclass
class XidRead:
    events: list[XidEvent]  # new since the cursor
    errors: list[str]  # sources that could not be read
    cursor: dict


def read_new_events(
    root: Path, sources: list[str], cursor: dict, *, file_backlog: bool = True
) -> XidRead:
    """Events not seen before, and the cursor to save once they have been judged."""
    boot = boot_id(root)
    new_cursor: dict = {"boot_id": boot, "kmsg_seq": -1, "files": {}}
    same_boot = bool(boot) and cursor.get("boot_id") == boot
    last_seq = int(cursor.get("kmsg_seq", -1)) if same_boot else -1
    new_cursor["kmsg_seq"] = last_seq
    events: list[XidEvent] = []
    errors: list[str] = []
    for source in sources:
        path = root / source.lstrip("/")
        try:
            st = path.stat()
        except OSError:
            continue  # an absent source is normal (no kern.log on journald-only nodes)
        try:
            if stat.S_ISCHR(st.st_mode) or source == "/dev/kmsg":
                text = _read_kmsg_device(path) if stat.S_ISCHR(st.st_mode) else path.read_text(
                    errors="replace"
                )
                # Every /dev/kmsg record has a sequence number; one without is not a record.
                fresh = (e for e in parse_text(text, source) if e.seq is not None)
                events.extend(e for e in fresh if e.seq > last_seq)
                seqs = [
                    int(m.group("seq")) for m in map(_KMSG.match, text.splitlines()) if m
                ]
                if seqs:
                    new_cursor["kmsg_seq"] = max([new_cursor["kmsg_seq"], *seqs])
            else:
                prev = cursor.get("files", {}).get(source)
                if prev is None and not file_backlog:
                    # First sight of this file: what it already holds is history, not news.
                    prev = {"inode": st.st_ino, "offset": st.st_size}
                prev = prev or {}
                offset = int(prev.get("offset", 0))
                # Rotated or truncated since last time: start over.
                if prev.get("inode") != st.st_ino or st.st_size < offset:
                    offset = 0
                with path.open("rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
                # Only whole lines; a line still being written is read next time.
                end = data.rfind(b"\n") + 1
                events.extend(parse_text(data[:end].decode("utf-8", "replace"), source))
                new_cursor["files"][source] = {"inode": st.st_ino, "offset": offset + end}
        except OSError as exc:
            errors.append(f"{source}: {exc.strerror or exc}")
    return XidRead(events, errors, new_cursor)


def load_cursor(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def save_json(path: Path, data: dict) -> None:
    """Write atomically, so a killed checker never leaves a half-written state file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
