"""XID events from the kernel log: /dev/kmsg, or a file in dmesg or journal/syslog format.

Line shapes the NVIDIA driver prints (after the source's own prefix):
    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.          (older drivers)
    NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d ...               (older, no "PCI:")
    NVRM: Xid (PCI:0000:3b:00): 43, pid='<unknown>', name=<unknown>, Ch 00000008
    NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 ...)
    NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 ...)
    NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU ...)
    NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.    (no Xid: read as an XID 79 of its own)
    NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x62:0x55:2385)     (no Xid: INIT_FAILED_XID)
    NVRM: GPU 0000:3b:00.0: rm_init_adapter failed, device minor number 3         (likewise)
Source prefixes:
    /dev/kmsg   "6,1234,5678901,-;NVRM: Xid ..."     (prio,seq,usec,flags;message)
    dmesg       "[12345.678901] NVRM: Xid ..."
    syslog      "Nov 21 03:14:15 host kernel: [12345.678901] NVRM: Xid ..." (timestamp optional)
                "2026-11-21T03:14:15.123456+00:00 host kernel: ..."  (RFC 3339; short-iso)
                "<4>1 2026-11-21T03:14:15.123456+00:00 host kernel - - -  ..."  (RFC 5424)
    journalctl  "Fri 2026-11-21 03:14:15 UTC host kernel: ..." (-o short-full),
                "1795749255.123456 host kernel: ..." (-o short-unix), and the syslog shapes
    dmesg -x/-r "kern  :warn  : [12345.678901] ..."  "<4>[12345.678901] ..."
A file source's new lines none of which is in one of these formats, or a line naming an XID in
none, is said (a checker error), never judged healthy in silence.

A cursor under the state dir (boot id + kmsg sequence number; file inode + offset) makes each
event count once across sweeps and reboots. Malformed input is skipped, never raised on.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from rsc_health import lazyre
from rsc_health.collect.sysfs import pure, read_bounded
from rsc_health.compat import UTC, datetime, json_dumps
from rsc_health.record import asdict, dataclass

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable, Container

    from _typeshed import StrPath  # str | os.PathLike[str]

# MIG instances print their GPU instance (and compute instance) after the address:
#   NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, ...   NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94
# NVSwitch `SXid` lines ("nvidia-nvswitch0: SXid (PCI:...): 12028") are not GPU XIDs: the
# literal "NVRM: Xid" never matches them.
_XID = lazyre.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
    r"(?P<mig>(?: GPU-C?I:[0-9A-Fa-f]{1,4}){0,2})\): (?P<xid>\d{1,5}),(?P<rest>.*)$"
)
# No driver line is near this long; longer input is cut before any pattern sees it, so parsing
# is linear in the input whatever it holds (a 100 kB line once took 69 s in the 154 pattern).
MAX_LINE = 4096
# A kmsg sequence number beyond this is not one the kernel wrote (it counts from 0 per boot).
MAX_SEQ = 2**62
_KMSG = lazyre.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_DMESG = lazyre.compile(r"^\[\s*(?P<ts>\d+\.\d+)\]\s?(?P<msg>.*)$")
_KTIME = r"(?:\[\s*\d+\.\d+\]\s?)?"  # the kernel timestamp journald/rsyslog may keep
# A traditional syslog day is one or two digits, padded to two by a space ("May  6") or not
# ("May 6": some rsyslog templates and forwarders); the RFC 3339 header has its own pattern.
_DAY_TIME = r"\w{3} {1,2}\d{1,2} \d\d:\d\d:\d\d"
_SYSLOG = lazyre.compile(r"^" + _DAY_TIME + r" \S+ kernel: " + _KTIME + r"(?P<msg>.*)$")
_ISO_SYSLOG = lazyre.compile(r"^\d{4}-\d\d-\d\dT\S+ \S+ kernel: " + _KTIME + r"(?P<msg>.*)$")
# `journalctl -o short-full`: weekday, date, time, zone ("Fri 2026-11-27 03:14:15 UTC").
_FULL_TIME = r"[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})? [A-Za-z0-9+:_/-]{1,40}"
_JOURNAL_FULL = lazyre.compile(r"^" + _FULL_TIME + r" \S+ kernel: " + _KTIME + r"(?P<msg>.*)$")
# `journalctl -o short-unix`: seconds since the epoch ("1795749255.123456").
_UNIX_TIME = r"\d{1,12}\.\d{1,9}"
_JOURNAL_UNIX = lazyre.compile(r"^" + _UNIX_TIME + r" \S+ kernel: " + _KTIME + r"(?P<msg>.*)$")
# RFC 5424 (rsyslog's RSYSLOG_SyslogProtocol23Format): "<PRI>1 TIME HOST APP PROCID MSGID SD
# MSG". The kernel's own line has facility kern (PRI 0-7: `logger -t kernel` sends user, 13),
# app "kernel" and no structured data; rsyslog keeps the message's leading space.
_RFC5424 = lazyre.compile(r"^<[0-7]>1 \S+ \S+ kernel \S+ \S+ -(?: {1,2}|$)\ufeff?" + _KTIME
                          + r"(?P<msg>.*)$")
# dmesg's own prefixes before its timestamp: `-x` ("kern  :warn  : ", util-linux's "%-6s:%-6s: ")
# and `-r` ("<4>"). The kernel's records have facility kern; a record another program wrote
# to /dev/kmsg (root only) has its own ("user  :", "<12>") and is not the kernel's.
_DMESG_TAG = lazyre.compile(
    r"^(?:kern *:(?:emerg|alert|crit|err|warn|notice|info|debug) *: |<[0-7]>(?=\[))")
# What may stand before "NVRM: Xid" in a line the kernel wrote: nothing (a /dev/kmsg record,
# `journalctl -k -o cat`), a timestamp (dmesg's `[12.3]`, `dmesg -T`'s `[Mon Apr  6 ...]`,
# `--time-format=iso`), or a syslog header "<time> <host> kernel:" (any timestamp precision,
# the kernel's own `[12.3]` after it). Anything else is another program's text quoting an XID
# (`logger`, sshd's "Invalid user <name>", an audit record's file name): not an event, or any
# user could drain the node by logging one line. (A datagram "<3>kernel: NVRM: Xid ..." sent to
# /dev/log still forges the tag, even in a kern.* file: rsyslog takes the facility the sender
# names. /dev/kmsg, or a file written from rsyslog's kernel input alone, is the source.)
# The host holds no bracket and ends in no colon: "alice[4242]: kernel: NVRM: Xid ..." is a
# program's tag (journald's "IDENT[PID]: " as it forwards a `logger` line), not a host.
_TS = r"(?:" + _DAY_TIME + r"(?:\.\d+)?|\d{4}-\d\d-\d\dT\S+|\[[^\]]{1,64}\])"
_KERNEL_LEAD = lazyre.compile(
    rf"^(?:{_TS}\s*|(?:{_TS}\s+)?[^\s\[\]]*[^\s\[\]:]\s+kernel:\s*(?:\[[^\]]{{1,64}}\]\s*)?)?$"
)
_PID = lazyre.compile(r"^\s*pid=(?P<pid>'?<unknown>'?|\d+)\s*,")
_NAME = lazyre.compile(r"^\s*name=(?P<name>[^,]*),")
# NVLink5 XIDs (144-150) carry their own severity word after the unit name.
_NVL5_SEVERITY = lazyre.compile(r"\b(?P<sev>Nonfatal|Non-fatal|Fatal)\b")
NVLINK5_XIDS = range(144, 151)
# XID 154 (R550+) states what the GPU now needs after another XID: the text after "to" is
# None, Drain P2P, Drain and Reset, GPU Reset Required or Node Reboot Required (older drivers:
# "OS Reboot"), with NVML's nvmlGpuRecoveryAction_t number in hex before it.
RECOVERY_XID = 154
_RECOVERY_HEX = lazyre.compile(r"^(?P<hex>0x[0-9a-fA-F]{1,8})\b")
_RECOVERY_BY_NUMBER = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                       4: "drain_and_reset"}


def recovery_action(message: str) -> str | None:
    """The recovery action an XID 154 line names: none, drain_p2p, drain_and_reset, gpu_reset,
    node_reboot; "unknown" when the line is 154's but names none of them."""
    # String searches, not a backtracking pattern: the tail after the last " to " is the new
    # action, e.g. "0x1 (GPU Reset Required)" or "(None)".
    if "recovery action changed from" not in message or " to " not in message:
        return "unknown"
    tail = message[message.rindex(" to ") + 4 :].strip()
    hexm = _RECOVERY_HEX.match(tail)
    if hexm:
        tail = tail[hexm.end() :].strip()
    text = tail.strip("()").strip().lower()
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
    if hexm:
        return _RECOVERY_BY_NUMBER.get(int(hexm.group("hex"), 16), "unknown")
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
    mig: str | None = None  # "GPU-I:05 GPU-CI:01" on a MIG instance
    # Where the event sits in its source (boot id + kmsg seq, or file inode + line offset): the
    # same event read twice (a cursor that could not be saved) gets the same record id.
    key: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def strip_prefix(line: str) -> tuple[str, int | None]:
    """(message, kmsg seq or None) for one line of any supported source. A /dev/kmsg record
    user space wrote has no message of the kernel's: ""."""
    fields = kmsg_fields(line)
    if fields is not None:
        # The priority field is (facility << 3) | level. The kernel's own records carry
        # facility kern (0-7); it forces another (LOG_USER unless one is named) on every write
        # to /dev/kmsg, so root's `echo`, a privileged container or journald's ForwardToKMsg
        # relaying any user's `logger` can never pass for it (dmesg -r's "<12>", -x's "user").
        if len(fields[0]) != 1 or fields[0] not in "01234567":
            return "", int(fields[1])
        return fields[3], int(fields[1])
    tag = _DMESG_TAG.match(line)
    if tag:
        line = line[tag.end():]
        m = _DMESG.match(line)
        return (m.group("msg") if m else line), None
    for rx in (_SYSLOG, _ISO_SYSLOG, _DMESG, _JOURNAL_FULL, _JOURNAL_UNIX, _RFC5424):
        m = rx.match(line)
        if m:
            return m.group("msg"), None
    return line, None


