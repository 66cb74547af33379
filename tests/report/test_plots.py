from __future__ import annotations

import pandas as pd
import pytest

from rsc_health.report import plots
from rsc_health.report.data import ReportData, empty_frame

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


@pytest.mark.parametrize("section", sorted(plots.FIGURES))
def test_every_figure_draws_real_data(section, report_data, tmp_path):
    name, _caption, plot = plots.FIGURES[section]
    result = plot(getattr(report_data, section), tmp_path / name)
    assert result.has_data, result.note
    width, height = _png_size(result.path)
    assert width > 300 and height > 200


@pytest.mark.parametrize("section", sorted(plots.FIGURES))
def test_empty_section_gives_a_no_data_png_not_a_crash(section, tmp_path):
    name, _caption, plot = plots.FIGURES[section]
    result = plot(empty_frame(section), tmp_path / name)
    assert not result.has_data and result.note == "no data"
    assert _png_size(result.path)[0] > 0


@pytest.mark.parametrize("section", sorted(plots.FIGURES))
def test_malformed_section_gives_a_placeholder_naming_the_problem(section, tmp_path):
    name, _caption, plot = plots.FIGURES[section]
    garbage = pd.DataFrame({"unexpected": ["x", "y"]})
    result = plot(garbage, tmp_path / name)
    assert not result.has_data
    assert result.path.exists()


def test_mttf_without_measurements_still_draws_the_projection(report_data, tmp_path):
    only_projection = report_data.mttf.assign(mttf_hours=float("nan"))
    result = plots.mttf_by_size(only_projection, tmp_path / "mttf.png")
    assert result.has_data


def test_all_zero_feature_column_does_not_divide_by_zero(tmp_path):
    frame = pd.DataFrame({"node": ["a", "b"], "xid_cnt": [0, 0], "tickets": [0, 2]})
    result = plots.lemon_feature_cdfs(frame, tmp_path / "f.png")
    assert result.has_data


def test_report_data_validate_names_the_broken_section():
    data = ReportData(as_of=pd.Timestamp("2024-06-30").to_pydatetime())
    data.validate()
    data.mttf = pd.DataFrame({"gpus": [8]})
    with pytest.raises(ValueError, match="mttf"):
        data.validate()
