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

from datetime import timedelta

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
        first_ok = (
            select(t.c.check, func.min(t.c.time).label("time"))
            .where(t.c.status == Status.OK)
            .group_by(t.c.check)
            .subquery()
        )
        q = select(first_ok.c.check, first_ok.c.time).where(
            first_ok.c.time >= history_start + min_delay
        )
        if window.since is not None:
            q = q.where(first_ok.c.time >= window.since)
        if window.until is not None:
            q = q.where(first_ok.c.time < window.until)
        rows = conn.execute(q.order_by(first_ok.c.time, first_ok.c.check)).all()
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["time"] = pd.to_datetime(frame["time"])
    return frame
