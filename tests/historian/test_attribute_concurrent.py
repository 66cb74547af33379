"""Two `healthctl attribute` runs at once (the hourly timer's and an operator's): each deletes
its targets' rows and inserts them again in one transaction. On PostgreSQL under READ
COMMITTED the second's DELETE, waiting on the first, does not see the rows the first
inserted, and both sets stayed: every attribution twice (11 rows for 7 measured on the
simulator's month, four runs at once), each failed job's evidence listed twice in triage, the
report and `healthctl node`. The runs now take turns."""

from __future__ import annotations

import threading

from sqlalchemy import func, select

from rsc_health.historian import schema
from rsc_health.historian.attribute import attribute
from rsc_health.historian.db import connect

from .test_attribute import END, _check, _job


def test_attribution_runs_at_once_leave_each_attribution_once(historian_url, historian):
    with historian.begin() as conn:
        for pk in range(1, 41):
            _job(conn, pk, "FAILED", [f"n{pk}"])
            _check(conn, f"c{pk}", f"n{pk}", END)
    engines = [connect(historian_url, create_missing=True) for _ in range(4)]
    start = threading.Barrier(len(engines))
    errors: list[BaseException] = []

    def run(engine):
        try:
            start.wait()
            for _ in range(3):
                attribute(engine)
        except BaseException as exc:  # noqa: BLE001 - said below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for e in engines:
        e.dispose()
    assert not errors, errors
    a = schema.attributions
    with historian.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(a)).scalar()
        distinct = conn.execute(select(func.count()).select_from(
            select(a.c.job_pk, a.c.node, a.c.cause).distinct().subquery())).scalar()
    assert (rows, distinct) == (40, 40)
