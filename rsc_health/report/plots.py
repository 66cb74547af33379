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

from rsc_health.report.data import PAPER_FEATURES

FIGSIZE = (8.0, 4.2)
DPI = 100

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
            try:
                fig = draw(frame, title, **context)
            except _NoData:
                return Plot(_no_data(path, title), False, "no data")
            except Exception as exc:  # the report must still be written
                _pyplot().close("all")
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    _pyplot().close(fig)
    return path


def _no_data(path: Path, title: str, why: str = "no data") -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=14, color="0.4",
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
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    y = np.arange(len(data))
    jobs_pct = 100 * data["jobs"] / data["jobs"].sum()
    hours_total = data["gpu_hours"].sum()
    hours_pct = 100 * data["gpu_hours"] / hours_total if hours_total > 0 else 0 * jobs_pct
    ax.barh(y - 0.2, jobs_pct, height=0.4, label="% of jobs")
    ax.barh(y + 0.2, hours_pct, height=0.4, label="% of GPU-hours")
    ax.set_yticks(y, data["state"].astype(str))
    ax.invert_yaxis()
    ax.set_xlabel("percent")
    ax.set_title(title)
    ax.legend(loc="lower right")
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
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.barh(data["cause"].astype(str), data["rate_per_gpu_hour"])
    ax.set_xscale("log")
    ax.set_xlabel("failures per GPU-hour")
    ax.set_title(title)
    return fig


