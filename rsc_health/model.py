"""The data that flows between layers: findings, verdicts and the records the node path spools.

Everything here is plain records (rsc_health.record) and enums (rsc_health.compat's, which a type
checker sees as enum's) with no imports beyond the standard library, because the prolog
imports this module on every job start.
"""

from __future__ import annotations

import os

from rsc_health.compat import UTC, IntEnum, StrEnum, datetime
from rsc_health.record import asdict, dataclass, field


class Status(StrEnum):
    """The word a check's result is stored under (spool records, check_results.status): what
    it saw. Derived from the finding's Level (Level.status); ERROR means it could not look."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"


class Level(IntEnum):
    """The one severity scale, in one total order of rank (the worst wins): what a finding
    asks of Slurm, and the node's verdict. "Could not look" (CHECKER_ERROR, also named
    UNKNOWN) ranks above a warning and below any drain: a checker that could not look is
    loud, never fatal (policy.decide).

    The rank is not an exit code: `exit_code` is what `healthctl check` exits with and the
    textfile's rsc_health_verdict_level says (README "Exit codes": 0 ok, 1 warn, 2 drain after
    job, 3 drain now, 4 checker error), `status` the word a finding is stored under, `label`
    the verdict's word (heartbeats, the historian) and `severity_word` a finding's."""

    OK = 0
    WARN = 1
    CHECKER_ERROR = 2
    DRAIN_AFTER_JOB = 3
    DRAIN_NOW = 4
    # The same members under the names they also go by.
    NONE = 0  # a finding that asks nothing
    UNKNOWN = 2  # could not look

    @property
    def label(self) -> str:
        """The verdict's word, as spool heartbeats and the historian store it."""
        return self.name.lower()

    @property
    def severity_word(self) -> str:
        """A finding's severity word (spool records, check_results.severity)."""
        return "none" if self in (Level.OK, Level.CHECKER_ERROR) else self.name.lower()

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]

    @classmethod
    def from_exit_code(cls, code: int) -> Level:
        for level, value in _EXIT_CODES.items():
            if value == code:
                return level
        raise ValueError(f"{code!r} is not a verdict exit code")

    @property
    def status(self) -> Status:
        """The word a finding of this level is stored under."""
        return _STATUS[self]

    @classmethod
    def parse(cls, text: str) -> Level:
        """A finding's severity from its word ("none", "warn", "drain_after_job",
        "drain_now"); KeyError for anything else."""
        word = text.strip().lower().replace("-", "_")
        for level in FINDING_SEVERITIES:
            if level.severity_word == word:
                return level
        raise KeyError(text)


# One type: a finding's severity is a Level (the name kept where findings are made).
Severity = Level
# The levels a finding may ask for (a checker error is said by its status, ERROR).
FINDING_SEVERITIES = (Level.NONE, Level.WARN, Level.DRAIN_AFTER_JOB, Level.DRAIN_NOW)
# Their words, as a record carries them (a spooled check record, an imported one).
SEVERITY_WORDS = tuple(s.severity_word for s in FINDING_SEVERITIES)
_EXIT_CODES = {Level.OK: 0, Level.WARN: 1, Level.DRAIN_AFTER_JOB: 2, Level.DRAIN_NOW: 3,
               Level.CHECKER_ERROR: 4}
_STATUS = {Level.OK: Status.OK, Level.WARN: Status.WARN, Level.CHECKER_ERROR: Status.ERROR,
           Level.DRAIN_AFTER_JOB: Status.FAIL, Level.DRAIN_NOW: Status.FAIL}


class ActionKind(StrEnum):
    """What rsc-health did (or refused to do) in Slurm: the `action` of spool records and of
    the historian's node_actions rows. One vocabulary for the node path, lemons, operator
    commands and the report (tests/unit/test_action_vocabulary.py holds them together)."""

    DRAIN_NOW = "drain_now"  # drained, jobs requeued
    DRAIN_AFTER_JOB = "drain_after_job"  # drained, the running job finishes
    RESUME = "resume"
    REQUEUE = "requeue"
    REQUEUE_REFUSED = "requeue_refused"
    GUARD_TRIPPED = "guard_tripped"  # a drain the mass-drain guard held back (kept pending)
    # A drain verdict kept pending under a drain or DOWN that is not ours (a person's, Slurm's
    # "Prolog error", NHC's): carried out once that is lifted.
    HELD_UNDER_DRAIN = "held_under_drain"
    LEMON_DRAIN = "lemon_drain"  # `healthctl lemons --apply`
    MANUAL_DRAIN = "manual_drain"  # `healthctl drain`
    WOULD_DRAIN = "would_drain"  # shadow mode ([actions] enabled = false): recorded, not done
    QUALIFY_START = "qualify_start"  # into a root-only reservation, resumed there, job sent
    QUALIFY_RELEASE = "qualify_release"  # a stored pass: reservation gone, back in service
    QUALIFY_DRAIN = "qualify_drain"  # failed or proved nothing: drained, reservation gone
    # The suspect tier (rsc_health/suspects.py): short of a drain, never a drain.
    SUSPECT = "suspect"  # trusted feature taken off, weight raised (or put back after a loss)
    SUSPECT_RESTORE = "suspect_restore"  # trusted feature and weight given back
    WOULD_SUSPECT = "would_suspect"  # shadow mode: recorded, Slurm untouched
    SUSPECT_HELD = "suspect_held"  # over the guard's cap, or a person's drain/DOWN: left alone