# The driver's own line for a GPU it declares lost (osHandleGpuLost: NV_DEV_PRINTF, "NVRM: GPU
# %04x:%02x:%02x.%x: "), printed whether or not it also logs Xid 79 (a SEC_FAULT lockdown, Xid
# 110, loses the GPU without one): read as an XID 79 of its own.
_GPU_LOST = lazyre.compile(
    r"NVRM: GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]: "
    r"GPU has fallen off the bus\.?\s*$"
)
GPU_LOST_XID = 79
GPU_LOST_MESSAGE = "GPU has fallen off the bus (the driver's own line; no Xid line needed)"
# The driver's own lines for a GPU it could not initialise: RmInitAdapter's failure banner
# (NV_DEV_PRINTF, every way it fails ends there) and rm_init_adapter's after it, printed again
# on each open of the device while it fails. No Xid line comes with them, and NVML still counts
# the GPU (its handle answers NVML_ERROR_UNKNOWN): read as an event of their own, numbered
# INIT_FAILED_XID (no XID's number: NVIDIA's start at 1), which the xid check judges itself
# (gpu_init_failed), not by the catalog.
_INIT_FAILED = lazyre.compile(
    r"NVRM: GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]: "
    r"(?P<what>RmInitAdapter failed! \(0x[0-9A-Fa-f]{1,8}:0x[0-9A-Fa-f]{1,8}:\d{1,6}\)"
    r"|rm_init_adapter failed, device minor number \d{1,4})\s*$"
)
INIT_FAILED_XID = 0


def parse_line(line: str, source: str = "") -> XidEvent | None:
    """One XidEvent, or None when the line is not a well-formed XID line (or the driver's own
    line for a GPU it declares lost: an XID 79 with GPU_LOST_MESSAGE; or one for a GPU it
    could not initialise: INIT_FAILED_XID with the driver's text)."""
    line = line[:MAX_LINE]
    if "NVRM: " not in line:  # neither an Xid line nor the driver's own: most lines, at once
        return None
    msg, seq = strip_prefix(line.rstrip("\r\n"))
    if seq is not None and seq > MAX_SEQ:
        seq = None
    m = _XID.search(msg)
    if not m:
        lost = _GPU_LOST.search(msg)
        if lost and _KERNEL_LEAD.match(msg[: lost.start()]):
            return XidEvent(GPU_LOST_XID, lost.group("pci").lower(), GPU_LOST_MESSAGE, seq=seq,
                            source=source)
        init = _INIT_FAILED.search(msg) if "dapter failed" in msg else None
        if init and _KERNEL_LEAD.match(msg[: init.start()]):
            return XidEvent(INIT_FAILED_XID, init.group("pci").lower(), init.group("what"),
                            seq=seq, source=source)
        return None
    if not _KERNEL_LEAD.match(msg[: m.start()]):
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
    mig = m.group("mig").strip() or None
    return XidEvent(xid, m.group("pci").lower(), rest.strip(), pid, name, severity, seq, source,
                    recovery, mig)


# NVSwitch errors, printed by the nvidia-nvswitch driver with the switch's full PCI address:
#   nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV
#       error (First)
#   nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up
#   nvidia-nvswitch2: SXid (PCI:0000:c4:00.0): 10002, Severity 5 Engine instance 00 Sub-engine
#       instance 00                                  (a detail line of the same error)
#   nvidia-nvswitch2: SXid (PCI:0000:c4:00.0): 10002, Data {0x00000000, ...}   (likewise)
# (tests/fixtures/sxid/README.md cites where each shape was seen.) The same kernel-lead rule
# as XIDs: another program's text quoting an SXid is not one.
_SXID = lazyre.compile(
    r"nvidia-nvswitch(?P<switch>\d{1,4}): SXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (?P<sxid>\d{1,5}),(?P<rest>.*)$"
)
_SXID_SEVERITY = lazyre.compile(r"(?i)^\s*(?P<sev>Fatal|Non-fatal|Nonfatal)\b")  # IGNORECASE
_SXID_DETAIL = lazyre.compile(r"^\s*(?:Severity \d+\b|Data \{)")


@dataclass(frozen=True)
class SxidEvent:
    sxid: int
    switch: int  # N of nvidia-nvswitchN
    pci: str  # the switch's address as printed, lower case
    message: str
    severity: str | None = None  # "fatal" / "nonfatal" as the line says it, else None
    detail: bool = False  # a "Severity N Engine instance" / "Data {...}" line of an error
    seq: int | None = None
    source: str = ""
    key: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def parse_sxid_line(line: str, source: str = "") -> SxidEvent | None:
    """One SxidEvent, or None when the line is not a well-formed NVSwitch SXid line."""
    line = line[:MAX_LINE]
    if "SXid (" not in line:
        return None
    msg, seq = strip_prefix(line.rstrip("\r\n"))
    if seq is not None and seq > MAX_SEQ:
        seq = None
    m = _SXID.search(msg)
    if not m or not _KERNEL_LEAD.match(msg[: m.start()]):
        return None
    rest = m.group("rest")
    sm = _SXID_SEVERITY.match(rest)
    severity = None
    if sm:
        severity = "fatal" if sm.group("sev").lower() == "fatal" else "nonfatal"
        rest = rest[sm.end():].lstrip(" ,")
    return SxidEvent(int(m.group("sxid")), int(m.group("switch")), m.group("pci").lower(),
                     rest.strip()[:200], severity, bool(_SXID_DETAIL.match(rest)), seq, source)


def parse_text(text: str, source: str = "", parse: Callable = parse_line) -> list:
    """Every event `parse` (parse_line: XIDs; parse_sxid_line: NVSwitch SXids) finds."""
    events = []
    for line in text.splitlines():
        try:
            ev = parse(line, source)
        except Exception:  # noqa: BLE001 - a parser bug must not lose the other lines
            ev = None
        if ev:
            events.append(ev)
    return events


def boot_id(root: StrPath) -> str:
    """This boot's id; where /proc/sys/kernel/random/boot_id cannot be read (a container's
    /proc, a snapshot), "btime:N" from /proc/stat (when this boot began, in seconds: the same
    for the whole boot unless the clock is stepped, and then a new "boot" costs one read of
    the ring buffer again); "" when neither can be read."""
    try:
        return read_bounded(os.path.join(root, "proc/sys/kernel/random/boot_id"), 4096).decode(
            "ascii", "replace").strip()
    except OSError:
        pass
    try:
        text = read_bounded(os.path.join(root, "proc/stat"), 1 << 20).decode("ascii", "replace")
    except OSError:
        return ""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "btime" and value.strip().isdigit():
            return f"btime:{int(value)}"
    return ""


# /dev/kmsg's device number (major 1, "mem"; minor 11): fixed by the kernel (devices.txt).
KMSG_DEVICE = (1, 11)


def _is_kmsg_device(st: os.stat_result) -> bool:
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) == KMSG_DEVICE


def _open_device(path: StrPath) -> int:
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


