"""InfiniBand ports: up at the expected rate, error counters not rising.

A port down or polling drains now but may come back by itself (repair=False, a clean sweep
resumes the node). A port at a lower rate, or with symbol errors climbing, points at a cable or
transceiver: drain after the job, repair=True.

The whole family lives here: what it reads (`collect`), its counters and its policy. Ports are
read from /sys/class/infiniband/<hca>/ports/<n>/ (formats from the kernel's
drivers/infiniband/core/sysfs.c, as rdma-core's ibstat reads them): `state` = `4: ACTIVE`,
`phys_state` = `5: LinkUp`, `rate` = `400 Gb/sec (4X NDR)`, `link_layer` = `InfiniBand`,
`counters/<name>` = a decimal integer.
"""

from __future__ import annotations

from rsc_health import lazyre
from rsc_health.checks._finding import checker_error, fail, ok, warn
from rsc_health.collect import hangs, ibports
from rsc_health.collect.counters import per_sweep, span_words
from rsc_health.collect.sysfs import parse_count
from rsc_health.model import Finding, Severity
from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

_RATE = lazyre.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)

# The width in bits at which the kernel shows each PortCounters counter (drivers/infiniband/
# core/sysfs.c PORT_PMA_ATTR). The IB spec has them stop at all ones, not wrap: one held there
# shows a delta of 0 every sweep whatever the link does. The data counters are left out: the
# kernel shows PortCountersExtended's 64 bits where the HCA has them.
COUNTER_BITS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_xmit_discards": 16,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "port_xmit_wait": 32,
}


def saturated(counter: str, value: int | None) -> bool:
    """Whether `value` is `counter`'s all-ones maximum, where it stops counting."""
    bits = COUNTER_BITS.get(counter)
    return bits is not None and isinstance(value, int) and value >= (1 << bits) - 1


PORT_ATTRS = ("state", "phys_state", "rate", "link_layer")
_PORTS = "sys/class/infiniband/*/ports/*"
# An HCA is an SR-IOV virtual function's, no rail, when its device has a physfn (the link to
# its physical function, collect.ibports). A snapshot carries only what READS names: without
# the physfn (carried as its link and the uevent file every sysfs device has, so that it
# exists under the replay's root) `check --from` took a VF left DOWN for a rail, ib_down.
PHYSFN = "sys/class/infiniband/*/device/physfn/uevent"
READS = (*(f"{_PORTS}/{a}" for a in PORT_ATTRS),
         *(f"{_PORTS}/counters/{c}" for c in ERROR_COUNTERS), PHYSFN)


class IbPorts(list):
    """The ports read (IbPort each), and the HCAs whose ports were not all listed (`unlisted`:
    unreadable, or past ibports.MAX_PORTS): none of theirs is judged missing. `sweeps_missed`:
    the sweeps the ports' read hung before this run, which their counters' rise spans too."""

    unlisted: frozenset[str] = frozenset()
    sweeps_missed: int = 0


@dataclass
class IbPort:
    hca: str
    port: str
    state: str | None  # "ACTIVE", "DOWN", "INIT", ...
    phys_state: str | None  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None
    link_layer: str | None
    counters: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # counter files that held no count
    virtual: bool = False  # an SR-IOV virtual function's (made and removed at will)

    @property
    def name(self) -> str:
        return f"{self.hca}/{self.port}"


def _word(text: str | None) -> str | None:
    """`4: ACTIVE` -> `ACTIVE`."""
    if not text:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def parse_rate(text: str | None) -> float | None:
    """The Gb/s of a port's `rate` file ("200 Gb/sec (4X HDR)"): what _RATE.match reads, by
    str methods (digits as re's \\d, spaces as its \\s), so that a healthy job start compiles
    no pattern and imports no `re` (tests/node/test_kmsg_fields.py holds them alike)."""
    s = (text or "").lstrip()
    i, n = 0, len(s)
    while i < n and s[i].isdecimal():
        i += 1
    if i == 0:
        return None
    if i + 1 < n and s[i] == "." and s[i + 1].isdecimal():
        i += 2
        while i < n and s[i].isdecimal():
            i += 1
    if not s[i:].lstrip().startswith("Gb/sec"):
        return None
    return float(s[:i])


