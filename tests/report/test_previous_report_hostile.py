"""Last night's report.json is read back from the report directory, which a group may share
(sticky): whatever stands at that name (a FIFO, a symlink to /dev/zero, valid JSON of another
shape) must leave tonight's report a first night's, never hang it or stop it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

from .test_command import _config
from .test_gather import engine  # noqa: F401 - the populated-historian fixture

# Everything here but the figures: they are drawn and checked in test_plots/test_render.
pytestmark = pytest.mark.usefixtures("figures_not_drawn")


def _report_within(db_url: str, config: Path, out: Path, seconds: float = 60.0):
    """healthctl report in a thread; a run still going after `seconds` is a hang (a FIFO at
    report.json is then opened for writing, so the thread can end)."""
    box: dict = {}

    def run() -> None:
        box["result"] = CliRunner().invoke(
            cli, ["--config", str(config), "--db", db_url, "report", "--out", str(out),
                  "--as-of", "2024-06-30", "-q"])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        fifo = out / "report.json"
        if fifo.is_fifo():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"healthctl report still running after {seconds:.0f} s")
    return box["result"]


def test_a_fifo_at_last_nights_report_json_does_not_hang_the_report(
        engine, tmp_path):  # noqa: F811
    out = tmp_path / "report"
    out.mkdir()
    os.mkfifo(out / "report.json")
    result = _report_within(str(engine.url), _config(tmp_path), out)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "report.json").read_text())  # replaced by tonight's file
    assert doc["changes"]["previous_as_of"] is None
    assert [r["node"] for r in doc["lemons"]] == ["gpu001"]


def test_a_symlink_to_dev_zero_at_report_json_is_not_read(engine, tmp_path):  # noqa: F811
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").symlink_to("/dev/zero")
    result = _report_within(str(engine.url), _config(tmp_path), out)
    assert result.exit_code == 0, result.output
    assert not (out / "report.json").is_symlink()
    assert json.loads((out / "report.json").read_text())["changes"]["previous_as_of"] is None


@pytest.mark.parametrize("previous", [
    [1, 2, 3],
    "a string",
    42,
    {"as_of": "2024-06-29 00:00:00", "lemons": 5},
    {"as_of": "2024-06-29 00:00:00", "lemons": "gpu001"},
    {"as_of": "2024-06-29 00:00:00", "lemons": {"gpu001": 1}},
    {"as_of": ["2024-06-29"], "lemons": []},
    {"as_of": "2024-06-29 00:00:00", "lemons": [{"node": "gpu001", "days_listed": 1e308}]},
], ids=["list", "string", "number", "lemons-int", "lemons-str", "lemons-object",
        "as_of-list", "days-float"])
def test_last_nights_report_json_of_another_shape_is_a_first_night(
        engine, tmp_path, previous):  # noqa: F811
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(previous))
    result = _report_within(str(engine.url), _config(tmp_path), out)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "report.json").read_text())
    assert [r["node"] for r in doc["lemons"]] == ["gpu001"]
    assert all(isinstance(r["days_listed"], int) for r in doc["lemons"])