@dataclass
class _RingRead:
    text: str  # the first line of each record newer than the cursor, oldest first
    newest: int  # the newest sequence number read, old records included (-1: none)
    cut: bool  # stopped at a bound before the buffer ran dry
    foreign: int = 0  # a regular file standing in: its lines that are no kmsg record
    first_foreign: str = ""


def _read_kmsg_device(path: StrPath, after_seq: int, since_usec: float | None = None
                      ) -> _RingRead:
    """Drain the live ring buffer without blocking (each read() returns one record).

    A reader of /dev/kmsg always starts at the buffer's oldest record, so every run reads
    again what earlier runs judged. Only records newer than `after_seq` are kept, and only
    they count towards MAX_READ: a buffer holding more than MAX_READ of records already judged
    (log_buf_len=32M on a chatty node) would otherwise stop there every run and never reach a
    new XID. A record with no sequence number (not the kernel's format) counts as new, so a
    device that never runs dry (a kernel logging faster than we read) stops at MAX_READ; the
    rest is read next run, from the cursor. MAX_RING bounds the whole read whatever it holds.
    With `since_usec` (a cursor being rebuilt), records logged before then count as judged."""
    records = []
    new_bytes = total = 0
    newest = -1
    fd = _open_device(path)
    overrun = 0
    try:
        while new_bytes < MAX_READ and total < MAX_RING:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while we read: the gap is seen
                    overrun += 1  # below, in the sequence numbers
                    if overrun < MAX_OVERRUNS:
                        continue
                    raise OSError(errno.EPIPE, f"overwritten before each of {overrun} reads in "
                                  "a row (a kernel logging faster than it is read); read "
                                  "again next run") from None
                if exc.errno == errno.EAGAIN:
                    break
                raise
            overrun = 0
            if not chunk:
                break
            total += len(chunk)
            line = chunk.decode("utf-8", "replace").split("\n", 1)[0]
            record = _seq_usec(line)
            if record is not None:
                newest = max(newest, record[0])
                if not _newer(*record, after_seq, since_usec):
                    continue
                records.append(line)
            new_bytes += len(chunk)
        else:
            return _RingRead("\n".join(records), newest, True)
    finally:
        os.close(fd)
    return _RingRead("\n".join(records), newest, False)


# EPIPEs in a row, with no record read between, before a read of /dev/kmsg gives up.
MAX_OVERRUNS = 1000


def _missed_records(after_seq: int, seqs: list[int]) -> tuple[int, int, int]:
    """Records the kernel overwrote before they were read: (how many, first seq, last seq)
    between the cursor and the newest record read. The kernel numbers every record it logs,
    one after another, so a jump is a loss (an EPIPE from /dev/kmsg is the same loss)."""
    missed, first, last, prev = 0, -1, -1, after_seq
    for seq in sorted(set(s for s in seqs if s > after_seq)):
        if seq > prev + 1:
            missed += seq - prev - 1
            first = prev + 1 if first < 0 else first
            last = seq - 1
        prev = seq
    return missed, first, last


@dataclass
class XidRead:
    events: list  # new since the cursor
    errors: list[str]  # sources that could not be read
    cursor: dict


# At most this much of a file source (or of new ring-buffer records) is read per run; the rest
# waits for the next run, so a first look at a multi-gigabyte kern.log costs bounded time and
# memory.
MAX_READ = 16 * 2**20
# At most this much of /dev/kmsg per run, records already judged included: far above any real
# log_buf_len, there only so no device can be read for ever.
MAX_RING = 256 * 2**20
# Bytes of a file's head kept in the cursor: a log rotated by copytruncate and written past
# the old offset before the next run has a different head, and is read from its start.
HEAD_BYTES = 64


def _fingerprint(fd: int) -> str:
    return os.pread(fd, HEAD_BYTES, 0).hex()


def _valid_seq(value) -> int | None:
    """A stored kmsg sequence number, or None when the cursor holds something else."""
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= MAX_SEQ:
        return None
    return value


class _NamedIds:
    """The ids of the users (or groups) named in `[xid] log_writers`, looked up when first
    asked: only a source, or a directory on its path, that root does not own or that its group
    may write asks (a kern.log as syslog:adm in a root:syslog 0775 /var/log). A healthy node's
    /dev/kmsg on root's /dev never does, and every job start saved the lookups (pwd and grp,
    and NSS reading /etc/passwd and /etc/group: about 1.3 M instructions of a 38 M bare
    start). Names this node does not know are none."""

    def __init__(self, names, group: bool) -> None:
        self._names = [str(n) for n in names] if isinstance(names, (list, tuple)) else []
        self._group = group
        self._ids: frozenset[int] | None = None

    def __contains__(self, ident: object) -> bool:
        if self._ids is None:
            self._ids = self._look_up()
        return ident in self._ids

    def _look_up(self) -> frozenset[int]:
        if self._group:
            import grp

            find, attr = grp.getgrnam, "gr_gid"
        else:
            import pwd

            find, attr = pwd.getpwnam, "pw_uid"  # type: ignore[assignment]
        ids = set()
        for name in self._names:
            try:
                ids.add(getattr(find(name), attr))
            except (KeyError, ValueError):
                pass
        return frozenset(ids)


def log_writers(names) -> tuple[Container[int], Container[int]]:
    """The uids and gids `[xid] log_writers` names (each name as a user and as a group; names
    this node does not know are none), each looked up when first asked (_NamedIds)."""
    return _NamedIds(names, group=False), _NamedIds(names, group=True)


def source_refusal(st: os.stat_result, path: StrPath, source: str,
                   writers: tuple[Container[int], Container[int]]) -> str:
    """Why a kernel log source is not evidence, or "": a file (a kern.log, a saved ring
    buffer) must be one only root or the logging daemon ([xid] log_writers) could write, and
    so must every directory on its path (durable.trust_refusal): anyone else could forge the
    kernel's own XID 79 line in it and drain the node. A character device is the kernel's
    (no one else can make one); only its name must be one no one else could swap."""
    from rsc_health.durable import path_refusal, trust_refusal

    uids, gids = writers
    if stat.S_ISCHR(st.st_mode):
        why = path_refusal(path, source, uids=uids, gids=gids)
    else:
        why = trust_refusal(st, path, source, uids=uids, gids=gids)
    if not why:
        return ""
    return (f"{why}: not read (only a file no one but root or [xid] log_writers can write "
            "is evidence of an XID); its lines wait, unconsumed, until it is fixed")


