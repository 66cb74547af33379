"""What differs per entry point (a `Stage`), one run's context, and how far a run got
(`Progress`, for whoever has to end it early: a fault, the watchdog)."""

from __future__ import annotations

import os

from rsc_health.record import dataclass

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable

    from rsc_health.config import Config
    from rsc_health.engine import InFlight
    from rsc_health.model import Verdict
    from rsc_health.slurm.api import SlurmAPI


@dataclass(frozen=True)
class Stage:
    name: str  # prolog | epilog | sweep
    families_key: str | None  # [slurm] key listing the families, None = all
    budget_key: str
    # DRAIN_NOW requeues the node's jobs: every stage's, the prolog's and epilog's own job
    # excepted (Slurm requeues the job whose prolog failed; the epilog's is ending). The prolog
    # once requeued none, and a job already running on the node, or one whose prolog waited
    # on the lock while this one drained, ran on for good on the GPU that fell off the bus:
    # no later run finds the XID it consumed (helper-122, on the real Slurm).
    requeue: bool
    counts_as_clean: bool  # a clean run counts towards auto-resume (only the sweep)


STAGES = {
    "prolog": Stage("prolog", families_key="slurm.prolog_families",
                    budget_key="slurm.prolog_budget_s", requeue=True, counts_as_clean=False),
    "epilog": Stage("epilog", families_key="slurm.epilog_families",
                    budget_key="slurm.epilog_budget_s", requeue=True, counts_as_clean=False),
    "sweep": Stage("sweep", families_key=None, budget_key="slurm.sweep_budget_s",
                   requeue=True, counts_as_clean=True),
}


@dataclass
class Context:
    stage: Stage
    cfg: Config
    root: str | os.PathLike
    node: str
    sdir: str | os.PathLike
    started: float
    deadline: float
    job_id: str | None
    slurm_factory: Callable[[Config, float | None], SlurmAPI]


def job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")


# The watchdog's first arming when not even the packaged defaults can be read (a broken
# install): the run still ends, with a safe exit code, however long its config takes.
UNREADABLE_DEFAULTS_BUDGET_S = 60.0


def budget(cfg: Config | None, stage: Stage) -> float:
    """The stage's budget in seconds: the config's, or before one is read (the watchdog's first
    arming; a config on a hung mount must not hold the prolog either) the packaged default."""
    from rsc_health.config import packaged_default

    for source in (cfg, None):
        try:
            value = source.get(stage.budget_key) if source is not None else \
                packaged_default(stage.budget_key)
            return max(1.0, float(value))
        except Exception:  # noqa: BLE001 - a budget must come out of this, whatever is broken
            continue
    return UNREADABLE_DEFAULTS_BUDGET_S


def drain_exit() -> int:
    """The prolog's exit code for a drain verdict: 1 (what slurmd drains on), or the code the
    shipped wrapper asks for (RSC_HEALTH_DRAIN_EXIT) so it can tell a verdict from a Python that
    could not even start, and turn only the verdict into 1."""
    try:
        code = int(os.environ.get("RSC_HEALTH_DRAIN_EXIT", "1"))
    except ValueError:
        return 1
    return code if 1 <= code <= 125 else 1


@dataclass
class Progress:
    """How far this run got, for whoever has to end it early (a fault, the watchdog): which
    step was running, where the spool is, and whether a drain verdict is already in hand."""

    stage: Stage
    started: float
    job_id: str | None
    step: str = "start"
    cfg: Config | None = None
    node: str | None = None
    sdir: str | os.PathLike | None = None
    verdict: Verdict | None = None
    spooled: bool = False
    acted: bool = False
    # The exit code acting on the verdict chose (set with acted): what the run leaves with,
    # whatever strikes after it (the textfile on a hung mount, a fault remembering the config).
    exit_code: int | None = None
    # The site config is broken and this run judges with the last good one: why, in words.
    config_error: str = ""
    parsed: bytes | None = None  # the site file's bytes, when this run parsed them
    # The checks' collection as far as it got (engine.InFlight): what the watchdog judges
    # when it ends a run before the verdict step.
    inflight: InFlight | None = None
    # The verdict in hand is the pending one already on disk (the watchdog's, from a pending
    # verdict alone): kept as it is, not saved again as a fault's.
    kept: bool = False

    @property
    def unacted_drain(self) -> bool:
        """A drain verdict is in hand, not yet carried out, and actions are on."""
        return bool(self.verdict is not None and self.verdict.drains and not self.acted
                    and self.cfg is not None and self.cfg.get("actions.enabled"))

    def safe_exit(self) -> int:
        """The code acting on the verdict chose, once it has; before that 0 (let the job run,
        leave the node alone) unless this is a prolog with an unacted drain verdict: then the
        drain code, so slurmd drains the node and requeues the job, which is what the verdict
        asked for."""
        if self.acted and self.exit_code is not None:
            return self.exit_code
        return drain_exit() if self.unacted_drain and self.stage.name == "prolog" else 0
