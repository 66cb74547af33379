"""The data that flows between layers: findings, verdicts and the records the node path spools.

Everything here is plain dataclasses and enums with no imports beyond the standard library,
because the prolog imports this module on every job start.
"""

from __future__ import annotations

import enum
import os
from datetime import datetime

from rsc_health.compat import UTC, StrEnum
from rsc_health.record import asdict, dataclass, field


class Status(StrEnum):
    """What a single check saw. ERROR means the checker itself could not look."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"


class Severity(enum.IntEnum):
    """What a finding asks Slurm to do, in one total order: the worst finding wins."""

    NONE = 0
    WARN = 1
    DRAIN_AFTER_JOB = 2
    DRAIN_NOW = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.strip().upper().replace("-", "_")]


class Level(enum.IntEnum):
    """The node's verdict. The value is the exit code of `healthctl check`, the prolog's
    decision input and the sweep's action input (documented in README.md, "Exit codes")."""

    OK = 0
    WARN = 1
    DRAIN_AFTER_JOB = 2
    DRAIN_NOW = 3
    CHECKER_ERROR = 4

    @property
    def label(self) -> str:
        """The word spool heartbeats and the historian store ("checker_error")."""
        return self.name.lower()


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


# The node_actions word lemon drains were recorded with before ActionKind existed: historians
# keep such rows, and a node resumed after one is back from a lemon repair all the same.
LEGACY_LEMON_DRAIN = "drain"

# A drain verdict the node keeps pending (not carried out) and why: what `healthctl status` names.
HELD_KINDS = frozenset({ActionKind.GUARD_TRIPPED, ActionKind.HELD_UNDER_DRAIN})

DRAIN_KINDS = frozenset({ActionKind.DRAIN_NOW, ActionKind.DRAIN_AFTER_JOB, ActionKind.LEMON_DRAIN,
                         ActionKind.MANUAL_DRAIN, ActionKind.QUALIFY_DRAIN})


# Finding codes of a probe that did not answer (a mount's statvfs, NVML; collect.hangs): their
# data name the probe and since when it hangs. The heartbeat and the textfile carry them, and
# `healthctl status` names the nodes whose intervals of them are open.
HUNG_CODES = frozenset({"mount_hung", "nvml_hung", "nvml_wedged"})


# Every reason string rsc-health gives Slurm starts with this; only such drains are ever
# resumed by rsc-health. A reason without it belongs to a person or to Slurm itself.
REASON_PREFIX = "rsc_health:"


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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        d["severity"] = self.severity.label
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
    # The findings that decided the verdict (the worst ones), most severe first.
    causes: tuple[Finding, ...] = ()
    # True when every cause is transient (mount back, IB port up): a clean sweep may resume.
    auto_resumable: bool = False

    @property
    def exit_code(self) -> int:
        return int(self.level)

    @property
    def drains(self) -> bool:
        return self.level in (Level.DRAIN_NOW, Level.DRAIN_AFTER_JOB)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_record_id() -> str:
    """Unique id of a spooled record; the historian's primary key makes delivery exactly-once."""
    # 128 random bits, as uuid4 but without importing uuid (and platform) on every job start.
    return os.urandom(16).hex()