class SuspectState(StrEnum):
    """A suspect episode's state (the historian's `suspects` table, rsc_health/suspects.py)."""

    SUSPECT = "suspect"  # kept away from big jobs; qualification decides
    CLEARED = "cleared"  # a qualification pass, or a person (`healthctl suspects clear`)
    CONFIRMED = "confirmed"  # qualification failed: drained with a ticket
    EXPIRED = "expired"  # no evidence for [suspects] expire_after_h


# What the historian's `suspects.tier` says the suspect tier (rsc_health/suspects.py) did with
# an episode: here, so that qualification can read it without importing the tier.
TIER_APPLIED, TIER_SHADOW, TIER_HELD, TIER_PERSON = "applied", "shadow", "held", "person"
# An ended episode whose marks are no longer the tier's (given back, or Slurm showed the node
# trusted after it ended): its saved weight is history, never a reason to touch the node.
TIER_RETURNED = "returned"


# The node_actions word lemon drains were recorded with before ActionKind existed: historians
# keep such rows, and a node resumed after one is back from a lemon repair all the same.
LEGACY_LEMON_DRAIN = "drain"

# A drain verdict the node keeps pending (not carried out) and why: what `healthctl status` names.
HELD_KINDS = frozenset({ActionKind.GUARD_TRIPPED, ActionKind.HELD_UNDER_DRAIN})

DRAIN_KINDS = frozenset({ActionKind.DRAIN_NOW, ActionKind.DRAIN_AFTER_JOB, ActionKind.LEMON_DRAIN,
                         ActionKind.MANUAL_DRAIN, ActionKind.QUALIFY_DRAIN})


# Finding codes of a probe that did not answer (a mount's statvfs, NVML, the InfiniBand ports'
# sysfs read; collect.hangs): their data name the probe and since when it hangs. The heartbeat
# and the textfile carry them, and `healthctl status` names the nodes whose intervals of them
# are open.
HUNG_CODES = frozenset({"mount_hung", "nvml_hung", "nvml_wedged", "ib_hung", "ib_wedged"})


# Every reason string rsc-health gives Slurm starts with this; only such drains are ever
# resumed by rsc-health. A reason without it belongs to a person or to Slurm itself.
REASON_PREFIX = "rsc_health:"
# The name of the reservation the qualification flow holds a node in while its burn-in runs
# (Flags=MAINT,IGNORE_JOBS). Here rather than in qualify.flow so that the historian, which
# must not call its own qualification planned maintenance, can read it from below.
QUALIFY_RESERVATION_PREFIX = "rsc_health_qualify_"


class Metric(StrEnum):
    """The node-level telemetry vocabulary (issue 25): one value per node per sweep, with the
    worst component named alongside. The node's `telemetry` spool records, the historian's
    telemetry_samples and rollups, and the fail-slow detector all speak it; a name is a
    contract between them, never restated as a bare string."""

    SM_CLOCK_RATIO = "sm_clock_ratio"  # min over busy GPUs of SM clock / max SM clock (0..1]
    # max over GPUs of the fraction of the interval in HW slowdown, HW thermal, HW power
    # brake or SW thermal slowdown (0..1)
    THROTTLE_HW_FRAC = "throttle_hw_frac"
    THROTTLE_POWER_FRAC = "throttle_power_frac"  # max over GPUs, fraction in SW power cap
    GPU_TEMP_C = "gpu_temp_c"  # max GPU temperature
    POWER_RATIO = "power_ratio"  # max over GPUs of power draw / enforced power limit
    PCIE_LINK_RATIO = "pcie_link_ratio"  # min over GPUs of (gen*width)/(max gen*max width)
    PCIE_REPLAY_RATE = "pcie_replay_rate"  # max over GPUs of PCIe replays per second
    NVLINK_ERROR_RATE = "nvlink_error_rate"  # max over GPUs, CRC/replay/recovery errors per s
    IB_XMIT_WAIT_RATE = "ib_xmit_wait_rate"  # max over HCA ports of port_xmit_wait ticks per s
    IB_LINK_RATIO = "ib_link_ratio"  # min over HCA ports of active rate / expected rate
    # min over busy GPUs of NVLink data bytes per s, TX + RX over all links (NVML's
    # NVLINK_THROUGHPUT_DATA_TX/RX fields); GPUs whose NVML has no NVLink say nothing
    NVLINK_DATA_RATE = "nvlink_data_rate"
    # max over GPUs of DRAM rows remapped (correctable + uncorrectable; retired pages on a GPU
    # without a row remapper): state, not a rate
    REMAPPED_ROWS = "remapped_rows"
    # max over GPUs of memory banks whose row-remap availability is low or none
    # (nvmlDeviceGetRowRemapperHistogram): the next uncorrectable error there may not remap
    REMAP_LOW_BANKS = "remap_low_banks"
    # max over HCA ports of the link's own physical error counters' increments per s (symbol,
    # link downed, link error recovery, link integrity; not receive, remote physical or buffer
    # overrun errors, which healthy ports count under load, nor xmit discards: congestion)
    IB_ERROR_RATE = "ib_error_rate"