def read_new_events(
    root: StrPath, sources: list[str], cursor: dict, *, file_backlog: bool = True,
    parse: Callable = parse_line, writers: tuple[Container[int], Container[int]] = (
        frozenset(), frozenset()),
) -> XidRead:
    """Events not seen before, and the cursor to save once they have been judged.

    A source must be /dev/kmsg (a character device) or a regular file: a FIFO, socket or
    directory is refused (it could block or never end), and files are opened non-blocking.

    A cursor that cannot be trusted is rebuilt, with one warning, and judges what the kernel
    logged since the cursor was last written (its mtime, less LOST_SLACK_S, the span of one
    run): the XID logged just before the sweep that found it is judged, nothing judged long
    ago is judged again (a repaired node drained again for its old XID 79). That is the same
    whether the cursor is unreadable (load_cursor's {"lost": ...}) or valid JSON but wrong (a
    sequence number that is not one, or past the ring buffer's newest record; a file offset
    that is not one, or past the end of the same file). The ring buffer says when each record
    was logged (microseconds since boot: the mtime is read against /proc/uptime); a kernel log
    file says it in each line's syslog header. With no way to tell, the ring buffer is judged
    whole (it holds this boot only: an XID judged twice costs less than one never judged) and
    a file is read from its end (it holds earlier boots).

    `parse` picks the events (parse_line: GPU XIDs; parse_sxid_line: NVSwitch SXids); each
    kind has its own cursor, so a stage that judges one never consumes the other's lines.
    A source someone other than root or `writers` (log_writers()) could write is refused
    (source_refusal), said, and its cursor entry kept."""
    boot = boot_id(root)
    new_cursor: dict = {"boot_id": boot, "kmsg_seq": -1, "files": {}}
    same_boot = bool(boot) and cursor.get("boot_id") == boot
    errors: list[str] = []
    lost = cursor.get("lost")
    # When the cursor was last written (wall clock): what was logged since is judged when it
    # cannot be trusted.
    written = _number(cursor.get("lost_mtime") if isinstance(lost, str) else cursor.get("mtime"))
    last_seq = _valid_seq(cursor.get("kmsg_seq", -1)) if same_boot else -1
    since_usec: float | None = None
    # A boot id that is not text is no earlier boot's: the cursor is wrong.
    bad_boot = "boot_id" in cursor and not isinstance(cursor["boot_id"], str)
    rebuild = isinstance(lost, str) or bad_boot or last_seq is None  # ring records by time
    if isinstance(lost, str):
        errors.append(f"XID cursor unreadable ({lost[:80]}); rebuilt: "
                      + _rebuilt(root, written, files=True))
    elif bad_boot:
        errors.append(f"corrupt XID cursor (boot_id={str(cursor['boot_id'])[:40]!r}) "
                      "discarded: " + _rebuilt(root, written))
    elif last_seq is None:
        errors.append(f"corrupt XID cursor (kmsg_seq={str(cursor.get('kmsg_seq'))[:40]!r}) "
                      "discarded: " + _rebuilt(root, written))
    if rebuild:
        last_seq = -1
        since_usec = _usec_since_boot(root, written)
    new_cursor["kmsg_seq"] = last_seq
    events: list = []
    logged: dict = {}  # file events' keys -> when their lines were logged
    files = cursor.get("files", {})
    absent = []
    for source in sources:
        path = pure(os.path.join(root, source.lstrip("/")))  # as str(Path(root) / source)
        try:
            st = os.stat(path)
        except OSError:
            # An absent source is normal (no kern.log on journald-only nodes). One that was
            # there keeps its entry: logrotate without `create` leaves no kern.log until the
            # next message, and the file then made is the old one's successor (_rotated).
            kept = _file_entry(files, source)
            if kept:
                new_cursor["files"][source] = kept
            else:  # never seen: a rotated file waiting for its successor is not absent
                absent.append(source)
            continue
        kind = st.st_mode
        if not (stat.S_ISCHR(kind) or stat.S_ISREG(kind)):
            errors.append(f"{source}: not a regular file or /dev/kmsg; not read")
            continue
        if stat.S_ISCHR(kind) and not _is_kmsg_device(st):
            # /dev/null bound over a container's /dev/kmsg, a link to /dev/console (kind's
            # node image): read as a ring buffer, it was an empty one, healthy for ever.
            errors.append(f"{source}: character device {os.major(st.st_rdev)}:"
                          f"{os.minor(st.st_rdev)}, not the kernel's log (/dev/kmsg is "
                          f"{KMSG_DEVICE[0]}:{KMSG_DEVICE[1]}): not read; no XID can be seen "
                          "from it (give the checker the host's /dev/kmsg, or a kernel log "
                          "file)")
            continue
        refused = source_refusal(st, path, source, writers)
        if refused:
            errors.append(refused)
            kept = _file_entry(files, source)
            if kept:  # where it was: what it logs meanwhile is read once it is trusted
                new_cursor["files"][source] = kept
            continue
        try:
            if stat.S_ISCHR(kind) or source == "/dev/kmsg":
                ring = _read_ring(path, last_seq, since_usec if rebuild else None)
                if not rebuild and same_boot and last_seq > ring.newest >= 0:
                    errors.append(f"XID cursor (seq {last_seq}) is past the ring buffer's "
                                  f"newest record ({ring.newest}); discarded: "
                                  + _rebuilt(root, written))
                    rebuild, last_seq = True, -1
                    since_usec = _usec_since_boot(root, written)
                    ring = _read_ring(path, last_seq, since_usec)
                if ring.newest < 0 and ring.foreign:
                    errors.append(f"{source}: a regular file standing in for the ring buffer "
                                  f"holds no /dev/kmsg record (\"prio,seq,usec,flags;\"), "
                                  f"only {ring.foreign} other line(s) (the first: "
                                  f"{ring.first_foreign!r}): none is read; a saved dmesg or "
                                  "syslog belongs in a file source of its own")
                if ring.cut:
                    errors.append(f"{source}: stopped after {MAX_READ >> 20} MiB of new "
                                  "records (a kernel logging faster than they are read?); "
                                  "the rest is read next run")
                if same_boot and not rebuild and last_seq >= 0:
                    seqs = [s for s in (_seq_of(ln) for ln in ring.text.splitlines())
                            if s is not None]
                    missed, first, last = _missed_records(last_seq, seqs)
                    if missed:
                        # Said, not hidden: an XID among them was never judged. The cure is
                        # the node's (a larger log_buf_len, or rsyslog's kern.log as the source
                        # in place of the ring buffer: a file does not overrun).
                        errors.append(f"{source}: {missed} kernel log record(s) (seq {first}.."
                                      f"{last}) were overwritten before they were read; an XID "
                                      "among them went unseen (raise log_buf_len, or read "
                                      "kern.log instead)")
                again = _valid_seq(cursor.get("kmsg_seq"))
                if not boot and not rebuild and again is not None and again >= 0:
                    seen = sum(1 for s in (_seq_of(ln) for ln in ring.text.splitlines())
                               if s is not None and s <= again)
                    if seen:
                        errors.append(f"{source}: this boot cannot be told (no /proc/sys/kernel"
                                      "/random/boot_id, no btime in /proc/stat): "
                                      f"{seen} record(s) a run read before are judged again")
                for e in parse_text(ring.text, source, parse):
                    if e.seq is not None:
                        events.append(_keyed(e, f"{boot}:kmsg:{e.seq}"))
                new_cursor["kmsg_seq"] = max(last_seq, ring.newest)
            else:
                got = _read_log_file(path, source, _file_entry(files, source),
                                     backlog=file_backlog, parse=parse,
                                     lost=isinstance(lost, str), written=written,
                                 writers=writers)
                events.extend(got.events)
                errors.extend(got.errors)
                logged.update(got.logged or {})
                new_cursor["files"][source] = got.entry
        except OSError as exc:
            errors.append(f"{source}: {exc.strerror or exc}")
            kept = _file_entry(files, source)
            if kept and source not in new_cursor["files"]:
                # Nothing of it was judged: its next read goes on from where this one began.
                new_cursor["files"][source] = kept
    if len(absent) == len(sources):
        # Not one source to read ([xid] sources empty, or every name a typo): no XID can be
        # seen, and a node blind to an XID 79 must not read as healthy (helper-105).
        errors.append("no kernel log to read: " + (
            f"none of [xid] sources exists ({', '.join(absent)[:200]})" if absent
            else "[xid] sources is empty") + "; no XID can be seen")
    if logged:
        forged = _not_the_kernels(root, [e for e in events if logged.get(e.key) is not None],
                                  logged, parse)
        for ev in forged:
            errors.append(f"{ev.source}: an XID line ({_ident(ev)[1]} on {ev.pci}) logged at "
                          + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(logged[ev.key]))
                          + " that the kernel's ring buffer, which holds that time, never "
                          "logged: not the kernel's (another program wrote it to the syslog "
                          "socket?); not judged")
        gone = {ev.key for ev in forged}
        events = [e for e in events if e.key not in gone]
    return XidRead(events, errors, new_cursor)


# Seconds between a kernel log file's header time and the ring buffer's oldest record before
# the ring is taken to hold that time (rsyslog's delay), and the share of the uptime added to
# them: a record's time is the kernel's local clock, which is not NTP's and drifts from the
# wall clock (`dmesg -T`'s known error: tens of ppm, minutes over months of uptime).
CORROBORATE_SLACK_S = 120.0
CORROBORATE_DRIFT = 5e-4


def _ident(ev) -> tuple:
    code = getattr(ev, "xid", None)
    if code is None:
        code = getattr(ev, "sxid", None)
    return type(ev).__name__, code, str(ev.pci).lower().split(".")[0]


def _not_the_kernels(root: StrPath, events: list, logged: dict, parse: Callable) -> list:
    """The file events the ring buffer shows the kernel never logged: each line's header time
    (`logged`) lies in the span the ring buffer holds (its oldest record well before it, by
    CORROBORATE_SLACK_S and CORROBORATE_DRIFT of the uptime; the buffer read whole), and no
    record in it is the same event (the same XID or SXid on the same device). Any user can put
    a line into a kern.* file that reads as the kernel's own (rsyslog takes the facility a
    /dev/log datagram names); no one but the kernel writes the ring buffer. Where the ring
    cannot say (no /dev/kmsg to read, no /proc/uptime, a line older than the buffer: an
    earlier boot, an overrun), nothing is refused."""
    if not events:
        return []
    path = pure(os.path.join(root, "dev/kmsg"))
    try:
        st = os.stat(path)
        if not ((stat.S_ISCHR(st.st_mode) and _is_kmsg_device(st))
                or (stat.S_ISREG(st.st_mode) and st.st_size <= MAX_READ)):
            return []
        uptime = float(read_bounded(os.path.join(root, "proc/uptime"), 4096).split()[0])
        ring = _read_ring(path, -1, None)
    except (OSError, ValueError, IndexError):
        return []
    if ring.cut:
        return []
    booted = time.time() - uptime
    slack = CORROBORATE_SLACK_S + CORROBORATE_DRIFT * max(uptime, 0.0)
    oldest = None
    seen = set()  # what the ring holds: (kind, code, device)
    for line in ring.text.splitlines():
        record = _seq_usec(line)
        if record is None:
            continue
        when = booted + record[1] / 1e6
        oldest = when if oldest is None else min(oldest, when)
        ev = _parse_quietly(line, "", parse)
        if ev is not None:
            seen.add(_ident(ev))
    if oldest is None:
        return []
    # Before the ring's oldest record (with slack): an earlier boot, an overrun: it cannot say.
    return [ev for ev in events
            if logged[ev.key] - slack >= oldest and _ident(ev) not in seen]


