"""Write the report: `report.html` (Jinja2, inline CSS, PNGs next to it or inlined as base64),
`summary.txt` for mail or chat, and `report.json` for machines and for tomorrow's diff.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from rsc_health.report import plots
from rsc_health.report.data import ReportData

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
SUMMARY_TXT = "summary.txt"
SUMMARY_MAX_LEMONS = 30  # keep the chat message short; the page lists every candidate
JSON_FORMAT = 1  # bump when report.json changes shape; older files are still diffed by node


@dataclass
class LemonChanges:
    """Lemon candidates compared with the previous report."""

    new: list[str] = field(default_factory=list)
    still: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    previous_as_of: str | None = None  # None: there was no previous report to compare with


@dataclass
class Figure:
    section: str
    file: str
    caption: str
    has_data: bool
    note: str
    src: str  # what the <img> loads: the file name, or a data: URL when embedded


@dataclass
class Written:
    html: Path
    summary: Path
    json: Path
    figures: list[Figure]
    changes: LemonChanges


def _as_list(value: Any) -> list[str]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def lemon_rows(data: ReportData) -> list[dict[str, Any]]:
    rows = []
    for record in data.lemons.to_dict("records"):
        rows.append(
            {
                "node": str(record["node"]),
                "rules": _as_list(record.get("rules")),
                "evidence": _as_list(record.get("evidence")),
                "summary": str(record.get("summary") or ""),
            }
        )
    return sorted(rows, key=lambda r: r["node"])


def load_previous(path: Path) -> dict[str, Any] | None:
    """The previous report.json, or None when absent or unreadable (a first run, or a bad file
    that must not stop tonight's report)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def diff_lemons(current: list[str], previous: dict[str, Any] | None) -> LemonChanges:
    if previous is None:
        return LemonChanges(new=sorted(current))
    before = {str(r.get("node")) for r in previous.get("lemons", []) if isinstance(r, dict)}
    now = set(current)
    return LemonChanges(
        new=sorted(now - before),
        still=sorted(now & before),
        cleared=sorted(before - now),
        previous_as_of=previous.get("as_of"),
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, pd.Timestamp | datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _jsonable(v) for k, v in row.items()} for row in frame.to_dict("records")]


def action_rows(data: ReportData) -> list[dict[str, Any]]:
    frame = data.actions.copy()
    if not frame.empty:
        frame = frame.sort_values("time", kind="stable")
    return _records(frame)


def action_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["action"])] = counts.get(str(row["action"]), 0) + 1
    return dict(sorted(counts.items()))


def draw_figures(
    data: ReportData,
    out: Path,
    *,
    embed: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[Figure]:
    figures = []
    for section, (name, caption, plot) in plots.FIGURES.items():
        if progress:
            progress(caption)
        context = {extra: getattr(data, extra) for extra in plots.CONTEXT.get(section, ())}
        result = plot(getattr(data, section), out / name, **context)
        src = name
        if embed:
            src = "data:image/png;base64," + base64.b64encode(result.path.read_bytes()).decode()
        # An empty figure says why: the gatherer's note (skipped, failed) beats plain "no data".
        note = result.note if result.has_data else data.notes.get(section, result.note)
        figures.append(Figure(section, name, caption, result.has_data, note, src))
    return figures


def summary_text(data: ReportData, lemons: list[dict], changes: LemonChanges,
                 actions: list[dict]) -> str:
    day = data.as_of.strftime("%Y-%m-%d")
    lines = [f"rsc-health lemon report {day} ({data.window_days}-day window)"]
    since = f" since {changes.previous_as_of}" if changes.previous_as_of else ""
    lines.append(
        f"Lemon candidates: {len(lemons)} (new{since}: {len(changes.new)}, "
        f"cleared: {len(changes.cleared)})"
    )
    new = set(changes.new)
    for row in lemons[:SUMMARY_MAX_LEMONS]:
        tag = " NEW" if row["node"] in new and changes.previous_as_of else ""
        # One short line per node for chat: the verdict's own summary when the producer gave
        # one, else its evidence; the page and report.json carry the full evidence.
        because = (row["summary"] or "; ".join(row["evidence"]) or ", ".join(row["rules"])
                   or "no evidence recorded")
        lines.append(f"  {row['node']}{tag}: {because}")
    if len(lemons) > SUMMARY_MAX_LEMONS:
        lines.append(f"  ... and {len(lemons) - SUMMARY_MAX_LEMONS} more (see report.html)")
    if changes.cleared:
        lines.append(f"No longer candidates: {', '.join(changes.cleared)}")
    counts = action_counts(actions)
    done = ", ".join(f"{n} {a}" for a, n in counts.items()) or "none"
    lines.append(f"Actions in the last day: {done}")
    if data.guard:
        guard = str(data.guard.get("state", "unknown"))
        detail = data.guard.get("detail")
        lines.append(f"Mass-drain guard: {guard}" + (f" ({detail})" if detail else ""))
    return "\n".join(lines) + "\n"


def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("rsc_health.report", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def write_report(
    data: ReportData,
    out: Path,
    *,
    previous: Path | None = None,
    embed: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Written:
    """Render everything into `out`. `previous` is the report.json to diff against (default:
    the one already in `out`, read before it is replaced)."""
    data.validate()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / REPORT_JSON
    prior = load_previous(previous if previous is not None else json_path)

    lemons = lemon_rows(data)
    changes = diff_lemons([r["node"] for r in lemons], prior)
    actions = action_rows(data)
    figures = draw_figures(data, out, embed=embed, progress=progress)

    if progress:
        progress("page, summary and JSON")
    summary = summary_text(data, lemons, changes, actions)
    html = _environment().get_template("report.html").render(
        as_of=data.as_of.strftime("%Y-%m-%d %H:%M"),
        window_days=data.window_days,
        lemons=lemons,
        changes=changes,
        new=set(changes.new),
        figures=figures,
        actions=actions,
        action_counts=action_counts(actions),
        guard=data.guard,
        notes=data.notes,
        summary=summary,
    )
    html_path = out / REPORT_HTML
    html_path.write_text(html, encoding="utf-8")
    summary_path = out / SUMMARY_TXT
    summary_path.write_text(summary, encoding="utf-8")
    document = {
        "format": JSON_FORMAT,
        "as_of": data.as_of.isoformat(sep=" ", timespec="seconds"),
        "window_days": data.window_days,
        "lemons": lemons,
        "changes": {
            "previous_as_of": changes.previous_as_of,
            "new": changes.new,
            "still": changes.still,
            "cleared": changes.cleared,
        },
        "actions": actions,
        "guard": {k: _jsonable(v) for k, v in data.guard.items()},
        "figures": [
            {"section": f.section, "file": f.file, "caption": f.caption,
             "has_data": f.has_data, "note": f.note}
            for f in figures
        ],
        "notes": data.notes,
        "timings_s": data.timings,
    }
    # Write to a temp name then rename: a crash mid-write must not destroy tomorrow's baseline.
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(json_path)
    return Written(html_path, summary_path, json_path, figures, changes)
