"""Pieces shared by the metric queries: time arithmetic per dialect, the infra-failure rule,
the reporting window, size buckets and the Gamma/Poisson interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from scipy import stats
from sqlalchemy import Float, and_, case, exists, literal, or_, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement

from rsc_health.historian.attribute import HOST_FAIL_STATES
from rsc_health.historian.schema import attributions, jobs

SECONDS_PER_DAY = 86400.0
DEFAULT_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class seconds_between(FunctionElement):  # noqa: N801 - reads like the SQL function it emits
    """b - a in seconds, computed inside the database (no portable SQL spelling exists)."""

    type = Float()
    inherit_cache = True


@compiles(seconds_between)
def _seconds_pg(element, compiler, **kw):
    a, b = (compiler.process(c, **kw) for c in element.clauses)
    return f"EXTRACT(EPOCH FROM ({b} - {a}))"


@compiles(seconds_between, "sqlite")
def _seconds_sqlite(element, compiler, **kw):
    # julianday() is a double of ~2.46e6 days: its differences carry ~2e-5 s of noise (a 2 s
    # job came out 2.00003 s). SQLite's date functions resolve milliseconds, so round to them.
    a, b = (compiler.process(c, **kw) for c in element.clauses)
    return f"ROUND((julianday({b}) - julianday({a})) * 86400.0, 3)"


class shifted(FunctionElement):  # noqa: N801
    """A timestamp moved by a number of seconds, inside the database.

    The seconds travel as a bound parameter, so the cached compiled SQL is shared safely.
    """

    inherit_cache = True

    def __init__(self, ts, seconds: float):
        super().__init__(ts, literal(float(seconds), Float()))


@compiles(shifted)
def _shifted_pg(element, compiler, **kw):
    ts, secs = (compiler.process(c, **kw) for c in element.clauses)
    return f"({ts} + make_interval(secs => {secs}))"


@compiles(shifted, "sqlite")
def _shifted_sqlite(element, compiler, **kw):
    # The text SQLAlchemy stores, "YYYY-MM-DD HH:MM:SS.ffffff" (six decimals, as
    # attribute._shift makes it), so a text comparison holds at the edge: strftime's %f gives
    # three ("SS.fff", all SQLite's date functions resolve), and "...00.000" sorted before the
    # stored "...00.000000" of the same instant, so `<=` the shifted time left that instant out.
    ts, secs = (compiler.process(c, **kw) for c in element.clauses)
    return f"(strftime('%Y-%m-%d %H:%M:%f', {ts}, {secs} || ' seconds') || '000')"


def runtime_s() -> ColumnElement:
    """Scheduled runtime of a job instance; 0 for instances that never started."""
    return case((jobs.c.start.is_(None), 0.0), else_=seconds_between(jobs.c.start, jobs.c.end))


def infra_attributed() -> ColumnElement:
    """The instance has an attribution to a health check or node event (not 'unattributed')."""
    return exists(
        select(attributions.c.id).where(
            attributions.c.job_pk == jobs.c.id, attributions.c.kind != "unattributed"
        )
    )


def infra_failure() -> ColumnElement:
    """The paper's hardware failure: NODE_FAIL, or FAILED with an attributed health check.

    A REQUEUED instance with an attributed check counts too: that is what a job killed by a
    drain-now looks like in `sacct -D` once rsc-health has requeued it."""
    return or_(
        jobs.c.state.in_(HOST_FAIL_STATES),
        and_(jobs.c.state.in_(("FAILED", "REQUEUED")), infra_attributed()),
    )


@dataclass(frozen=True)
class Window:
    """Jobs that ENDED in [since, until); open ends are unbounded. Running jobs never count.
    With `cluster`, only that Slurm cluster's jobs (several clusters in one historian)."""

    since: datetime | None = None
    until: datetime | None = None
    cluster: str | None = None

    def clauses(self) -> list[ColumnElement]:
        out = [jobs.c.end.is_not(None)]
        if self.cluster is not None:
            out.append(jobs.c.cluster == self.cluster)
        if self.since is not None:
            out.append(jobs.c.end >= self.since)
        if self.until is not None:
            out.append(jobs.c.end < self.until)
        return out


ALL_TIME = Window()


def rounded_gpus() -> ColumnElement:
    """GPUs rounded up to the next multiple of 8 (paper Fig. 7); integer division in SQL."""
    return ((jobs.c.gpus + 7) // 8) * 8


def bucket_of(gpus: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """Smallest bucket >= gpus; the last bucket is open-ended ("2048+")."""
    for b in buckets:
        if gpus <= b:
            return b
    return buckets[-1]


def bucket_label(b: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> str:
    return f"{b}+" if b == buckets[-1] else str(b)


def poisson_rate_ci(k: int, exposure: float, confidence: float = 0.9) -> tuple[float, float]:
    """Two-sided CI of a Poisson rate from k events over `exposure`, via the Gamma distribution
    (equivalently chi-square): [Gamma(k).ppf(a), Gamma(k+1).ppf(1-a)] / exposure."""
    if exposure <= 0:
        return (math.nan, math.nan)
    a = (1.0 - confidence) / 2.0
    lo = 0.0 if k == 0 else float(stats.gamma.ppf(a, k)) / exposure
    hi = float(stats.gamma.ppf(1.0 - a, k + 1)) / exposure
    return lo, hi
