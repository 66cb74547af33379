"""The Slurm interface: data passed between layers, typed errors and the protocol itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


class SlurmError(Exception):
    """A Slurm call failed."""


class SlurmUnavailable(SlurmError):
    """slurmctld (or slurmdbd) did not answer in time: retry later, never treat as an answer."""


class SlurmCommandError(SlurmError):
    """Slurm answered and refused: the message is Slurm's own."""

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr.strip()
        said = _one_line(self.stderr) or f"exit {returncode}"
        super().__init__(f"{' '.join(argv[:3])}...: {said}")


def _one_line(stderr: str) -> str:
    """Slurm's commands print a chain of `error:` lines ending in the one that matters (the
    `fatal:` one, else the last): that line, for a message that stays on one line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if "fatal:" in ln]
    return (fatal or lines or [""])[-1][:500]


class ShadowMode(SlurmCommandError):
    """A change asked of Slurm while [actions] enabled = false: refused at the door, never run.
    Every caller says "would ..." itself in shadow mode; this is for one that forgot."""


class RequeueRefused(SlurmCommandError):
    """The job cannot be requeued (submitted with --no-requeue, or JobRequeue=0)."""


class JobGone(SlurmCommandError):
    """The job left the node between the listing and the call (ended, completing, or already
    requeued and pending): nothing left to do to it."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    # Slurm's compound state as scontrol prints it, e.g. "MIXED+DRAIN", "IDLE", "DOWN*+DRAIN".
    state: str
    reason: str = ""
    reason_user: str = ""
    reason_time: datetime | None = None  # aware, UTC
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()  # AvailableFeatures
    weight: int = 1  # the scheduler fills lower weights first
    # The state Slurm gives the node when a reboot someone asked for completes (`scontrol
    # reboot nextstate=RESUME`: "RESUME", which lifts any drain, ours too); "" when none.
    next_state: str = ""
    # When the node last booted, as slurmd registered it (BootTime; aware, UTC; None when
    # Slurm printed none). It moves by a second or two when slurmd registers again without a
    # reboot (it sends its uptime in whole seconds).
    boot_time: datetime | None = None
    # ActiveFeatures, where a node_features plugin (knl_generic, helpers) makes them differ
    # from the available ones (modes that need a reboot); None: the same as `features`.
    active_features: tuple[str, ...] | None = None

    @property
    def active(self) -> tuple[str, ...]:
        return self.features if self.active_features is None else self.active_features

    @property
    def flags(self) -> set[str]:
        return {part.rstrip("*~#!%$@^-") for part in self.state.split("+")}

    @property
    def drain_set(self) -> bool:
        """DRAIN flag set: DRAINING (jobs still running) or DRAINED."""
        return "DRAIN" in self.flags or "DRAINED" in self.flags or "DRAINING" in self.flags

    @property
    def down(self) -> bool:
        return "DOWN" in self.flags or "FAIL" in self.flags

    @property
    def in_hand(self) -> str:
        """The reboot or power change Slurm holds for the node ("REBOOT_REQUESTED" after a
        person's `scontrol reboot ASAP`, "POWERING_DOWN"...), or "". Someone's plan for the
        node: a resume on top of it is not ours to send. scontrol prints the flag names,
        sinfo the one-character suffixes."""
        named = sorted(self.flags & _IN_HAND)
        if named:
            return named[0]
        # No flag name holds one of these characters.
        return next((_IN_HAND_SUFFIX[ch] for ch in self.state if ch in _IN_HAND_SUFFIX), "")


_IN_HAND = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_DOWN", "POWERING_DOWN",
                      "POWERED_DOWN", "POWERING_UP", "POWER_UP"})
# sinfo's state suffixes for the same (man sinfo, NODE STATE CODES).
_IN_HAND_SUFFIX = {"@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "!": "POWER_DOWN",
                   "%": "POWERING_DOWN", "~": "POWERED_DOWN", "#": "POWERING_UP"}


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str
    nodes: str = ""
    requeue: bool = True
    excluded: tuple[str, ...] = ()
    user: str = ""
    partition: str = ""
    extra: dict = field(default_factory=dict)
    # An array task's "<array job id>_<task id>", squeue's own name for it; "" for any other
    # job. The array's last task has the array's own id as its job id, and `scontrol requeue`
    # of that id requeues every task of the array, on every node.
    array_task: str = ""

    @property
    def target(self) -> str:
        """The id a change meant for this job alone (a requeue) names."""
        return self.array_task or self.job_id


class SlurmAPI(Protocol):
    def node(self, name: str) -> NodeInfo: ...

    def nodes(self, names: list[str] | None = None) -> list[NodeInfo]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def undrain(self, node: str) -> None: ...

    def requeue(self, job_id: str) -> None: ...

    def jobs_on_node(self, node: str) -> list[JobInfo]: ...

    def job(self, job_id: str) -> JobInfo | None: ...

    # Accounting (sacct, sacctmgr) is rsc_health.slurm.accounting's: the historian's loaders
    # stream Slurm's bytes, which this per-record interface would not.

