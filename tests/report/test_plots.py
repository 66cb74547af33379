from __future__ import annotations

import matplotlib.dates as mdates
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


def test_fig5_marks_the_day_each_check_began_running(report_data, tmp_path):
    draw = plots.rolling_failure_rate.__wrapped__
    deployed = report_data.deployments["time"].iloc[0]
    outside = pd.DataFrame({"check": ["nvlink", "pcie"],
                            "time": [deployed, report_data.as_of + pd.Timedelta(days=400)]})

    fig = draw(report_data.rolling, "Fig. 5", deployments=outside)

    ax = fig.axes[0]
    # The total panel: its rate is a solid line, each deployment a dashed one.
    marked = [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--"]
    assert len(marked) == 1  # the deployment off the plotted days is not drawn
    x = marked[0]
    x = mdates.num2date(x).replace(tzinfo=None) if isinstance(x, float) else x
    assert pd.Timestamp(x) == deployed
    assert [t.get_text() for t in ax.texts] == ["+nvlink"]
    plt = plots._pyplot()
    plt.close(fig)
    # And through the registry, as render calls it.
    name, _caption, plot = plots.FIGURES["rolling"]
    context = {s: getattr(report_data, s) for s in plots.CONTEXT["rolling"]}
    assert plot(report_data.rolling, tmp_path / name, **context).has_data


@pytest.mark.parametrize("section", sorted(plots.FIGURES))
def test_figures_are_legible_at_page_size(section, report_data):
    """Issue 14: fonts readable at the size the page shows, legends off the data, few series
    per panel, and a y axis that says what it counts."""
    draw = plots.FIGURES[section][2].__wrapped__
    context = {s: getattr(report_data, s) for s in plots.CONTEXT.get(section, ())}
    plt = plots._pyplot()
    with plt.rc_context(plots.STYLE):
        fig = draw(getattr(report_data, section), "title", **context)
        fig.canvas.draw()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    shown_px = 520 if section not in plots.WIDE else 1040  # the page's column width
    scale = shown_px / (fig.get_figwidth() * plots.DPI)
    for ax in axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(),
                 *ax.get_yticklabels()]
        for text in texts:
            if text.get_visible() and text.get_text():
                px = text.get_fontsize() * plots.DPI / 72 * scale
                assert px >= 11, (section, text.get_text(), px)
        solid = [line for line in ax.lines if line.get_linestyle() not in ("--", "None")]
        assert len(solid) + len(ax.collections) <= 4, (section, len(solid))
        # Every panel says what it plots: a y label on the row's first panel, else a title.
        assert ax.get_ylabel() or ax.get_title(loc="left") or ax.get_yticklabels(), section
    for legend in [*fig.legends, *(ax.get_legend() for ax in axes if ax.get_legend())]:
        box = legend.get_window_extent()
        for ax in axes:
            assert not box.overlaps(ax.get_window_extent()), (section, "legend over data")
    plt.close(fig)