def _number(value) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) else value


def _rebuilt(root: StrPath, written: float | None, *, files: bool = False) -> str:
    """How a cursor that cannot be trusted is rebuilt, in words."""
    when = ("since its last write ("
            + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(written)) + ")"
            if written is not None else "")
    ring = ("the ring buffer" + (f" is judged {when}" if _usec_since_boot(root, written)
                                 is not None else " is judged whole (its last write cannot be "
                                 "told against /proc/uptime)"))
    if not files:
        return ring
    return ring + ("; kernel log files " + (f"{when} by their lines' headers" if written
                                            is not None else "from their end"))


def _read_ring(path: str, after_seq: int, since_usec: float | None) -> _RingRead:
    """The ring buffer's records newer than `after_seq` (and, with `since_usec`, logged since
    then): the live device, or a regular file standing in for it (a snapshot, a test)."""
    if stat.S_ISCHR(os.stat(path).st_mode):
        return _read_kmsg_device(path, after_seq, since_usec)
    text = _read_file(path, 0, MAX_READ)[0].decode("utf-8", "replace")
    kept, newest, foreign, first = [], -1, 0, ""
    for line in text.splitlines():
        record = _seq_usec(line)
        if record is None:
            if line.strip() and not line.startswith(" "):  # " KEY=value": a record's own
                foreign += 1
                first = first or line[:120]
            continue
        seq, usec = record
        newest = max(newest, seq)
        if _newer(seq, usec, after_seq, since_usec):
            kept.append(line)
    return _RingRead("\n".join(kept), newest, False, foreign, first)


def _newer(seq: int, usec: int, after_seq: int, since_usec: float | None) -> bool:
    return seq > after_seq and (since_usec is None or usec >= since_usec)


@dataclass
class _FileRead:
    events: list
    errors: list[str]
    entry: dict  # the file's cursor: inode, offset, head (+ skip inside an over-long line)
    logged: dict | None = None  # event key -> when its line was logged (its syslog header)


def _read_log_file(path: str, source: str, prev, *, backlog: bool, lost: bool,
                   written: float | None, parse: Callable | None = None,
                   writers: tuple[Container[int], Container[int]] | None = None) -> _FileRead:
    """New events of one kernel log file, from its cursor entry `prev` (None: first sight).

    At most MAX_READ bytes a run. A backlog longer than that is said (the bytes left) and read
    on next run. A line longer than that (no newline in a whole read) is judged by its first
    MAX_LINE bytes, said, and the cursor moves past it ("skip": the rest of the line, read on
    a later run, is dropped up to its newline): it never pins the cursor."""
    errors: list[str] = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        head = _fingerprint(fd)
        offset, skip, wrong, rotated = _file_start(st, head, prev, backlog)
        grew = not (lost or wrong or rotated)  # by its inode, head and size: only appended to
        if lost or wrong:
            if wrong:
                errors.append(f"{source}: XID cursor {wrong}; discarded: judging its lines "
                              + ("logged since the cursor's last write" if written is not None
                                 else "from its end (the cursor's last write cannot be told)"))
            offset, skip = _offset_since(fd, st.st_size, written, source, errors), False
        elif rotated:
            # Rewritten whole rather than rotated (`dmesg > file` once the ring has wrapped):
            # what it holds up to the last bytes the cursor read was read.
            resumed = _resync(fd, st.st_size, prev)
            if resumed is not None:
                offset, skip, rotated = resumed, False, False
        pre = min(offset, TAIL_BYTES)
        window = os.pread(fd, MAX_READ + pre, offset - pre)
        want = _tail_bytes(prev) if grew else None
        if want is not None and not window[:pre].endswith(want):
            # The same inode and head, no shorter, yet not the bytes the cursor read up to: the
            # file was rewritten in place, not appended to (a `dmesg > file` dump after a
            # reboot starts with the same "Linux version" banner; the new boot's is longer).
            # Read from the offset, the new lines before it were never read. It goes on after
            # the cursor's lines where it still holds them, else is read from its start.
            resumed = _resync(fd, st.st_size, prev)
            offset, skip, rotated = (resumed, False, False) if resumed is not None else (
                0, False, True)
            pre = min(offset, TAIL_BYTES)
            window = os.pread(fd, MAX_READ + pre, offset - pre)
    finally:
        os.close(fd)
    read_before, window = window[:pre], window[pre:]
    entry = {"inode": st.st_ino, "offset": offset, "head": head}
    before = (_rotated(path, source, prev, parse, writers, st.st_ino, written)
              if rotated and not lost else _FileRead([], [], {}))
    errors.extend(before.errors)
    got = _read_window(window, st, head, offset, skip, source, parse, errors, entry)
    tail = _tail(read_before + window[: got.entry["offset"] - offset])
    if tail:
        got.entry["tail"] = tail
    return _FileRead(before.events + got.events, got.errors, got.entry,
                     {**(before.logged or {}), **(got.logged or {})})


# Bytes of a file kept in its cursor entry ("tail", in hex): the whole lines before the offset,
# up to this many. A file rewritten whole (a `dmesg > file` dump after the ring buffer wraps)
# that holds them goes on after them: what comes before was read (or overwritten unread).
TAIL_BYTES = 256
# A tail shorter than this ("\n", a blank line) could be found anywhere: never looked for.
MIN_TAIL = 24


def _tail(consumed: bytes) -> str:
    """The cursor's "tail": the last whole lines of `consumed` (the bytes up to the offset),
    at most TAIL_BYTES; "" when they are not worth looking for."""
    tail = consumed[-TAIL_BYTES:]
    if len(consumed) > TAIL_BYTES:
        nl = tail.find(b"\n")
        if 0 <= nl < len(tail) - 1:
            tail = tail[nl + 1:]
    return tail.hex() if len(tail.strip()) >= MIN_TAIL else ""


def _tail_bytes(prev) -> bytes | None:
    """The cursor entry's "tail" (the bytes it read up to its offset) when it is one _tail
    wrote, else None."""
    tail = prev.get("tail") if isinstance(prev, dict) else None
    if (not isinstance(tail, str) or not tail or len(tail) > 2 * TAIL_BYTES or len(tail) % 2
            or not all(c in "0123456789abcdef" for c in tail)):
        return None
    return bytes.fromhex(tail)


def _resync(fd: int, size: int, prev) -> int | None:
    """Where a file that is no longer the one its cursor read (another head, shorter, another
    inode) goes on: after the first place its last MAX_READ bytes hold, from a line's start,
    the cursor's tail (the lines it last read), or the longest run of its last lines still
    there (a ring buffer that wrapped past the first of them); None when they hold not even
    its last line (rotated: a new log, read from its start)."""
    want = _tail_bytes(prev)
    if want is None or not want.endswith(b"\n"):
        return None
    start = max(0, size - MAX_READ)
    data = os.pread(fd, MAX_READ, start)
    while len(want.strip()) >= MIN_TAIL:
        if start == 0 and data.startswith(want):
            return len(want)
        at = data.find(b"\n" + want)
        if at >= 0:
            return start + at + 1 + len(want)
        nl = want.find(b"\n")
        if nl < 0 or nl == len(want) - 1:
            break
        want = want[nl + 1:]
    return None


