"""One PNG per paper figure. Every function takes its section's DataFrame and an output path,
writes the PNG and returns the path. Empty data gives a "no data" figure, never an exception.

matplotlib is imported lazily (and forced to the Agg backend) so importing this module is cheap
and a report can run on a headless management host.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rsc_health.historian.lemons.features import PAPER_FEATURES

# Sized for the page: a figure in the two-column grid shows about 520 px wide, so it is drawn
# at 640 px with fonts that stay >= 11 px on screen; small multiples span both columns (WIDE).
FIGSIZE = (6.4, 3.9)
WIDE_WIDTH = 10.4
DPI = 100
STYLE = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "figure.titlesize": 13,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "0.9",
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
}
# Small multiples: panels per row, and each panel's height in inches.
PANEL_COLUMNS = 4
PANEL_HEIGHT = 1.9

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plot:
    """A written PNG; `has_data` is False for a "no data" placeholder, `note` says why."""

    path: Path
    has_data: bool = True
    note: str = ""


class _NoData(Exception):
    """Raised inside a plot function when there is nothing to draw."""


def figure(title: str):
    """Turn a drawing function into a plot function that always writes a PNG.

    Empty input (`_NoData`) and malformed input (any error while drawing) both give a
    placeholder with the reason, so one bad section never stops the nightly report.
    """

    def wrap(draw: Callable) -> Callable[[pd.DataFrame, Path], Plot]:
        @functools.wraps(draw)
        def plot(frame: pd.DataFrame, path: Path, **context: pd.DataFrame) -> Plot:
            path = Path(path)
            plt = _pyplot()
            with plt.rc_context(STYLE):
                try:
                    fig = draw(frame, title, **context)
                except _NoData:
                    return Plot(_no_data(path, title), False, "no data")
                except Exception as exc:  # the report must still be written
                    plt.close("all")
                    log.warning("cannot plot %s: %s", title, exc)
                    note = f"cannot plot: {type(exc).__name__}: {exc}"
                    return Plot(_no_data(path, title, note[:120]), False, note)
                return Plot(_save(fig, path), True)

        return plot

    return wrap


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """The PNG drawn in memory and written by durable.write_atomic (savefig would open the
    path itself, following a symlink planted there)."""
    import io

    from rsc_health.durable import write_atomic

    if fig.get_layout_engine() is None:
        fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=DPI, format="png")
    _pyplot().close(fig)
    write_atomic(path, png.getvalue(), sync_dir=False)
    return path


def _figure(figsize=FIGSIZE, **kw):
    """A constrained-layout figure: legends placed outside the axes keep their room."""
    return _pyplot().subplots(figsize=figsize, layout="constrained", **kw)


def _legend_below(fig, ncol: int) -> None:
    """The legend in a row under the x label, outside the data: it never covers a bar or a
    point (and, unlike one above the axes, never collides with the title)."""
    fig.legend(loc="outside lower center", ncol=ncol, frameon=False)


def _sizes_axis(ax, sizes) -> None:
    """A log2 job-size axis labelled 8, 16, 32 ... (not 2^3, 2^4, ...)."""
    from matplotlib.ticker import NullFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted({int(v) for v in sizes})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _plain(text: object) -> str:
    """User text (a check, cause, state or feature name; an error message) as matplotlib
    shows it written: an unescaped `$` pair is math markup to it, drawn as math or, when it
    does not parse, failing the whole figure. Escaped, every `$` is read as none and shown as
    `$`; underscores, carets and backslashes mean nothing outside markup."""
    return str(text).replace("$", r"\$")


def _no_data(path: Path, title: str, why: str = "no data") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], 2.2))
    ax.set_title(_plain(title))
    ax.text(0.5, 0.5, _plain(why), ha="center", va="center", fontsize=14, color="0.4",
            transform=ax.transAxes)
    ax.set_axis_off()
    return _save(fig, path)


def _numeric(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """Coerce columns to numbers and drop rows where any is missing."""
    out = frame.copy()
    for column in columns:
        # A missing column reads as all-missing: the figure says "no data" instead of crashing.
        values = out[column] if column in out.columns else pd.Series(np.nan, index=out.index)
        out[column] = pd.to_numeric(values, errors="coerce")
    return out.dropna(subset=list(columns))


def _numeric_columns(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """Coerce optional columns to numbers (missing ones become NaN), keeping every row."""
    out = frame.copy()
    for column in columns:
        values = out[column] if column in out.columns else pd.Series(np.nan, index=out.index)
        out[column] = pd.to_numeric(values, errors="coerce")
    return out


@figure("Job outcomes by count and GPU-hours (Fig. 3)")
def job_outcomes(frame: pd.DataFrame, title: str):
    """Fig. 3: share of jobs and of GPU-hours per final Slurm state."""
    data = _numeric(frame, "jobs", "gpu_hours")
    if data.empty or data["jobs"].sum() <= 0:
        raise _NoData
    data = data.groupby("state", as_index=False)[["jobs", "gpu_hours"]].sum()
    data = data.sort_values("jobs", ascending=False)
    fig, ax = _figure((FIGSIZE[0], max(FIGSIZE[1], 1.2 + 0.32 * len(data))))
    y = np.arange(len(data))
    jobs_pct = 100 * data["jobs"] / data["jobs"].sum()
    hours_total = data["gpu_hours"].sum()
    hours_pct = 100 * data["gpu_hours"] / hours_total if hours_total > 0 else 0 * jobs_pct
    ax.barh(y - 0.2, jobs_pct, height=0.4, label="share of jobs")
    ax.barh(y + 0.2, hours_pct, height=0.4, label="share of GPU-hours")
    ax.set_yticks(y, [_plain(state) for state in data["state"]])
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("share of all jobs / GPU-hours (%)")
    fig.suptitle(title)
    _legend_below(fig, 2)
    return fig


@figure("Attributed failures per GPU-hour by cause (Fig. 4)")
def failure_causes(frame: pd.DataFrame, title: str):
    """Fig. 4: attributed hardware failures per GPU-hour, by cause."""
    data = _numeric(frame, "rate_per_gpu_hour")
    data = data[data["rate_per_gpu_hour"] > 0]
    if data.empty:
        raise _NoData
    data = data.groupby("cause", as_index=False)["rate_per_gpu_hour"].sum()
    data = data.sort_values("rate_per_gpu_hour")
    fig, ax = _figure((FIGSIZE[0], max(FIGSIZE[1], 1.2 + 0.3 * len(data))))
    ax.barh([_plain(cause) for cause in data["cause"]], data["rate_per_gpu_hour"])
    ax.set_xscale("log")
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("failures per GPU-hour (log scale)")
    fig.suptitle(title)
    return fig


def _panels(n: int, columns: int = PANEL_COLUMNS, **kw):
    """A grid of small multiples spanning the page; the unused cells are hidden."""
    cols = min(columns, n)
    rows = -(-n // cols)
    fig, axes = _pyplot().subplots(rows, cols, squeeze=False, layout="constrained",
                                   figsize=(WIDE_WIDTH, 0.9 + PANEL_HEIGHT * rows), **kw)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n], cols


@figure("Failure rate per 1000 node-days by mode, rolling (Fig. 5)")
def rolling_failure_rate(frame: pd.DataFrame, title: str, deployments: pd.DataFrame | None = None):
    """Fig. 5: rolling failure rate per 1000 node-days: the total, then one small panel per
    failure mode (largest first, one shared scale), with a dashed line on each day a check
    family began running (a new check finds old failures)."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    data = _numeric(frame, "rate_per_1000_node_days")
    data = data.assign(time=pd.to_datetime(data["time"], errors="coerce")).dropna(subset=["time"])
    if data.empty:
        raise _NoData
    wide = data.pivot_table(index="time", columns="mode", values="rate_per_1000_node_days",
                            aggfunc="sum", fill_value=0.0).sort_index()
    modes = list(wide.mean().sort_values(ascending=False).index)
    fig, axes, cols = _panels(1 + len(modes), sharex=True)
    marks = _markers(deployments, wide.index.min(), wide.index.max())
    total = wide.sum(axis=1)
    for i, (ax, name) in enumerate(zip(axes, ["all modes", *modes], strict=True)):
        series = total if i == 0 else wide[name]
        colour = "0.2" if i == 0 else "C0"
        ax.fill_between(series.index, series.to_numpy(float), color=colour, alpha=0.18,
                        linewidth=0)
        ax.plot(series.index, series.to_numpy(float), color=colour, linewidth=1.4)
        ax.set_title(f"{_plain(name)}  (mean {series.mean():.2f})", fontsize=11, loc="left")
        if i == 1:
            first_mode = ax
        elif i > 1:
            ax.sharey(first_mode)  # modes on one scale; the total keeps its own
        for when, check in marks:
            if i == 0 or check == name:
                ax.axvline(when, color="0.35", linestyle="--", linewidth=0.9)
            if i == 0:
                ax.annotate(f"+{_plain(check)}", (when, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(3, -3), textcoords="offset points", rotation=90,
                            va="top", fontsize=9, color="0.3")
        ax.set_ylim(bottom=0)
        if i % cols == 0:
            ax.set_ylabel("per 1000\nnode-days")
        locator = AutoDateLocator(minticks=2, maxticks=4)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        ax.tick_params(labelbottom=True)
    fig.suptitle(title)
    return fig


def _markers(deployments: pd.DataFrame | None, lo, hi) -> list[tuple[pd.Timestamp, str]]:
    """(day, check) for the check deployments that fall on the plotted days."""
    if deployments is None or deployments.empty:
        return []
    when = pd.to_datetime(deployments["time"], errors="coerce")
    keep = when.notna() & (when >= lo) & (when <= hi)
    return list(zip(when[keep], deployments["check"][keep].astype(str), strict=True))


@figure("MTTF by job size, 90% CI, and projection (Fig. 7)")
def mttf_by_size(frame: pd.DataFrame, title: str):
    """Fig. 7: MTTF by job size with 90% CIs and the (N_nodes r_f)^-1 projection."""
    data = _numeric(frame, "gpus")
    data = data[data["gpus"] > 0].sort_values("gpus")
    data = _numeric_columns(data, "mttf_hours", "ci_low_hours", "ci_high_hours",
                            "projected_hours")
    measured = data.dropna(subset=["mttf_hours"])
    measured = measured[measured["mttf_hours"] > 0]
    projected = data.dropna(subset=["projected_hours"])
    projected = projected[projected["projected_hours"] > 0]
    if measured.empty and projected.empty:
        raise _NoData
    fig, ax = _figure()
    if not measured.empty:
        low = (measured["mttf_hours"] - measured["ci_low_hours"]).clip(lower=0).fillna(0)
        high = (measured["ci_high_hours"] - measured["mttf_hours"]).clip(lower=0).fillna(0)
        ax.errorbar(measured["gpus"], measured["mttf_hours"], yerr=[low, high], fmt="o",
                    capsize=3, label="measured (90% CI)")
    if not projected.empty:
        ax.plot(projected["gpus"], projected["projected_hours"], "--",
                label="projection 1/(N_nodes r_f)")
    _sizes_axis(ax, pd.concat([measured["gpus"], projected["gpus"]]))
    ax.set_yscale("log")
    ax.set_xlabel("job size (GPUs, log scale)")
    ax.set_ylabel("MTTF (hours, log scale)")
    fig.suptitle(title)
    _legend_below(fig, 2)
    return fig


@figure("Goodput lost by job size (Fig. 8)")
def goodput_lost(frame: pd.DataFrame, title: str):
    """Fig. 8: GPU-hours lost to failures and to second-order preemptions, by job size."""
    data = _numeric(frame, "gpus", "failure_gpu_hours", "preemption_gpu_hours")
    if data.empty or (data["failure_gpu_hours"] + data["preemption_gpu_hours"]).sum() <= 0:
        raise _NoData
    data = data.groupby("gpus", as_index=False)[
        ["failure_gpu_hours", "preemption_gpu_hours"]].sum().sort_values("gpus")
    fig, ax = _figure()
    x = np.arange(len(data))
    ax.bar(x, data["failure_gpu_hours"], label="failures")
    ax.bar(x, data["preemption_gpu_hours"], bottom=data["failure_gpu_hours"],
           label="second-order preemptions")
    ax.set_xticks(x, [str(int(g)) for g in data["gpus"]])
    ax.grid(axis="x", visible=False)
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("GPU-hours lost")
    fig.suptitle(title)
    _legend_below(fig, 2)
    return fig


@figure("ETTR of the longest job runs vs expected (Fig. 9)")
def ettr_runs(frame: pd.DataFrame, title: str):
    """Fig. 9: measured ETTR of the longest job runs (90% CI) against E[ETTR]."""
    data = _numeric(frame, "gpus", "measured")
    if data.empty:
        raise _NoData
    data = _numeric_columns(data, "ci_low", "ci_high", "expected")
    data = data.sort_values("gpus")
    fig, ax = _figure()
    low = (data["measured"] - data["ci_low"]).clip(lower=0).fillna(0)
    high = (data["ci_high"] - data["measured"]).clip(lower=0).fillna(0)
    ax.errorbar(data["gpus"], data["measured"], yerr=[low, high], fmt="o", capsize=3,
                label="measured job runs (90% CI)")
    expected = data.dropna(subset=["expected"])
    if not expected.empty:
        ax.plot(expected["gpus"], expected["expected"], "s--", label="E[ETTR]")
    _sizes_axis(ax, data["gpus"])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("job run size (GPUs, log scale)")
    ax.set_ylabel("ETTR (productive share\nof wall time)")
    fig.suptitle(title)
    _legend_below(fig, 2)
    return fig


@figure("Lemon feature CDFs over nodes (Fig. 11)")
def lemon_feature_cdfs(frame: pd.DataFrame, title: str):
    """Fig. 11: CDF over nodes of each lemon feature, one small panel per feature in its own
    units (counts, rates): the paper's seven signals first (blue), then the extras the lemon
    rules also use (orange). One line per panel: no legend, no repeated colours."""
    from matplotlib.ticker import MaxNLocator

    paper = [c for c in PAPER_FEATURES if c in frame.columns]
    extras = [c for c in frame.columns if c not in PAPER_FEATURES and c != "node"
              and pd.api.types.is_numeric_dtype(frame[c])]
    features = [(c, "C0") for c in paper] + [(c, "C1") for c in extras]
    columns = {c: pd.to_numeric(frame[c], errors="coerce").dropna().to_numpy(float)
               for c, _ in features}
    features = [(c, colour) for c, colour in features if columns[c].size]
    if frame.empty or not features:
        raise _NoData
    fig, axes, cols = _panels(len(features), columns=5, sharey=True)
    for i, (ax, (feature, colour)) in enumerate(zip(axes, features, strict=True)):
        values = np.sort(columns[feature])
        cdf = np.arange(1, values.size + 1) / values.size
        # Start at 0 below the smallest value, so a feature that is 0 on most nodes reads as
        # a jump at 0 (the share of clean nodes), not as a line that starts half way up.
        ax.step(np.r_[values[0], values], np.r_[0.0, cdf], where="post", color=colour,
                linewidth=1.6)
        ax.set_title(_plain(_wrap(feature)), fontsize=10, loc="left")
        ax.set_ylim(0, 1.03)
        # Counts get whole-number ticks (no "1.5 failures"); rates keep their decimals.
        counts = bool(np.all(np.mod(values, 1) == 0))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=counts))
        if i % cols == 0:
            ax.set_ylabel("share of\nnodes <= x")
    fig.suptitle(f"{title}, {len(frame)} nodes\nblue: the paper's seven signals; orange: "
                 "extras the lemon rules use; x in each feature's own unit", fontsize=12)
    return fig


