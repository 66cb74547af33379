"""Names in a figure are the user's text, shown as written: matplotlib reads `$...$` in any
title, label or tick as math markup, so a check or cause named with a `$` drew as math, and
one whose markup did not parse (`$\\frac{$`) failed the whole figure (the page got a
placeholder instead)."""

from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.text import Text

from rsc_health.report import plots

NAMES = ["ecc$dbe", "a$b$c", "x_1^2", "back\\slash", "$\\frac{$", "p\\$q", "^_^"]


def _with_names(report_data, section: str) -> tuple[pd.DataFrame, dict, list[str]]:
    frame = getattr(report_data, section).copy()
    context = {s: getattr(report_data, s) for s in plots.CONTEXT.get(section, ())}
    if section == "causes":
        names = NAMES[: len(frame)]
        frame["cause"] = names + list(frame["cause"][len(names):])
    elif section == "outcomes":
        names = NAMES[: len(frame)]
        frame["state"] = names + list(frame["state"][len(names):])
    elif section == "rolling":
        modes = sorted(frame["mode"].unique())
        names = NAMES[: len(modes)]
        frame["mode"] = frame["mode"].map(dict(zip(modes, names, strict=False))).fillna(
            frame["mode"])
        # A deployment mark is labelled with its check's name.
        context["deployments"] = context["deployments"].assign(check=names[0])
    elif section == "features":
        extras = [c for c in frame.columns if c not in plots.PAPER_FEATURES and c != "node"]
        names = NAMES[: len(extras)]
        frame = frame.rename(columns=dict(zip(extras, names, strict=False)))
    return frame, context, names


@pytest.mark.parametrize("section", ["causes", "outcomes", "rolling", "features"])
def test_names_with_markup_characters_draw_as_written(section, report_data, tmp_path):
    frame, context, names = _with_names(report_data, section)
    name, _caption, plot = plots.FIGURES[section]
    result = plot(frame, tmp_path / name, **context)
    assert result.has_data, result.note

    plt = plots._pyplot()
    with plt.rc_context(plots.STYLE):
        fig = plots.FIGURES[section][2].__wrapped__(frame, "title", **context)
        fig.canvas.draw()
    # What each text shows: matplotlib's own reading of it (markup or not, and the text).
    shown = [t._preprocess_math(t.get_text()) for t in fig.findobj(Text) if t.get_text()]
    plt.close(fig)
    # Only matplotlib's own log-scale tick labels ($\mathdefault{10^{-6}}$) are markup.
    assert not [s for s, math in shown if math and "mathdefault" not in s], shown
    for n in names:
        assert any(n in s for s, _math in shown), (n, shown)


def test_a_placeholder_naming_a_problem_with_markup_characters_still_draws(tmp_path):
    path = plots._no_data(tmp_path / "p.png", "title $x", "cannot plot: KeyError: '$\\frac{$'")
    assert path.read_bytes()[:4] == b"\x89PNG"