def _read_window(window: bytes, st, head: str, offset: int, skip: bool, source: str,
                 parse: Callable | None, errors: list[str], entry: dict) -> _FileRead:
    pos, data = offset, window
    if skip:
        nl = data.find(b"\n")
        if nl < 0:  # still inside the over-long line
            entry.update(offset=offset + len(data), skip=True)
            return _FileRead([], errors, entry)
        pos, data = offset + nl + 1, data[nl + 1:]
    events: list = []
    end = data.rfind(b"\n") + 1  # only whole lines; a line still being written waits
    if end == 0 and not skip and len(window) == MAX_READ:
        ev = _parse_quietly(data[:MAX_LINE].decode("utf-8", "replace"), source, parse)
        if ev is not None:
            events.append(_keyed(ev, _file_key(st.st_ino, head, pos)))
        errors.append(f"{source}: a line longer than {MAX_READ >> 20} MiB at byte {pos}: "
                      f"judged by its first {MAX_LINE} bytes, the rest skipped")
        entry.update(offset=offset + len(window), skip=True)
        return _FileRead(events, errors, entry)
    scan = _scan(data[:end], pos, st, head, source, parse)
    events, logged, pos = scan.events, scan.logged, scan.pos
    errors.extend(_shape_errors(source, scan, parse))
    entry["offset"] = pos
    left = st.st_size - pos
    if len(window) == MAX_READ and left > 0:
        errors.append(f"{source}: {left} bytes not read yet (a run reads {MAX_READ >> 20} MiB); "
                      "read next run: an XID among them is judged then")
    return _FileRead(events, errors, entry, logged)


# The head of a line in each kernel log format this reader knows, whoever wrote the line
# (the kernel-lead rule, not this, tells the kernel's own XID line from another program's):
# /dev/kmsg's record; dmesg -x's "kern  :warn  : " and -r's "<4>["; RFC 5424's "<PRI>1 TIME
# HOST APP PROCID MSGID"; a bracketed time (dmesg, -T, journalctl -o short-monotonic); RFC
# 3339 (rsyslog, short-iso, dmesg --time-format=iso); the traditional "Nov 27 03:14:15 host"
# (short, short-precise); short-full's "Fri 2026-11-27 03:14:15 UTC host"; short-unix.
_KNOWN_HEAD = lazyre.compile(
    r"^(?:\d+,\d+,\d+,[^;]*;|[a-z0-9]{2,8} *:[a-z]{3,6} *: |<\d{1,3}>\[|<\d{1,3}>1 \S+ \S+ \S+ "
    r"\S+ \S+ |\[[^\]]{1,64}\]|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\S* \S|" + _DAY_TIME
    + r"(?:\.\d+)? \S+ \S|" + _FULL_TIME + r" \S+ \S|\d{9,12}\.\d{6} \S+ \S)")
# Text that names an event of each kind: such a line in no format this reader knows is said.
_XID_MARKS = ("NVRM: Xid", "GPU has fallen off the bus")
_SXID_MARKS = ("SXid (",)
# How a file source may be written for its lines to be read, in words.
_FORMATS = ("a file source must give each line a header this reader knows: syslog "
            "(traditional, RFC 3339, RFC 5424), journalctl -o short, short-iso[-precise], "
            "short-full, short-unix, short-precise or short-monotonic, dmesg (plain, -T, -x, "
            "-r, --time-format=iso); or read /dev/kmsg")


@dataclass
class _Scan:
    events: list
    logged: dict  # event key -> when its line was logged (its header)
    pos: int  # the offset after the last line read
    lines: int = 0  # lines that are not blank
    known: int = 0  # of them, lines in a format this reader knows (or events)
    first: str = ""  # the first line in no format it knows
    strange: int = 0  # lines naming an event in no format it knows
    strange_first: str = ""


def _scan(data: bytes, pos: int, st, head: str, source: str, parse: Callable | None) -> _Scan:
    """The events in `data` (whole lines of a kernel log file, from byte `pos`), keyed where
    they sit, and what the lines' format says: whether any is in one this reader knows, and
    the lines naming an event that are in none (never read as events: said)."""
    scan = _Scan([], {}, pos)
    now = time.time()
    marks = _SXID_MARKS if parse is parse_sxid_line else _XID_MARKS
    for raw in data.split(b"\n")[:-1]:
        line = raw.decode("utf-8", "replace")
        ev = _parse_quietly(line, source, parse)
        if ev is not None:
            ev = _keyed(ev, _file_key(st.st_ino, head, scan.pos))
            scan.events.append(ev)
            scan.logged[ev.key] = logged_at(line[:64], now)
            scan.lines += 1
            scan.known += 1
        elif line.strip():
            scan.lines += 1
            marked = marks[0] in line or (len(marks) > 1 and marks[1] in line)
            if scan.known == 0 or marked:  # else nothing more to learn from its format
                if _KNOWN_HEAD.match(line):
                    scan.known += 1
                else:
                    scan.first = scan.first or line[:120]
                    if marked:
                        scan.strange += 1
                        scan.strange_first = scan.strange_first or line[:200]
        scan.pos += len(raw) + 1
    return scan


def _shape_errors(source: str, scan: _Scan, parse: Callable | None) -> list[str]:
    """What the format of the lines read says: a line naming an event in no format this reader
    knows (not read: an event lost), or no line at all in one (every XID there is lost)."""
    what = "an SXid" if parse is parse_sxid_line else "an XID"
    if scan.strange:
        return [f"{source}: {scan.strange} line(s) naming {what} in no kernel log format this "
                f"reader knows, not judged (the first: {scan.strange_first!r}); " + _FORMATS]
    if scan.lines and not scan.known:
        return [f"{source}: none of its {scan.lines} new line(s) is in a kernel log format "
                f"this reader knows (the first: {scan.first!r}): {what} among them would go "
                "unseen; " + _FORMATS]
    return []


def _parse_quietly(line: str, source: str, parse: Callable | None = None):
    try:
        return (parse or parse_line)(line, source)
    except Exception:  # noqa: BLE001 - a parser bug must not lose the rest
        return None


def _file_entry(files, source: str):
    """A file's cursor entry: None when the cursor has none (first sight of the file), and
    False for one that is there but is not an object (nor are the cursor's "files")."""
    if not isinstance(files, dict):
        return False
    if source not in files:
        return None
    return files[source] if isinstance(files[source], dict) else False


def _is_head(value) -> bool:
    """Whether a cursor's "head" is one _fingerprint wrote: up to HEAD_BYTES bytes, in hex."""
    if not isinstance(value, str) or len(value) > 2 * HEAD_BYTES or len(value) % 2:
        return False
    return all(c in "0123456789abcdef" for c in value)


def _file_start(st, head: str, prev, backlog: bool) -> tuple[int, bool, str | None, bool]:
    """(offset to read from, whether it is inside an over-long line, what is wrong with the
    cursor entry or None, whether the file is a rotated one's successor). A rotated file
    (another inode; or shorter than the offset, or a different head, as copytruncate leaves
    it) is a new log: read from its start, once its predecessor's tail is read (_rotated). An
    offset past the end of the same file (same inode, same head) is no rotation: the cursor is
    wrong, and so is one that is not a byte offset."""
    if prev is None:
        # First sight of this file: what it already holds is history unless backlog says not.
        return (0 if backlog else st.st_size), False, None, False
    if not isinstance(prev, dict):
        return 0, False, "entry is not one this code wrote", False
    offset = prev.get("offset", 0)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        return 0, False, f"offset {str(offset)[:40]!r} is not a byte offset", False
    old_head = prev.get("head")
    if old_head is not None and not _is_head(old_head):
        return 0, False, f"head {str(old_head)[:40]!r} is not one this code wrote", False
    if prev.get("inode") != st.st_ino:
        return 0, False, None, True
    same_head = old_head == head
    if st.st_size < offset:
        if same_head and len(head) == 2 * HEAD_BYTES:
            return 0, False, (f"offset {offset} is past the end ({st.st_size} bytes) of the "
                              "same file"), False
        return 0, False, None, True
    # A file that only grew starts with the head it had (all of it, when it was shorter than
    # HEAD_BYTES); one that does not was rotated, whatever its offset.
    if isinstance(old_head, str) and not head.startswith(old_head):
        return 0, False, None, True
    return offset, prev.get("skip") is True, None, False


# Compressed or otherwise not a plain log: never a rotated predecessor read here.
_PACKED = (".gz", ".xz", ".bz2", ".zst", ".lz4", ".z", ".zip")
# At most this many names in a log's directory are looked at for its rotated predecessor.
MAX_SIBLINGS = 4096


# A rotated generation's name after the log's own: kern.log.1, kern.log-20261127,
# kern.log.2026-11-27 (digits and separators; not kern.log.bak, an operator's copy).
_GENERATION = lazyre.compile(r"^[._-][0-9][0-9._-]*$")
# At most this many generations rotated away between two runs (besides the cursor's) are read.
MAX_GENERATIONS = 4