@figure("Node failures per month and repair time (event-based)")
def reliability_by_period(frame: pd.DataFrame, title: str):
    """Failures per period (all groups, bars) with the system MTBF of the busiest group, and
    the repair time's p50 and p90 (hours, log scale) per period."""
    data = _numeric_columns(frame, "failures", "repair_p50_h", "repair_p90_h", "system_mtbf_h")
    data = data[data["failures"] > 0]
    if data.empty:
        raise _NoData
    per = data.groupby("period", sort=True).agg(
        failures=("failures", "sum"), p50=("repair_p50_h", "median"),
        p90=("repair_p90_h", "median"))
    fig, (top, bottom) = _figure((FIGSIZE[0], FIGSIZE[1] * 1.5), nrows=2, sharex=True)
    x = np.arange(len(per))
    top.bar(x, per["failures"], label="failures (all groups)")
    top.set_ylabel("failures")
    top.grid(axis="x", visible=False)
    bottom.plot(x, per["p50"], marker="o", label="repair p50")
    bottom.plot(x, per["p90"], marker="o", label="repair p90")
    if (per[["p50", "p90"]] > 0).any().any():
        bottom.set_yscale("log")
    bottom.set_ylabel("repair hours")
    bottom.set_xticks(x, [_plain(p) for p in per.index], rotation=45, ha="right")
    fig.suptitle(title)
    _legend_below(fig, 3)
    return fig