def collect(root: StrPath, env=None) -> IbPorts | None:
    """The ports through the run's one reader (rsc_health.collect.ibports): the telemetry
    family's reads of the same files are served from it. None when the ports were not listed
    (the read hung before, or is still stuck from an earlier run: ib_hung says so): a port
    never listed is not judged missing."""
    read = ibports.reader(root, env, ibports.port_files(READS))
    if not read.listed:
        ibports.said(read, env, "infiniband")
        return None
    ports = IbPorts()
    ports.unlisted = frozenset(read.unlisted)
    ports.sweeps_missed = ibports.sweeps_missed(env)
    for hca, name, pdir in read.ports():
        port = IbPort(
            hca=hca,
            port=name,
            state=_word(read.text(f"{pdir}/state")),
            phys_state=_word(read.text(f"{pdir}/phys_state")),
            rate_gbps=parse_rate(read.text(f"{pdir}/rate")),
            link_layer=read.text(f"{pdir}/link_layer"),
            virtual=read.virtual(pdir),
        )
        for counter in ERROR_COUNTERS:
            text = read.text(f"{pdir}/counters/{counter}")
            value = parse_count(text)
            if value is not None:
                port.counters[counter] = value
            elif text is not None:
                port.unreadable.append(counter)
        ports.append(port)
    ibports.said(read, env, "infiniband")
    return ports


# The most physical ports seen at once in this boot, kept with the counters: an HCA that falls
# off the bus (or whose driver lost it) takes its ports out of sysfs, and with no [infiniband]
# hcas or count configured nothing else would say it was ever there.
PORTS_SEEN = "ib/ports_seen"


def counters(state) -> dict[str, int]:
    ports = state.extra.get("infiniband")
    out = {f"ib/{port.name}/{k}": v for port in ports or [] for k, v in port.counters.items()}
    if ports is not None:
        here = [p for p in ports if not p.virtual]
        out.update({f"ib/{p.name}/present": 1 for p in here})
        before = state.baseline.get(PORTS_SEEN, 0)
        out[PORTS_SEEN] = max(len(here), before if isinstance(before, int) else 0)
    return out


def _vanished(state, found: list) -> list[Finding]:
    """Physical ports fewer than this boot has seen at once: the ports gone named (those seen
    earlier in this boot that are not here; a rename within the boot is no loss)."""
    here = {p.name for p in found if not p.virtual}
    seen = state.counters.get(PORTS_SEEN, 0)
    if len(here) >= seen:
        return []
    unlisted: frozenset[str] = getattr(found, "unlisted", frozenset())
    gone = sorted(k[3:-len("/present")] for k in state.baseline
                  if k.startswith("ib/") and k.endswith("/present")
                  and k[3:-len("/present")] not in here
                  and k[3:-len("/present")].split("/")[0] not in unlisted)
    if unlisted and not gone:
        return []  # fewer only by the HCAs the checker could not list: a checker error
    return [fail("infiniband", "hcas", Severity.DRAIN_NOW, "ib_missing",
                 f"{len(here)} of the {seen} InfiniBand ports seen earlier in this boot "
                 f"present (gone: {', '.join(gone)[:200] or 'unknown'})", repair=True,
                 gone=gone[:64])]

# What the kernel writes (drivers/infiniband/core/sysfs.c): anything else was not read right.
PORT_STATES = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}
PHYS_STATES = {"Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp",
               "LinkErrorRecovery", "Phy Test"}
