"""One GPU name everywhere (issue 26, true answers 4): a GPU is `gpu1 (0000:1a:00.0)` in the
report and in `healthctl node`, whether a finding knew its index (a row remap on gpu1) or only
its bus id (XID 79 from a GPU that fell off the bus, which NVML then no longer lists). The
node's heartbeat says which bus id each index has; `healthctl spool flush` keeps it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from rsc_health.gpuname import GpuNames, bus_id, label
from rsc_health.model import Finding, Severity, Status
from tests.historian.conftest import historian_url, pg_url  # noqa: F401 - fixtures
from tests.historian.operator_history import (
    flush,
    healthctl,
    iso,
    run_records,
    xid_findings,
    xid_line,
)

# Everything here but the figures: they are drawn and checked in test_plots/test_render.
pytestmark = pytest.mark.usefixtures("figures_not_drawn")

AS_OF = datetime(2026, 11, 20, 12, 0, 0)
GPUS = {"00000000:1A:00.0": 1, "00000000:5D:00.0": 3}
ONE = "gpu1 (0000:1a:00.0)"


def _history(url: str, tmp_path) -> None:
    spool_dir = tmp_path / "spool"
    remap = Finding("remap", "gpu1", Status.FAIL, Severity.DRAIN_AFTER_JOB,
                    "gpu1 row remapping pending", "remap_pending")
    # Half an hour ago NVML listed both GPUs; gpu1 had a row remap pending.
    flush(url, spool_dir, run_records("gpu050", AS_OF - timedelta(minutes=30), "sweep",
                                      [remap], shadow=True, gpus=GPUS))
    # Five minutes ago gpu1 fell off the bus: NVML lists gpu3 only, so the XID names the bus.
    x79 = xid_findings([xid_line("0000:1a:00", 79, "GPU has fallen off the bus.")],
                       {"00000000:5D:00.0": 3})
    assert [f.component for f in x79] == ["0000:1a:00"]
    flush(url, spool_dir, run_records("gpu050", AS_OF - timedelta(minutes=5), "sweep",
                                      [*x79, remap], shadow=True,
                                      gpus={"00000000:5D:00.0": 3}))


def test_the_report_and_the_node_view_name_a_gpu_one_way(historian_url, tmp_path):  # noqa: F811
    _history(historian_url, tmp_path)
    out = tmp_path / "report"
    healthctl(historian_url, "report", "--out", str(out), "--as-of", iso(AS_OF), "-q")
    doc = json.loads((out / "report.json").read_text())
    assert [(r["node"], r["gpu"]) for r in doc["xids"]] == [("gpu050", ONE)]
    assert [r["component"] for r in doc["open_findings"]] == [ONE]
    html = (out / "report.html").read_text()
    assert "0000:1a:00<" not in html and "gpu1<" not in html and html.count(ONE) == 2

    view = json.loads(healthctl(historian_url, "node", "gpu050", "--as-of", iso(AS_OF),
                                "--json"))
    assert {o["component"] for o in view["historian"]["open_findings"]} == {ONE}
    text = healthctl(historian_url, "node", "gpu050", "--as-of", iso(AS_OF))
    failing = text[text.index("  failing"):text.index("  actions")]
    assert f"remap      {ONE}" in failing
    # The actions keep the reason Slurm was given, verbatim (the node wrote it): a record of
    # what was said, not a name the view may rewrite.
    assert "rsc_health:now:xid79:0000:1a:00 XID 79" in text


def test_every_spelling_of_a_bus_id_is_one_and_garbage_is_no_gpu():
    for spelling in ("00000000:1A:00.0", "0000:1a:00", "PCI:0000:1a:00", "1a:00.0"):
        assert bus_id(spelling) == "0000:1a:00.0"
    for bad in ("", "gpu1", "mlx5_0/1", "0000:1a", "1ffff0000:1a:00.0", None, 7, "1a:00.9"):
        assert bus_id(bad) is None
    names = GpuNames({1: "00000000:1A:00.0", 2: "not a bus id"})
    assert names.name("gpu1") == names.name("0000:1a:00") == names.name(ONE) == ONE
    assert names.name("gpu2") == "gpu2"  # its bus id was garbage: the half it has
    assert names.name("0000:3b:00") == "0000:3b:00.0"  # a GPU never reported: its bus id
    assert names.name("mlx5_0/1") == "mlx5_0/1" and names.name("*") == "*"
    assert label(None, None) == "gpu?" and label(4, None) == "gpu4"