def _wrap(name: str, width: int = 22) -> str:
    """A long feature name on two lines, broken at the underscore nearest its middle, so
    neighbouring panel titles never run into each other."""
    if len(name) <= width or "_" not in name:
        return name
    cuts = [i for i, ch in enumerate(name) if ch == "_"]
    cut = min(cuts, key=lambda i: abs(i - len(name) / 2))
    return name[: cut + 1] + "\n" + name[cut + 1:]


# section -> (file name, caption, plot function), in the order the page shows them.
FIGURES: dict[str, tuple[str, str, Callable[..., Plot]]] = {
    "rolling": ("fig05_rolling_rate.png", "Failure rate over time by mode (Fig. 5)",
                rolling_failure_rate),
    "features": ("fig11_lemon_features.png", "Lemon feature CDFs (Fig. 11)", lemon_feature_cdfs),
    "causes": ("fig04_causes.png", "Attributed failure rates per GPU-hour (Fig. 4)",
               failure_causes),
    "mttf": ("fig07_mttf.png", "MTTF by job size (Fig. 7)", mttf_by_size),
    "outcomes": ("fig03_outcomes.png", "Job outcomes (Fig. 3)", job_outcomes),
    "goodput": ("fig08_goodput.png", "Goodput lost by job size (Fig. 8)", goodput_lost),
    "ettr": ("fig09_ettr.png", "ETTR of the longest runs (Fig. 9)", ettr_runs),
    "reliability": ("reliability_by_period.png",
                    "Node failures per month and repair time (event-based, node events and "
                    "XIDs)", reliability_by_period),
}
# Figures of small multiples, drawn page-wide: the page gives them both grid columns.
WIDE: frozenset[str] = frozenset({"features", "rolling"})
# Other sections a figure draws on besides its own, passed to it by keyword.
CONTEXT: dict[str, tuple[str, ...]] = {"rolling": ("deployments",)}