RISING_CODES = {
    "symbol_error": "ib_symbol_errors",
    "link_downed": "ib_link_downed",
    "link_error_recovery": "ib_link_recovery",
    "port_rcv_errors": "ib_rcv_errors",
    "port_rcv_remote_physical_errors": "ib_remote_physical",
    "port_xmit_discards": "ib_xmit_discards",
    "local_link_integrity_errors": "ib_link_integrity",
    "excessive_buffer_overrun_errors": "ib_buffer_overrun",
}
# Increase per five-minute sweep a healthy port shows; [infiniband] errors_per_sweep overrides.
# A link that went down is never normal; receive errors, remote physical errors and overruns
# appear on healthy NDR ports under load; discards are congestion before they are a fault.
DEFAULT_LIMITS = {
    "symbol_error": 10,
    "link_downed": 0,
    "link_error_recovery": 1,
    "port_rcv_errors": 100,
    "port_rcv_remote_physical_errors": 100,
    "port_xmit_discards": 1000,
    "local_link_integrity_errors": 10,
    "excessive_buffer_overrun_errors": 100,
}


def _wedged(state, icfg: dict) -> list[Finding]:
    """The ports' sysfs read hung on this run and on [infiniband] hang_sweeps sweeps in a row:
    the HCA's driver is wedged (a firmware command that never completes), and multi-node jobs
    fail on it. The node's fault, not a checker error for ever: drain after the job (a
    repair), as checks.gpu does for NVML."""
    hang = hangs.wedged(state, hangs.IB, int(icfg.get("hang_sweeps", 3)))
    if hang is None:
        return []
    return [fail("infiniband", hangs.IB, Severity.DRAIN_AFTER_JOB, "ib_wedged",
                 f"the InfiniBand ports' read has not answered for {hang['sweeps']} sweeps in "
                 "a row, a wedged HCA driver: reset the HCA", repair=True, probe=hangs.IB,
                 **hang)]


def check(state, cfg: dict) -> list[Finding]:
    icfg = cfg.get("infiniband", {})
    found = state.extra.get("infiniband")
    wedged = _wedged(state, icfg)
    if found is None:
        return wedged
    wanted = list(icfg.get("hcas", []))
    rate = float(icfg.get("rate_gbps", 0))
    limits = icfg.get("errors_per_sweep", {})
    # The rails: InfiniBand ports of physical functions. An SR-IOV virtual function's port
    # is the host's to make, remove and leave DOWN (its vport policy's default) at will: not
    # a fabric rail, so neither judged nor counted as one, unless [infiniband] hcas names it.
    ib = [p for p in found if (p.link_layer or "InfiniBand") == "InfiniBand"]
    if wanted:
        ports = [p for p in ib if p.hca in wanted]
    else:
        ports = [p for p in ib if not p.virtual]
    out: list[Finding] = []
    unlisted: frozenset[str] = getattr(found, "unlisted", frozenset())  # said as an error
    for hca in sorted(set(wanted) - {p.hca for p in found} - unlisted):
        out.append(
            fail("infiniband", hca, Severity.DRAIN_NOW, "ib_missing", f"{hca} HCA not present",
                 repair=True)
        )
    # A listed HCA that is present but has no InfiniBand port: on an InfiniBand fabric a VPI
    # card whose link type a firmware update reset to ETH (a rail lost); on a RoCE fabric
    # (ConnectX in ETH mode by design) every rail. Only [infiniband] link_layer tells them
    # apart: "InfiniBand" judges it missing, "any" (the default, so a RoCE site that lists its
    # HCAs is not drained fleet-wide) counts it present, its ports not judged, as said here.
    want_ib = icfg.get("link_layer", "any") == "InfiniBand"
    for hca in sorted(set(wanted) & {p.hca for p in found} - {p.hca for p in ib} - unlisted):
        layers = sorted({str(p.link_layer) for p in found if p.hca == hca})
        said = ", ".join(layers)[:80]
        if want_ib:
            out.append(fail("infiniband", hca, Severity.DRAIN_NOW, "ib_missing",
                            f"{hca} has no InfiniBand port (link layer {said}): set its link "
                            "type back to IB", repair=True, link_layer=layers[:8]))
        else:
            out.append(ok("infiniband", hca, f"{hca} present, link layer {said}: its ports "
                          "are not judged (an InfiniBand fabric sets [infiniband] link_layer "
                          '= "InfiniBand")', link_layer=layers[:8]))
    # The sweeps the rise spans: those the ports' read hung and this one, or the time since
    # the baselines were taken (sweeps missed), whichever is longer.
    hung = 1 + getattr(found, "sweeps_missed", 0)
    timed, since = per_sweep(1, state, "infiniband")
    if hung > 1 and hung >= timed:
        timed, since = hung, f"over the last {hung} sweeps (the ports' read hung)"
    for p in ports:
        out.extend(_port(p, state.deltas, rate, limits, timed, since, state.sweeps))
    count = int(icfg.get("count", 0))
    if count and not wanted and len(ports) < count and not unlisted:
        out.append(
            fail("infiniband", "hcas", Severity.DRAIN_NOW, "ib_missing",
                 f"{len(ports)} of {count} InfiniBand ports present", repair=True)
        )
    elif not wanted:
        out.extend(_vanished(state, found))
    return wedged + out