def _rotated(path: str, source: str, prev: dict, parse: Callable | None, writers,
             current: int = -1, written: float | None = None) -> _FileRead:
    """The lines the rotated predecessor of `path` took after the cursor `prev` last read it
    and before the rotation: logrotate renamed it (kern.log.1, kern.log-20261127: the cursor's
    inode) or copied it before truncating (copytruncate: another inode, the cursor's head).
    Read from the cursor's offset, whole lines, at most MAX_READ. None found (compressed at
    rotation, or removed): said, as an XID among those lines went unseen. Then every
    generation rotated away since (_between: a log rotated twice between two runs), whole.
    `current`: the inode `path` now names; `written`: when the cursor was last saved."""
    inode, offset, head = prev.get("inode"), prev.get("offset", 0), prev.get("head")
    if not isinstance(head, str):
        head = ""
    siblings = []
    packed = []  # compressed generations: never read, but one rotated away since is said
    base = os.path.basename(path)
    try:
        with os.scandir(os.path.dirname(path) or ".") as it:
            for n, entry in enumerate(it):
                name = entry.name
                if n >= MAX_SIBLINGS:
                    break
                if (len(name) <= len(base) or not name.startswith(base)
                        or name[len(base)] not in ".-_"):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if name.lower().endswith(_PACKED):
                    packed.append((st, pure(entry.path)))
                else:
                    siblings.append((st, pure(entry.path)))
    except OSError:
        pass
    candidates = sorted((st.st_ino != inode, -st.st_mtime, p) for st, p in siblings
                        if st.st_size >= offset)
    refused = ""
    found: tuple[_FileRead, os.stat_result] | None = None
    for _, _, rotated in candidates[:8]:  # the old inode first, then newest copies
        try:
            fd = os.open(rotated, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            got_head = _fingerprint(fd)
            if not (head and got_head.startswith(head)):
                continue  # not the file the cursor read
            refused = source_refusal(st, rotated, rotated,
                                     writers or (frozenset(), frozenset()))
            if refused:
                break
            data = os.pread(fd, MAX_READ, offset)
        except OSError:
            continue
        finally:
            os.close(fd)
        found = (_predecessor_events(data, rotated, st, got_head, offset, prev, source, parse),
                 st)
        break
    if found is not None:
        first = found[0]
    elif refused:
        first = _FileRead([], [f"{source} was rotated; its predecessor {refused}"], {})
    else:
        others = sorted(os.path.basename(p) for st, p in siblings
                        if _GENERATION.match(os.path.basename(p)[len(base):]))
        unread = (f"; {', '.join(others[:3])} may hold a generation rotated away since as well "
                  "(a second rotation?): not read, the cursor's last save cannot be told"
                  if others and written is None else "")
        first = _FileRead([], [f"{source} was rotated and its previous file (the XID cursor's) "
                               "is not there to read (compressed or removed at rotation?): an "
                               "XID it logged after the last run went unseen (logrotate's "
                               "delaycompress keeps it readable)" + unread], {})
    before = found[1] if found is not None else None
    between = _between(path, source, siblings, head, (inode, current), before, written, parse,
                       writers)
    return _FileRead(first.events + between.events,
                     first.errors + between.errors
                     + _packed_between(path, source, packed, before, written), {},
                     {**(first.logged or {}), **(between.logged or {})})


def _packed_between(path: str, source: str, packed: list, before: os.stat_result | None,
                    written: float | None) -> list[str]:
    """Generations rotated away since the last run and compressed already (logrotate's
    delaycompress, three rotations between two runs: kern.log.2.gz): they cannot be read here,
    and an XID in them went unseen: said. When the cursor's own generation was not found, one
    of them may be it (said on its own already)."""
    anchor = before.st_mtime if before is not None else written
    if anchor is None:
        return []
    base = os.path.basename(path)
    names = sorted(os.path.basename(p) for st, p in packed
                   if _GENERATION.match(os.path.basename(p)[len(base):].rsplit(".", 1)[0])
                   and st.st_mtime >= anchor and (written is None or st.st_mtime >= written))
    unseen = len(names) - (0 if before is not None else 1)
    if unseen <= 0:
        return []
    return [f"{source}: rotated more than once since the last run, and {unseen} generation(s) "
            f"of it between are compressed already ({', '.join(names[:4])}): not read, an XID "
            "in them went unseen (run the checker more often than the log rotates)"]


def _between(path: str, source: str, siblings: list, head: str, skip: tuple,
             before: os.stat_result | None, written: float | None, parse: Callable | None,
             writers) -> _FileRead:
    """Generations of `path` written whole since the cursor's (`before`, its rotated file)
    was rotated away, oldest first: a log rotated twice between two runs. Each was begun after
    the last run (a generation's lines follow the one before it's: it was written to no earlier
    than `before` was, nor than the cursor's last save, `written`), so it is read from its
    start, at most MAX_READ, MAX_GENERATIONS of them. `skip`: the cursor's and today's inodes."""
    anchor = before.st_mtime if before is not None else written
    if anchor is None:
        return _FileRead([], [], {})
    base = os.path.basename(path)
    gens = sorted((st.st_mtime, p) for st, p in siblings
                  if st.st_ino not in skip and (before is None or st.st_ino != before.st_ino)
                  and _GENERATION.match(os.path.basename(p)[len(base):])
                  and st.st_mtime >= anchor and (written is None or st.st_mtime >= written))
    events: list = []
    errors: list[str] = []
    logged: dict = {}
    heads = set()
    for n, (_, name) in enumerate(gens):
        if n >= MAX_GENERATIONS:
            errors.append(f"{source}: {len(gens) - n} more generation(s) of it rotated away "
                          f"since the last run not read (at most {MAX_GENERATIONS} are): an XID "
                          "in them went unseen")
            break
        gen = name
        try:
            fd = os.open(gen, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            got_head = _fingerprint(fd)
            if (head and got_head.startswith(head)) or got_head in heads:
                continue  # another copy of the cursor's generation, or of one read here
            heads.add(got_head)
            refused = source_refusal(st, gen, gen, writers or (frozenset(), frozenset()))
            if refused:
                errors.append(f"{source} was rotated more than once since the last run; a "
                              f"generation between {refused}")
                continue
            data = os.pread(fd, MAX_READ, 0)
        except OSError:
            continue
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        scan = _scan(data[:end], 0, st, got_head, source, parse)
        events.extend(scan.events)
        logged.update(scan.logged)
        errors.extend(_shape_errors(
            f"{source} (its rotated generation {os.path.basename(gen)})", scan, parse))
        if len(data) >= MAX_READ and st.st_size > end:
            errors.append(f"{source}: its rotated generation {os.path.basename(gen)} holds "
                          f"{st.st_size - end} more bytes after the {MAX_READ >> 20} MiB read: "
                          "not judged")
    return _FileRead(events, errors, {}, logged)


def _predecessor_events(data: bytes, rotated: str, st, head: str, offset: int, prev: dict,
                        source: str, parse: Callable | None) -> _FileRead:
    pos = offset
    if prev.get("skip") is True:  # the cursor stood inside an over-long line
        nl = data.find(b"\n")
        if nl < 0:
            return _FileRead([], [], {})
        pos, data = offset + nl + 1, data[nl + 1:]
    end = data.rfind(b"\n") + 1  # whole lines: a cut one may hold half an XID number
    scan = _scan(data[:end], pos, st, head, source, parse)
    events, logged, pos = scan.events, scan.logged, scan.pos
    name = os.path.basename(rotated)
    errors = _shape_errors(f"{source} (its rotated predecessor {name})", scan, parse)
    if pos < st.st_size and len(data) + (pos - offset) >= MAX_READ:
        errors.append(f"{source}: its rotated predecessor {name} holds {st.st_size - pos} "
                      f"more bytes after the {MAX_READ >> 20} MiB read: not judged")
    return _FileRead(events, errors, {}, logged)


def _file_key(inode: int, head: str, pos: int) -> str:
    """Where a line sits in a kernel log file: its inode, its generation (the file's first line,
    or first HEAD_BYTES: copytruncate keeps the inode and starts every generation at offset 0)
    and its offset. The same line read again (a cursor that could not be saved) gets the same
    key; a line of another generation at the same offset does not."""
    import hashlib

    raw = bytes.fromhex(head) if isinstance(head, str) else b""
    nl = raw.find(b"\n")
    first = raw[: nl + 1] if nl >= 0 else raw
    return f"{inode}:{hashlib.sha256(first).hexdigest()[:12]}:{pos}"


def _offset_since(fd: int, size: int, written: float | None, source: str,
                  errors: list[str]) -> int:
    """Where a file's lines logged since `written` (less LOST_SLACK_S) begin, by their syslog
    headers, within its last MAX_READ bytes; its end when `written` is unknown or nothing
    there was logged since."""
    if written is None:
        return size
    start = max(0, size - MAX_READ)
    data = os.pread(fd, MAX_READ, start)
    pos = start
    if start:  # the window began inside a line
        nl = data.find(b"\n")
        if nl < 0:
            return size
        pos, data = start + nl + 1, data[nl + 1:]
    since, now = written - LOST_SLACK_S, time.time()
    first = True
    for raw in data.split(b"\n")[:-1]:
        when = logged_at(raw[:64].decode("ascii", "replace"), now)
        if when is not None and when >= since:
            if first and start:
                errors.append(f"{source}: more than {MAX_READ >> 20} MiB logged since the XID "
                              "cursor's last write: only the last ones are judged")
            return pos
        if when is not None:
            first = False
        pos += len(raw) + 1
    return pos


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_WALL_SYSLOG = lazyre.compile(r"^(?P<mon>[A-Z][a-z]{2}) {1,2}(?P<day>\d{1,2}) "
                          r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)\b")
# RFC 3339 (rsyslog's file formats, `journalctl -o short-iso[-precise]`: "+0000" before
# systemd 250), after RFC 5424's "<PRI>1 "; `journalctl -o short-full`'s "Fri 2026-11-27
# 03:14:15 UTC"; `-o short-unix`'s seconds since the epoch.
_WALL_ISO = lazyre.compile(
    r"^(?:<\d{1,3}>1 )?(?P<d>\d{4}-\d\d-\d\d)T(?P<t>\d\d:\d\d:\d\d)(?:\.(?P<f>\d{1,9}))?"
    r"(?P<z>Z|[+-]\d\d(?::?\d\d)?)?(?=\s)")
_WALL_FULL = lazyre.compile(
    r"^[A-Z][a-z]{2} (?P<d>\d{4}-\d\d-\d\d) (?P<t>\d\d:\d\d:\d\d)(?:\.(?P<f>\d{1,9}))? "
    r"(?P<z>[A-Za-z0-9+:_/-]{1,40})(?=\s)")
_WALL_UNIX = lazyre.compile(r"^(?P<s>\d{9,12}\.\d{1,9})(?= \S+ )")


def _zone_offset(zone: str | None) -> float | None:
    """A header's zone as seconds east of UTC; None for the node's local time; NaN for a zone
    that cannot be told (an abbreviation not the node's: its time is not guessed)."""
    if not zone or zone in time.tzname:
        return None
    if zone in ("Z", "UTC", "GMT", "UT"):
        return 0.0
    if zone[0] in "+-" and zone[1:].replace(":", "").isdigit():
        digits = zone[1:].replace(":", "")
        if len(digits) in (2, 4):
            off = int(digits[:2]) * 3600 + int(digits[2:] or 0) * 60
            return float(off if zone[0] == "+" else -off)
    return float("nan")


def _wall(m) -> float | None:
    """The Unix time of a header's date (d), time (t), fraction (f) and zone (z)."""
    off = _zone_offset(m.group("z"))
    if off is not None and off != off:  # NaN: a zone this node cannot read
        return None
    try:
        y, mo, d = (int(x) for x in m.group("d").split("-"))
        h, mi, sec = (int(x) for x in m.group("t").split(":"))
        frac = float("0." + m.group("f")) if m.group("f") else 0.0
        if off is None:
            return datetime(y, mo, d, h, mi, sec).timestamp() + frac
        return (datetime(y, mo, d, h, mi, sec, tzinfo=UTC).timestamp() - off + frac)
    except (ValueError, OverflowError, OSError):
        return None


def logged_at(line: str, now: float) -> float | None:
    """When a kernel log file's line was logged (Unix time), from its header: RFC 3339 (also
    in RFC 5424), `journalctl -o short-full` or `-o short-unix`, or the traditional local
    time with no year (the latest such time not past tomorrow)."""
    for rx in (_WALL_ISO, _WALL_FULL):
        m = rx.match(line)
        if m:
            return _wall(m)
    m = _WALL_UNIX.match(line)
    if m:
        return float(m.group("s"))
    m = _WALL_SYSLOG.match(line)
    if not m or m.group("mon") not in _MONTHS:
        return None
    year = time.localtime(now).tm_year
    fields = (_MONTHS.index(m.group("mon")) + 1, int(m.group("day")), int(m.group("h")),
              int(m.group("m")), int(m.group("s")), 0, 0, -1)
    for y in (year, year - 1):
        try:
            when = time.mktime((y, *fields))
        except (OverflowError, ValueError):
            return None
        if when <= now + 86400:
            return when
    return None


def _seq_of(line: str) -> int | None:
    record = _seq_usec(line)
    return None if record is None else record[0]


def _seq_usec(line: str) -> tuple[int, int] | None:
    """A /dev/kmsg record's (sequence number, when it was logged in microseconds since boot)."""
    fields = kmsg_fields(line[:MAX_LINE])
    if fields is None:
        return None
    seq = int(fields[1])
    return (seq, int(fields[2])) if seq <= MAX_SEQ else None


def kmsg_fields(line: str) -> tuple[str, str, str, str] | None:
    """A /dev/kmsg record's (priority, sequence number, microseconds, message) as the texts
    `PRIO,SEQ,USEC,FLAGS;MESSAGE` holds them, or None for a line that is not one: what
    _KMSG.match gives (digits as re's \\d: str.isdecimal; a message holds no newline but a
    last one, which it loses), by str methods, so that a healthy job start reading the ring
    compiles no pattern and imports no `re` (tests/node/test_kmsg_fields.py holds them alike)."""
    head, sep, msg = line.partition(";")
    if not sep:
        return None
    newline = msg.find("\n")
    if newline != -1:
        if newline != len(msg) - 1:
            return None
        msg = msg[:-1]
    parts = head.split(",", 3)
    if len(parts) != 4 or not (parts[0].isdecimal() and parts[1].isdecimal()
                               and parts[2].isdecimal()):
        return None
    return parts[0], parts[1], parts[2], msg


# A finding's event_key is at most this long (it is stored with the finding).
MAX_EVENT_KEY = 2048


def event_key(keys) -> str:
    """One finding's events' keys as its event_key (its spool record's id is a hash of it):
    joined in order, and past MAX_EVENT_KEY cut with a hash of the whole after it, so two
    groups that differ only past the cut (a storm read again with more events) are two
    records, not one the historian keeps and one it drops as the same."""
    joined = "|".join(sorted(k for k in keys if k))
    if len(joined) <= MAX_EVENT_KEY:
        return joined
    import hashlib

    digest = hashlib.sha256(joined.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return joined[: MAX_EVENT_KEY - 48] + f"|n={len(joined)}|sha256={digest}"


def _keyed(ev: XidEvent, key: str) -> XidEvent:
    from rsc_health.record import replace

    return replace(ev, key=key)


def _read_file(path: StrPath, offset: int, limit: int) -> tuple[bytes, str]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return os.pread(fd, limit, offset), _fingerprint(fd)
    finally:
        os.close(fd)


def load_cursor(path: StrPath) -> dict:
    """The saved cursor; {} when there is none (the first run). One that is there but cannot
    be read (empty after a power cut, cut short, a directory, a FIFO, a device) is not "none":
    {"lost": why, "lost_mtime": when it was last written}, for read_new_events to judge. A
    readable one carries its "mtime" too: it may still be wrong, and is then judged alike."""
    from rsc_health.durable import load_state_json

    cursor = load_state_json(path)
    if cursor and not isinstance(cursor.get("lost"), str):
        try:
            cursor["mtime"] = os.stat(path).st_mtime
        except OSError:
            pass
    return cursor


# A run reads the ring buffer before it writes its cursor, within one budget: records logged
# this long before a lost cursor's last write may not have been read by that run.
LOST_SLACK_S = 60.0


def _usec_since_boot(root: StrPath, mtime) -> float | None:
    """A wall-clock time (a state file's mtime) as a kmsg timestamp (microseconds since this
    boot began), less LOST_SLACK_S; None when it cannot be told (no /proc/uptime)."""
    if not isinstance(mtime, (int, float)) or isinstance(mtime, bool):
        return None
    try:
        uptime = float(read_bounded(os.path.join(root, "proc/uptime"), 4096).split()[0])
    except (OSError, ValueError, IndexError):
        return None
    booted = time.time() - uptime
    return (mtime - booted - LOST_SLACK_S) * 1e6


def save_json(path: StrPath, data: dict, *, sync_dir: bool = True) -> None:
    """Write atomically and durably: neither a killed checker nor a power cut leaves a half
    or empty state file (an empty cursor would have a kernel log read again from its start)."""
    from rsc_health.durable import write_atomic

    write_atomic(path, json_dumps(data, sort_keys=True), sync_dir=sync_dir)
