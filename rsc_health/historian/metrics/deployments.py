"""When each check family went into service: the markers on the rolling failure rate (Fig. 5).

The paper reads jumps in Fig. 5 against the days new health checks were added: a check that
starts running finds failures that were there all along, so the measured rate steps up with
it. rsc-health's node path records an all-clear interval per family (component "*", status ok;
`rsc_health.historian.intervals`), so a family's first `ok` row is the day it first ran on the
fleet. A
family already running when the check history begins was not "added"; only one whose first
all-clear row comes `min_delay` after the history's first row is. History imported from tools
that record only failures has no all-clear rows, and so no markers.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
from sqlalchemy import Engine, func, select

from rsc_health.historian.metrics._sql import ALL_TIME, Window
from rsc_health.historian.schema import check_results
from rsc_health.model import Status

COLUMNS = ("check", "time")


def check_deployments(
    engine: Engine, window: Window = ALL_TIME, min_delay: timedelta = timedelta(days=1)
) -> pd.DataFrame:
    """One row per check family that began running inside the window: (check, time)."""
    t = check_results
    with engine.connect() as conn:
        history_start = conn.execute(select(func.min(t.c.time))).scalar()
        if history_start is None:
            return pd.DataFrame(columns=list(COLUMNS))
        rows = [(family, first) for family, first in _first_ok(conn)
                if first is not None and first >= history_start + min_delay
                and (window.since is None or first >= window.since)
                and (window.until is None or first < window.until)]
    # Families come in the database's order of names (its collation), so a stable sort by
    # time is the ORDER BY time, check this was.
    frame = pd.DataFrame(sorted(rows, key=lambda r: r[1] or datetime.min),
                         columns=list(COLUMNS))
    frame["time"] = pd.to_datetime(frame["time"])
    return frame


def _first_ok(conn) -> list[tuple[str, datetime | None]]:
    """Each check family and the time of its first all-clear row (None without one), two
    probes of ix_check_results_check_status_time (schema 19) a family: the next family name
    after the last, then its first `ok` row. A GROUP BY over the ok rows read every one of
    them: at a year of sweeps the table is millions of intervals, most of them all-clear
    (0.85 s a night on PostgreSQL at 16,000 nodes), for a dozen families."""
    t = check_results
    out: list[tuple[str, datetime | None]] = []
    family = conn.execute(select(func.min(t.c.check))).scalar()
    while family is not None:
        first = conn.execute(
            select(func.min(t.c.time)).where(t.c.check == family, t.c.status == Status.OK)
        ).scalar()
        out.append((family, first))
        family = conn.execute(select(func.min(t.c.check)).where(t.c.check > family)).scalar()
    return out