# The metrics where less is worse (a rollup counts samples below their warn threshold); the
# others count samples above it.
# Levels, not rates or ratios over the interval: the samples keep them (the detector's window,
# the exporter), the rollups do not. Their rollup would repeat a level the remap family and
# the samples already give, and its columns would take the PostgreSQL rollups past the
# storage budget (benchmarks/bench_telemetry_storage.py).
LEVELS = frozenset({Metric.REMAPPED_ROWS, Metric.REMAP_LOW_BANKS})
ROLLED_UP = tuple(m for m in Metric if m not in LEVELS)

LOWER_IS_WORSE = frozenset({Metric.SM_CLOCK_RATIO, Metric.PCIE_LINK_RATIO, Metric.IB_LINK_RATIO,
                            Metric.NVLINK_DATA_RATE})

# Each metric's physical range (lowest, highest; None: no bound): a value outside it is no
# reading a node writes (the node path drops what no GPU gives and caps its fractions at 1),
# so the historian refuses it with its record, and the fail-slow detector judges no such row
# (samples stored before). A ratio or fraction of a maximum is [0, 1] with a little headroom;
# power and the IB link's rate are ratios to a limit or a configured rate, not a maximum
# (733 W of a 700 W limit is healthy; a port faster than [infiniband] rate_gbps is over 1);
# rates, counts and levels are never negative. A negative link ratio counted as a node that
# moved with its job, and hid another node's real x16 -> x8 downtrain.
_FRACTION = (0.0, 1.05)
RANGES: dict[str, tuple[float, float | None]] = {
    Metric.SM_CLOCK_RATIO: _FRACTION,
    Metric.THROTTLE_HW_FRAC: _FRACTION,
    Metric.THROTTLE_POWER_FRAC: _FRACTION,
    Metric.PCIE_LINK_RATIO: _FRACTION,
    Metric.GPU_TEMP_C: (0.0, 200.0),
    Metric.POWER_RATIO: (0.0, 10.0),  # the node drops a reading past ten times its limit
    Metric.IB_LINK_RATIO: (0.0, None),
}
RANGES.update({m: (0.0, None) for m in Metric if m not in RANGES})  # rates, counts, levels


def in_range(metric: str, value: float) -> bool:
    """Whether `value` is a reading `metric` can have (RANGES; a name not in the vocabulary:
    any)."""
    lo, hi = RANGES.get(metric, (float("-inf"), None))
    return lo <= value and (hi is None or value <= hi)


@dataclass(frozen=True)
class Finding:
    """One observation of one component.

    family:    check family (xid, ecc, remap, nvlink, pcie, gpu, infiniband, mount, checker)
    component: what was looked at, e.g. "gpu3", "mlx5_2/1", "/checkpoint", "0000:3b:00.0"
    code:      short machine token for the fault, e.g. "xid79", "ecc_dbe", "mount_missing";
               it is the third field of the Slurm reason string
    repair:    True when the fault needs hands-on repair and must never be auto-resumed
    """

    family: str
    component: str
    status: Status
    severity: Severity
    reason: str
    code: str = ""
    repair: bool = False
    data: dict = field(default_factory=dict)

    @property
    def level(self) -> Level:
        """Its place on the one scale: what it asks, or CHECKER_ERROR when it could not look
        (a checker error never asks for a drain, whatever its severity says)."""
        return Level.CHECKER_ERROR if self.status is Status.ERROR else self.severity

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        d["severity"] = self.severity.severity_word
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Finding:
        return cls(
            family=d["family"],
            component=d["component"],
            status=Status(d["status"]),
            severity=Severity.parse(d["severity"]),
            reason=d["reason"],
            code=d.get("code", ""),
            repair=bool(d.get("repair", False)),
            data=dict(d.get("data") or {}),
        )


@dataclass(frozen=True)
class Verdict:
    """The node's answer to "am I fit to run the next job?"."""

    level: Level
    # Slurm reason ("rsc_health:now:xid79:gpu3 fell off the bus") or "" when no drain.
    reason: str
    # The findings that decided the verdict, most severe first: for a drain, every
    # drain-level finding (policy.decide); otherwise the worst ones.
    causes: tuple[Finding, ...] = ()
    # True when every cause is transient (mount back, IB port up): a clean sweep may resume.
    auto_resumable: bool = False

    @property
    def exit_code(self) -> int:
        return self.level.exit_code

    @property
    def drains(self) -> bool:
        return self.level in (Level.DRAIN_NOW, Level.DRAIN_AFTER_JOB)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_record_id() -> str:
    """Unique id of a spooled record; the historian's primary key makes delivery exactly-once."""
    # 128 random bits, as uuid4 but without importing uuid (and platform) on every job start.
    return os.urandom(16).hex()