def _port(p, deltas: dict, rate: float, limits: dict, span: float = 1,
          since: str = "since last sweep", spans: dict | None = None) -> list[Finding]:
    """One port: its link state and rate, counters it could not read, error counters rising
    past their limits (per sweep, times the `span` of sweeps the rise covers, `since` in
    words: after a hang of the ports' read, the sweeps it hung and this one; a counter's own
    in `spans` where longer: a run could not read it and its baseline stayed); ok when none
    of that."""
    comp = p.name
    if p.state not in PORT_STATES or p.phys_state not in PHYS_STATES:
        # An empty, missing or garbled sysfs file says nothing about the link.
        return [checker_error("infiniband", comp, f"infiniband: cannot read {comp} state "
                              f"({p.state!r}/{p.phys_state!r})")]
    out: list[Finding] = []
    if p.state != "ACTIVE" or p.phys_state != "LinkUp":
        out.append(fail("infiniband", comp, Severity.DRAIN_NOW, "ib_down",
                        f"{comp} port {p.state or '?'}/{p.phys_state or '?'}", repair=False,
                        state=p.state, phys_state=p.phys_state))
    elif rate and p.rate_gbps is not None and p.rate_gbps < rate:
        out.append(fail("infiniband", comp, Severity.DRAIN_AFTER_JOB, "ib_rate",
                        f"{comp} at {p.rate_gbps:g} Gb/s, expected {rate:g}", repair=True,
                        rate_gbps=p.rate_gbps))
    elif rate and p.rate_gbps is None:
        # Missing, empty, not "N Gb/sec", or EINVAL (rate_show cannot tell the width): the
        # speed was not looked at, which is not "at the expected speed".
        out.append(checker_error("infiniband", comp, f"infiniband: cannot read {comp} rate "
                                 f"(expected {rate:g} Gb/s)"))
    if p.unreadable:
        out.append(checker_error("infiniband", comp, f"infiniband: {comp} counters hold no "
                                 f"count: {', '.join(p.unreadable)}"))
    stuck = []
    for counter, code in RISING_CODES.items():
        key = f"ib/{comp}/{counter}"
        d = deltas.get(key, 0)
        limit = int(limits.get(counter, DEFAULT_LIMITS[counter]))
        own = (spans or {}).get(key, 0)
        over, words = (own, span_words(own)) if own > span else (span, since)
        if d > limit * over:  # what it counted before it stopped still counts
            out.append(fail("infiniband", comp, Severity.DRAIN_AFTER_JOB, code,
                            f"{comp} {counter} +{d} {words} (limit {limit} a sweep)",
                            repair=True, counter=counter, delta=d))
        elif saturated(counter, p.counters.get(counter)):
            stuck.append(f"{counter}={p.counters[counter]}")
    if stuck:
        # Held at its maximum it can show no new error. A warning, not a checker error: the
        # 4-bit counters (overruns, link integrity) fill on healthy ports under load, and a
        # checker error every sweep would stop the clean sweeps a resume waits for.
        out.append(warn("infiniband", comp, "ib_counter_saturated", (
            f"{comp} counters stopped at their maximum ({', '.join(stuck)}): errors past it "
            f"are not seen; clear them (perfquery -x -R -C {p.hca} -P {p.port})"),
            counters=stuck))
    return out or [ok("infiniband", comp, f"{comp} ACTIVE {p.rate_gbps or 0:g} Gb/s")]