@figure("Failure rate per 1000 node-days by mode, rolling (Fig. 5)")
def rolling_failure_rate(frame: pd.DataFrame, title: str, deployments: pd.DataFrame | None = None):
    """Fig. 5: rolling failure rate per 1000 node-days, stacked by failure mode, with a dashed
    line on each day a check family began running (a new check finds old failures)."""
    data = _numeric(frame, "rate_per_1000_node_days")
    data = data.assign(time=pd.to_datetime(data["time"], errors="coerce")).dropna(subset=["time"])
    if data.empty:
        raise _NoData
    wide = data.pivot_table(index="time", columns="mode", values="rate_per_1000_node_days",
                            aggfunc="sum", fill_value=0.0).sort_index()
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.stackplot(wide.index, *(wide[c] for c in wide.columns),
                 labels=[str(c) for c in wide.columns])
    for when, check in _markers(deployments, wide.index.min(), wide.index.max()):
        ax.axvline(when, color="0.25", linestyle="--", linewidth=0.8)
        ax.annotate(f"+{check}", (when, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(2, -2), textcoords="offset points", rotation=90, va="top",
                    fontsize="x-small", color="0.25")
    ax.set_ylabel("failures / 1000 node-days")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize="small", ncol=2)
    fig.autofmt_xdate()
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
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    if not measured.empty:
        low = (measured["mttf_hours"] - measured["ci_low_hours"]).clip(lower=0).fillna(0)
        high = (measured["ci_high_hours"] - measured["mttf_hours"]).clip(lower=0).fillna(0)
        ax.errorbar(measured["gpus"], measured["mttf_hours"], yerr=[low, high], fmt="o",
                    capsize=3, label="measured (90% CI)")
    if not projected.empty:
        ax.plot(projected["gpus"], projected["projected_hours"], "--",
                label="projection 1/(N_nodes r_f)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("MTTF (hours)")
    ax.set_title(title)
    ax.legend()
    return fig


@figure("Goodput lost by job size (Fig. 8)")
def goodput_lost(frame: pd.DataFrame, title: str):
    """Fig. 8: GPU-hours lost to failures and to second-order preemptions, by job size."""
    data = _numeric(frame, "gpus", "failure_gpu_hours", "preemption_gpu_hours")
    if data.empty or (data["failure_gpu_hours"] + data["preemption_gpu_hours"]).sum() <= 0:
        raise _NoData
    data = data.groupby("gpus", as_index=False)[
        ["failure_gpu_hours", "preemption_gpu_hours"]].sum().sort_values("gpus")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    x = np.arange(len(data))
    ax.bar(x, data["failure_gpu_hours"], label="failures")
    ax.bar(x, data["preemption_gpu_hours"], bottom=data["failure_gpu_hours"],
           label="second-order preemptions")
    ax.set_xticks(x, [str(int(g)) for g in data["gpus"]], rotation=45)
    ax.set_xlabel("job size (GPUs)")
    ax.set_ylabel("GPU-hours lost")
    ax.set_title(title)
    ax.legend()
    return fig


@figure("ETTR of the longest job runs vs expected (Fig. 9)")
def ettr_runs(frame: pd.DataFrame, title: str):
    """Fig. 9: measured ETTR of the longest job runs (90% CI) against E[ETTR]."""
    data = _numeric(frame, "gpus", "measured")
    if data.empty:
        raise _NoData
    data = _numeric_columns(data, "ci_low", "ci_high", "expected")
    data = data.sort_values("gpus")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    low = (data["measured"] - data["ci_low"]).clip(lower=0).fillna(0)
    high = (data["ci_high"] - data["measured"]).clip(lower=0).fillna(0)
    ax.errorbar(data["gpus"], data["measured"], yerr=[low, high], fmt="o", capsize=3,
                label="measured job runs (90% CI)")
    expected = data.dropna(subset=["expected"])
    if not expected.empty:
        ax.plot(expected["gpus"], expected["expected"], "s--", label="E[ETTR]")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("job run size (GPUs)")
    ax.set_ylabel("ETTR")
    ax.set_title(title)
    ax.legend(loc="lower left")
    return fig


def _cdf_axes(ax, frame: pd.DataFrame, features: list[str], title: str) -> None:
    for feature in features:
        values = pd.to_numeric(frame[feature], errors="coerce").dropna().to_numpy(float)
        if values.size == 0:
            continue
        top = values.max()
        normalised = np.sort(values / top if top > 0 else values)
        cdf = np.arange(1, normalised.size + 1) / normalised.size
        ax.step(normalised, cdf, where="post", label=feature)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("feature value per node (normalised to 0..1)")
    ax.set_title(title, fontsize="medium")
    ax.legend(loc="lower right", fontsize="x-small")


@figure("Lemon feature CDFs over nodes (Fig. 11)")
def lemon_feature_cdfs(frame: pd.DataFrame, title: str):
    """Fig. 11: CDF over nodes of each lemon feature, each normalised to 0..1 by its maximum.

    The paper's seven signals on the left; numeric extras the lemon rules also use (early
    fails, repeat outages...) on the right, so the figure stays readable."""
    paper = [c for c in PAPER_FEATURES if c in frame.columns]
    extras = [c for c in frame.columns if c not in PAPER_FEATURES and c != "node"
              and pd.api.types.is_numeric_dtype(frame[c])]
    if frame.empty or not (paper or extras):
        raise _NoData
    plt = _pyplot()
    panels = [(cols, name) for cols, name in ((paper, "paper's signals"), (extras, "extras"))
              if cols]
    fig, axes = plt.subplots(1, len(panels), figsize=(FIGSIZE[0], FIGSIZE[1] + 0.6),
                             sharey=True, squeeze=False)
    for ax, (cols, name) in zip(axes[0], panels, strict=True):
        _cdf_axes(ax, frame, cols, name)
    axes[0][0].set_ylabel("fraction of nodes")
    fig.suptitle(title)
    return fig


# section -> (file name, caption, plot function), in the order the page shows them.
FIGURES: dict[str, tuple[str, str, Callable[..., Plot]]] = {
    "features": ("fig11_lemon_features.png", "Lemon feature CDFs (Fig. 11)", lemon_feature_cdfs),
    "mttf": ("fig07_mttf.png", "MTTF by job size (Fig. 7)", mttf_by_size),
    "rolling": ("fig05_rolling_rate.png", "Failure rate over time by mode (Fig. 5)",
                rolling_failure_rate),
    "causes": ("fig04_causes.png", "Attributed failure rates per GPU-hour (Fig. 4)",
               failure_causes),
    "outcomes": ("fig03_outcomes.png", "Job outcomes (Fig. 3)", job_outcomes),
    "ettr": ("fig09_ettr.png", "ETTR of the longest runs (Fig. 9)", ettr_runs),
    "goodput": ("fig08_goodput.png", "Goodput lost by job size (Fig. 8)", goodput_lost),
}
# Other sections a figure draws on besides its own, passed to it by keyword.
CONTEXT: dict[str, tuple[str, ...]] = {"rolling": ("deployments",)}
