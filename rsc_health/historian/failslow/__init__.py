"""Fail-slow nodes: slow, not failed, judged against their own jobs' other nodes
(docs/failslow.md).

evidence.py  SuspectEvidence, the record the suspect tier consumes
core.py      the pure detector: detect_frame(samples, membership, steps, cfg)
recurring.py across jobs: a node off its peers from the start of job after job (its jobs'
             telemetry rollups), against the fleet's own rate of outlying nodes
load.py      detect(engine, now, cfg): the historian's telemetry, jobs and step times;
             rates(engine, now, cfg): the fleet's one-sweep excursions in that window
explain.py   one job's judgement node by node, for an operator (healthctl suspects job)
steps.py     per-rank step times: the JSON-lines drop file and NVRx straggler reports
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rsc_health.historian.failslow.core import detect_frame
from rsc_health.historian.failslow.evidence import SuspectEvidence

if TYPE_CHECKING:
    from datetime import datetime

    from sqlalchemy import Engine

    from rsc_health.historian.failslow.core import FleetRate


def detect(engine: Engine, now: datetime, cfg: Any) -> list[SuspectEvidence]:
    """Suspects from the last [failslow] lookback_min minutes of the historian."""
    from rsc_health.historian.failslow.load import detect as _detect

    return _detect(engine, now, cfg)


def across_judged(engine: Engine) -> datetime | None:
    """When `detect` last judged across jobs ([failslow] recurring_every_min), None: never, or
    a kept time that is not one."""
    from rsc_health.historian.failslow.load import last_across

    return last_across(engine)


def fleet_rates(engine: Engine, now: datetime, cfg: Any) -> list[FleetRate]:
    """Each judged metric's one-sweep excursions in the window `detect` reads at `now` (what
    `fleet_chance` judges a run against)."""
    from rsc_health.historian.failslow.load import rates

    return rates(engine, now, cfg)


__all__ = ["SuspectEvidence", "across_judged", "detect", "detect_frame", "fleet_rates"]
