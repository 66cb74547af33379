""""Out of service now" reconciles rsc-health's own actions with Slurm's node events, which lag
(issue 26, true answers 2): a node `healthctl resume` brought back 20 s ago is not listed; a
drain rsc-health recorded shows before Slurm's event arrives. On a historian filled as the
operator fills it (spool flush, `healthctl ingest events`), then `healthctl report`."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from rsc_health.historian.db import connect
from rsc_health.model import ActionKind
from rsc_health.report import morning
from tests.historian.conftest import historian_url, pg_url  # noqa: F401 - fixtures
from tests.historian.operator_history import (
    action_record,
    flush,
    healthctl,
    ingest_events,
    iso,
    run_records,
    xid_findings,
    xid_line,
)

# Everything here but the figures: they are drawn and checked in test_plots/test_render.
pytestmark = pytest.mark.usefixtures("figures_not_drawn")

AS_OF = datetime(2026, 11, 20, 12, 0, 0)
GPUS = {"00000000:1A:00.0": 1, "00000000:5D:00.0": 3}


def _history(url: str, tmp_path) -> None:
    spool_dir = tmp_path / "spool"
    x79 = xid_findings([xid_line("0000:5d:00", 79, "GPU has fallen off the bus.")], GPUS)
    # gpu010: drained by rsc-health two hours ago; repaired; `healthctl resume` 20 s ago.
    flush(url, spool_dir, run_records("gpu010", AS_OF - timedelta(hours=2), "sweep", x79))
    flush(url, spool_dir, [action_record("gpu010", AS_OF - timedelta(seconds=20),
                                         ActionKind.RESUME, "GPU replaced")])
    # gpu011: drained by rsc-health 30 s ago; no event ingested yet.
    flush(url, spool_dir, run_records("gpu011", AS_OF - timedelta(seconds=30), "sweep", x79))
    # gpu013: resumed by rsc-health three hours ago, drained by a person an hour ago.
    flush(url, spool_dir, [action_record("gpu013", AS_OF - timedelta(hours=3),
                                         ActionKind.RESUME, "cable reseated")])
    # sacctmgr as the ingest timer saw it 5 minutes ago: gpu010's drain still open.
    ingest_events(url, tmp_path, [
        f"rsc|gpu010|{iso(AS_OF - timedelta(hours=2))}|Unknown|DRAIN|"
        "rsc_health:now:xid79:gpu3 XID 79 GPU has fallen off the bus|root(0)",
        f"rsc|gpu012|{iso(AS_OF - timedelta(hours=1))}|Unknown|DOWN|Not responding|"
        "slurm(64030)",
        f"rsc|gpu013|{iso(AS_OF - timedelta(hours=1))}|Unknown|DRAIN|PSU swap|jdoe(1001)",
    ])


def test_a_resume_20_s_ago_is_not_out_and_our_drain_shows_before_its_event(
        historian_url, tmp_path):  # noqa: F811
    _history(historian_url, tmp_path)
    engine = connect(historian_url, create_missing=True)
    try:
        out = morning.out_of_service(engine, AS_OF)
    finally:
        engine.dispose()
    rows = {r["node"]: r for r in out.to_dict("records")}
    assert sorted(rows) == ["gpu011", "gpu012", "gpu013"]  # gpu010 resumed 20 s ago
    assert rows["gpu011"]["source"] == "rsc-health action"
    assert rows["gpu011"]["reason"].startswith("rsc_health:now:xid79:")
    assert rows["gpu012"]["state"] == "DOWN" and rows["gpu013"]["reason"] == "PSU swap"

    report = tmp_path / "report"
    healthctl(historian_url, "report", "--out", str(report), "--as-of", iso(AS_OF))
    doc = json.loads((report / "report.json").read_text())
    assert sorted(r["node"] for r in doc["out_of_service"]) == ["gpu011", "gpu012", "gpu013"]
    assert doc["headline"]["out_of_service"] == 3
