"""Write the report: `report.html` (Jinja2, inline CSS, PNGs next to it or inlined as base64),
`summary.txt` for mail or chat, and `report.json` for machines and for tomorrow's diff.
"""

from __future__ import annotations

import base64
import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from rsc_health.durable import make_dirs, write_atomic
from rsc_health.report import morning, plots
from rsc_health.report.data import ReportData
from rsc_health.report.links import Links
from rsc_health.terminal import shown

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
SUMMARY_TXT = "summary.txt"
SUMMARY_MAX_LEMONS = 30  # keep the chat message short; the page lists every candidate
# Bump when report.json changes shape; older files are still diffed by node. 3: lemons_as_of.
JSON_FORMAT = 3


@dataclass
class LemonChanges:
    """Lemon candidates compared with the previous report."""

    new: list[str] = field(default_factory=list)
    still: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    previous_as_of: str | None = None  # None: there was no previous report to compare with
    # Tonight's verdicts could not be had (the section's note): nothing is compared, and the
    # last known candidates (judged as of carried_as_of) are carried into report.json.
    unavailable: str = ""
    carried: list[str] = field(default_factory=list)
    carried_as_of: str | None = None


@dataclass
class Figure:
    section: str
    file: str
    caption: str
    has_data: bool
    note: str
    src: str  # what the <img> loads: the file name, or a data: URL when embedded
    wide: bool = False  # small multiples: the page gives it the full width


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


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def lemon_rows(data: ReportData) -> list[dict[str, Any]]:
    """Candidates in pull order: longest listed first (the ones nobody has pulled yet), then by
    node. The pull columns are absent when gather could not add them (the page says '-')."""
    rows = []
    for record in data.lemons.to_dict("records"):
        days = record.get("days_listed")
        rows.append(
            {
                "node": str(record["node"]),
                "rules": _as_list(record.get("rules")),
                "evidence": _as_list(record.get("evidence")),
                "summary": str(record.get("summary") or ""),
                "days_listed": None if days is None or days != days else int(days),
                "listed_capped": bool(record.get("listed_capped") or False),
                "slurm_state": _text(record.get("slurm_state")),
                "ticket": _text(record.get("ticket")),
                "last_action": _text(record.get("last_action")),
            }
        )
    return sorted(rows, key=lambda r: (-(r["days_listed"] or 0), r["node"]))


def listed_text(row: dict[str, Any]) -> str:
    days = row.get("days_listed")
    if days is None:
        return "-"
    return f"{days}+ d" if row.get("listed_capped") else f"{days} d"


@dataclass
class Headline:
    """The numbers at the top of the page."""

    r_f: dict[str, Any] | None  # the latest 7 days' row of data.rates
    previous: dict[str, Any] | None
    long: dict[str, Any] | None
    change: morning.RateChange | None
    rates_note: str
    lemons: int | None  # None: tonight's lemon verdicts are unknown
    new_lemons: int | None
    out_of_service: int | None  # None: unknown (no source)
    stopped: int | None
    broken: int | None
    stale_inputs: list[str]
    newest: dict[str, str]  # input -> age text

    def to_dict(self) -> dict[str, Any]:
        doc = {k: _jsonable(v) for k, v in self.__dict__.items() if k != "change"}
        for key in ("r_f", "previous", "long"):
            if doc[key] is not None:
                doc[key] = {k: _jsonable(v) for k, v in doc[key].items()}
        doc["change"] = None if self.change is None else {
            "delta_per_1000_node_days": self.change.delta, "p_value": self.change.p_value,
            "words": self.change.words}
        return doc


def headline(data: ReportData, lemons: list[dict], changes: LemonChanges) -> Headline:
    rates = data.rates.to_dict("records")
    known = "out_of_service" not in data.notes
    fresh = data.freshness
    return Headline(
        r_f=rates[0] if rates else None,
        previous=rates[1] if len(rates) > 1 else None,
        long=rates[2] if len(rates) > 2 else None,
        change=morning.rate_change(data.rates),
        rates_note=data.notes.get("rates", ""),
        lemons=None if changes.unavailable else len(lemons),
        new_lemons=None if changes.unavailable else len(changes.new),
        out_of_service=len(data.out_of_service) if known else None,
        stopped=int(data.stale["stopped"].sum()) if "stale" not in data.notes else None,
        broken=int(data.stale["broken"].sum()) if "stale" not in data.notes else None,
        stale_inputs=[str(r["input"]) for r in fresh.to_dict("records") if r["stale"]],
        newest={str(r["input"]): morning.format_age(r["age_hours"])
                for r in fresh.to_dict("records")},
    )


def rate_text(row: dict[str, Any] | None, short: bool = False) -> str:
    """'5.70 (90% CI 4.53-7.09; 58 failures / 10,175 node-days)'; short: '5.70 (4.53-7.09)'."""
    if row is None or not row.get("node_days"):
        return "-"
    if short:
        return f"{row['r_f']:.2f} ({row['ci_low']:.2f}-{row['ci_high']:.2f})"
    level = 100 * float(row.get("confidence") or 0.9)
    return (f"{row['r_f']:.2f} ({level:.0f}% CI {row['ci_low']:.2f}-{row['ci_high']:.2f}; "
            f"{int(row['failures'])} failures / {row['node_days']:,.0f} node-days)")


def section_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A section's records with ages as text and times to the minute, for the page."""
    rows = []
    for record in frame.to_dict("records"):
        row = {k: _jsonable(v) for k, v in record.items()}
        if "age_hours" in record:
            row["age"] = morning.format_age(record["age_hours"])
        for key in ("since", "last_seen", "newest", "last_start"):
            value = record.get(key)
            if value is pd.NaT:
                row[key] = None
            elif isinstance(value, datetime | pd.Timestamp):
                row[key] = value.strftime("%Y-%m-%d %H:%M")
        rows.append(row)
    return rows


# Last night's report.json read back at most this large (a 16,000-node fleet's is a few MB).
PREVIOUS_MAX_BYTES = 64 << 20


def load_previous(path: Path, *, follow: bool = False) -> dict[str, Any] | None:
    """The previous report.json, or None when absent or unreadable (a first run, or a bad file
    that must not stop tonight's report). The report directory may be a group's: only a
    regular file is read (a FIFO would hang the night's report, /dev/zero fill its memory),
    at most PREVIOUS_MAX_BYTES, never through a symlink unless `follow` (an operator's own
    --previous), and only a JSON object whose `lemons` is a list of objects counts (any other
    shape is a first night, not a TypeError at the end of the gathering)."""
    from rsc_health.durable import open_regular

    try:
        fd = open_regular(path) if not follow else os.open(
            path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            raw = f.read(PREVIOUS_MAX_BYTES + 1)
        if len(raw) > PREVIOUS_MAX_BYTES:
            return None
        doc = json.loads(raw)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    lemons = doc.get("lemons")
    if lemons is not None and not (isinstance(lemons, list)
                                   and all(isinstance(r, dict) for r in lemons)):
        return None
    return doc


def agree_with_days_listed(changes: LemonChanges, lemons: list[dict[str, Any]]) -> LemonChanges:
    """A candidate is "new" only when nothing says it was listed before: one listed for more
    than a day (judged by today's rules on the days before) is "still", whatever the last
    report.json held (none, a gap, another day's). The page, summary.txt and report.json
    then never call one candidate both "new" and "listed 7+ d"."""
    older = {r["node"] for r in lemons if (r.get("days_listed") or 1) > 1}
    moved = [n for n in changes.new if n in older]
    if not moved:
        return changes
    return LemonChanges(new=[n for n in changes.new if n not in older],
                        still=sorted(set(changes.still) | set(moved)), cleared=changes.cleared,
                        previous_as_of=changes.previous_as_of)


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


def carry_lemons(note: str, previous: dict[str, Any] | None
                 ) -> tuple[LemonChanges, list[dict[str, Any]], str | None]:
    """The night the lemon verdicts failed (or were skipped): no candidate is "cleared" and
    none "new" (an empty list there is no verdict), and last night's candidates go on into
    report.json as they were, with the day they were judged (`lemons_as_of`), so the next
    night diffs against them and walks its days listed instead of restarting every streak.
    Returns the changes, the rows to keep and the day they were judged."""
    rows: list[dict[str, Any]] = list(previous.get("lemons") or []) if previous else []
    judged = None
    if previous is not None:
        judged = previous.get("lemons_as_of") if "lemons_as_of" in previous \
            else previous.get("as_of")
    judged = judged if isinstance(judged, str) else None
    changes = LemonChanges(previous_as_of=previous.get("as_of") if previous else None,
                           unavailable=note, carried=sorted(str(r.get("node")) for r in rows),
                           carried_as_of=judged)
    return changes, rows, judged


def _jsonable(value: Any) -> Any:
    if value is pd.NaT:
        return None
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
    """Intervals per action (a folded row is one: every sweep's would_drain of one node and
    reason counts once)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["action"])] = counts.get(str(row["action"]), 0) + 1
    return dict(sorted(counts.items()))


def action_records(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Records per action before folding (a row without a count is one record)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["action"])] = counts.get(str(row["action"]), 0) + int(
            row.get("count") or 1)
    return dict(sorted(counts.items()))


def meanwhile(data: ReportData) -> str:
    """What a fleet with no r_f yet has to show instead: open findings, node events, GPUs with
    XIDs ("" when none of them is known either)."""
    parts = []
    if "open_findings" not in data.notes:
        attrs = data.open_findings.attrs
        parts.append(f"{attrs.get('total', len(data.open_findings))} open finding(s) on "
                     f"{attrs.get('nodes', data.open_findings['node'].nunique())} node(s)")
    if "node_events" not in data.notes and not data.node_events.empty:
        attrs = data.node_events.attrs
        parts.append(f"{attrs.get('total_events', int(data.node_events['events'].sum()))} "
                     f"node event(s) on {attrs.get('total_nodes', len(data.node_events))} "
                     f"node(s) in {data.window_days} days")
    if "xids" not in data.notes and not data.xids.empty:
        parts.append(f"XIDs on {data.xids.attrs.get('total_gpus', len(data.xids))} GPU(s)")
    return "; ".join(parts)


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
        figures.append(Figure(section, name, caption, result.has_data, note, src,
                              wide=result.has_data and section in plots.WIDE))
    return figures


def _num(value: Any, spec: str) -> str:
    """A number for the page ("-" for none or NaN)."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return spec % value


def reliability_meta(data: ReportData) -> dict[str, Any]:
    from rsc_health.historian.outages import describe_removed

    frame = data.reliability
    return {"months": int(frame["period"].nunique()) if not frame.empty else 0,
            "left_out": describe_removed(frame.attrs.get("left_out", {}))}


def reliability_lines(data: ReportData) -> list[str]:
    """summary.txt's lines on event-based reliability and failed-job triage."""
    lines = []
    frame = data.reliability
    if not frame.empty:
        last = frame[frame["period"] == frame["period"].max()]
        repair = pd.to_numeric(last["repair_p50_h"], errors="coerce").median()
        lines.append(f"Node failures in {last['period'].iloc[0]}: {int(last['failures'].sum())} "
                     f"({int(last['episodes'].sum())} episodes, "
                     f"{int(last['nodes_failed'].sum())} nodes)"
                     + (f", repair p50 {repair:.1f} h" if repair == repair else ""))
    if not data.triage.empty:
        counts = ", ".join(f"{r.label} {r.jobs}" for r in data.triage.itertuples())
        lines.append(f"Failed jobs ({data.window_days} days) by triage: {counts}")
    return lines


def suspects_lines(data: ReportData) -> list[str]:
    """The suspect tier's lines of summary.txt: open suspects, each with its evidence."""
    from rsc_health.model import SuspectState

    frame = data.suspects
    if frame.empty:
        return []
    open_ = frame[frame["state"] == SuspectState.SUSPECT.value]
    # how they ended: confirmed (qualification failed: drained), cleared (a pass, or a
    # person), expired (no evidence renewed them): the fleet's own word on the tier's precision
    ended = frame.loc[frame["state"] != SuspectState.SUSPECT.value, "state"].value_counts()
    how = ", ".join(f"{int(ended[s.value])} {s.value}" for s in SuspectState
                    if s is not SuspectState.SUSPECT and s.value in ended.index)
    lines = [f"Suspect nodes (kept from big jobs): {len(open_)} open, "
             f"{len(frame) - len(open_)} ended in the last day" + (f" ({how})" if how else "")]
    for row in open_.head(SUMMARY_MAX_LEMONS).itertuples():
        dev = "?" if row.deviation != row.deviation or row.deviation is None \
            else f"{row.deviation:.3g}"
        lines.append(f"  {row.node}: {row.metric} deviation {dev} ({row.source}) in jobs "
                     f"{row.job_ids or '-'}")
    return lines


def _headline_lines(data: ReportData, head: Headline) -> list[str]:
    """The summary's headline: r_f, out of service, checks stopped, stale inputs."""
    lines = []
    if head.r_f is not None and head.r_f.get("node_days"):
        change = f", {head.change.words} on the week before" if head.change else ""
        lines.append(f"r_f last 7 days: {rate_text(head.r_f)} per 1000 node-days{change}")
    else:
        lines.append(f"r_f last 7 days: none ({head.rates_note or 'no large-job node-days'})")
        if meanwhile(data):
            lines.append(f"Meanwhile: {meanwhile(data)}")
    if head.out_of_service is not None:
        lines.append(f"Out of service: {head.out_of_service} node(s)")
    if head.stopped is not None:
        lines.append(f"Checks stopped: {head.stopped} node(s); checker broken: "
                     f"{head.broken} node(s)")
    if head.stale_inputs:
        lines.append("STALE INPUT: " + "; ".join(
            f"{name} (newest {head.newest[name]} old)" if head.newest.get(name, "-") != "-"
            else f"{name} (none yet)" for name in head.stale_inputs))
    return lines


def _lemon_lines(lemons: list[dict], changes: LemonChanges, links: Links | None) -> list[str]:
    """The lemon candidates, one short line each (and its link), and the ones cleared; when
    tonight's verdicts are unknown, that and the last known candidates."""
    if changes.unavailable:
        lines = [f"Lemon candidates: unknown ({changes.unavailable})"]
        if changes.carried:
            lines.append(f"  last known (as of {changes.carried_as_of or '?'}): "
                         + ", ".join(changes.carried[:SUMMARY_MAX_LEMONS])
                         + (" ..." if len(changes.carried) > SUMMARY_MAX_LEMONS else ""))
        return lines
    since = f" since {changes.previous_as_of}" if changes.previous_as_of else ""
    lines = [f"Lemon candidates: {len(lemons)} (new{since}: {len(changes.new)}, "
             f"cleared: {len(changes.cleared)})"]
    new = set(changes.new)
    for row in lemons[:SUMMARY_MAX_LEMONS]:
        tag = " NEW" if row["node"] in new and changes.previous_as_of else ""
        if row.get("days_listed") and row["days_listed"] > 1:
            tag += f" (listed {listed_text(row)})"
        # One short line per node for chat: the verdict's own summary when the producer gave
        # one, else its evidence; the page and report.json carry the full evidence.
        because = (row["summary"] or "; ".join(row["evidence"]) or ", ".join(row["rules"])
                   or "no evidence recorded")
        lines.append(f"  {row['node']}{tag}: {because}")
        if links is not None and links.node(row["node"]):
            lines.append(f"    {links.node(row['node'])}")
    if len(lemons) > SUMMARY_MAX_LEMONS:
        lines.append(f"  ... and {len(lemons) - SUMMARY_MAX_LEMONS} more (see report.html)")
    if changes.cleared:
        lines.append(f"No longer candidates: {', '.join(changes.cleared)}")
    return lines


def failed_lines(data: ReportData) -> list[str]:
    """Every other section that failed tonight, said: the summary leaves an empty section
    out, and one left out for an error must not read as one with nothing to show."""
    said = {"lemons", "features", "actions"}  # in the lemon and action lines
    return [f"Unavailable tonight: {data.notes[s]}" for s in dict.fromkeys(data.failed)
            if s not in said and s in data.notes]


def summary_text(data: ReportData, lemons: list[dict], changes: LemonChanges,
                 actions: list[dict], head: Headline | None = None,
                 links: Links | None = None) -> str:
    day = data.as_of.strftime("%Y-%m-%d")
    lines = [f"rsc-health lemon report {day} ({data.window_days}-day window)"]
    if head is not None:
        lines += _headline_lines(data, head)
    lines += _lemon_lines(lemons, changes, links)
    counts, records = action_counts(actions), action_records(actions)
    done = ", ".join(f"{n} {a}" + (f" ({records[a]} records)" if records[a] > n else "")
                     for a, n in counts.items())
    if "actions" in data.notes:  # not read (or not all of it): never "none"
        done = f"{done}; {data.notes['actions']}" if done else f"unknown ({data.notes['actions']})"
    lines.append(f"Actions in the last day: {done or 'none'}")
    if data.guard:
        guard = str(data.guard.get("state", "unknown"))
        detail = data.guard.get("detail")
        lines.append(f"Mass-drain guard: {guard}" + (f" ({detail})" if detail else ""))
    lines += reliability_lines(data)
    lines += suspects_lines(data)
    lines += failed_lines(data)
    # Read in a terminal or a chat: the historian's text (node names, evidence) escaped.
    return "\n".join(shown(line) for line in lines) + "\n"


def named_nodes(data: ReportData) -> list[str]:
    nodes: set[str] = set()
    for name in ("lemons", "out_of_service", "stale", "xids", "qualified", "actions",
                 "open_findings", "node_events", "suspects"):
        frame = getattr(data, name)
        if "node" in frame.columns:
            nodes.update(str(n) for n in frame["node"].dropna())
    return sorted(nodes)


def page_text(value: Any) -> Any:
    """Every value the page prints, before HTML escaping: the historian's text (node names,
    reasons, evidence) with what a browser would act on instead of show (a bidi override that
    reverses a line, ESC and the other controls) written as its escape, as terminal.shown
    does for healthctl; a newline is left (HTML shows it as a space, the summary's <pre> as
    the line it is). The page's own markup (a macro's output) is not text."""
    from markupsafe import Markup

    if not isinstance(value, str) or isinstance(value, Markup) or value.isprintable():
        return value
    return "\n".join(shown(line) for line in value.split("\n"))


def _environment():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("rsc_health.report", "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=page_text,
    )


def write_report(
    data: ReportData,
    out: Path,
    *,
    previous: Path | None = None,
    embed: bool = False,
    progress: Callable[[str], None] | None = None,
    links: Links | None = None,
) -> Written:
    """Render everything into `out`. `previous` is the report.json to diff against (default:
    the one already in `out`, read before it is replaced)."""
    data.validate()
    out = Path(out)
    make_dirs(out)
    json_path = out / REPORT_JSON
    prior = (load_previous(previous, follow=True) if previous is not None
             else load_previous(json_path))

    lemons = lemon_rows(data)
    kept: list[dict[str, Any]] = lemons
    judged: str | None = data.as_of.isoformat(sep=" ", timespec="seconds")
    if "lemons" in data.notes:  # no verdict tonight: an empty list is not "all cleared"
        changes, kept, judged = carry_lemons(data.notes["lemons"], prior)
    else:
        changes = agree_with_days_listed(diff_lemons([r["node"] for r in lemons], prior),
                                         lemons)
    links = links or Links()
    actions = action_rows(data)
    figures = draw_figures(data, out, embed=embed, progress=progress)

    if progress:
        progress("page, summary and JSON")
    head = headline(data, lemons, changes)
    summary = summary_text(data, lemons, changes, actions, head, links)
    sections = {name: section_rows(getattr(data, name))
                for name in ("out_of_service", "stale", "xids", "freshness", "qualified",
                             "open_findings", "node_events", "suspects", "reliability",
                             "triage")}
    for row in sections["reliability"]:
        reasons = row.get("reasons") or {}
        row["reason_mix"] = ", ".join(f"{k or '-'} {v}" for k, v in list(reasons.items())[:4])
    html = _environment().get_template("report.html").render(
        as_of=data.as_of.strftime("%Y-%m-%d %H:%M"),
        window_days=data.window_days,
        head=head,
        rate_text=rate_text,
        listed_text=listed_text,
        xid_totals=dict(data.xids.attrs),
        **sections,
        lemons=lemons,
        changes=changes,
        new=set(changes.new),
        figures=figures,
        actions=actions,
        action_counts=action_counts(actions),
        action_records=action_records(actions),
        links=links,
        meanwhile=meanwhile(data),
        fleet_totals={"open_findings": dict(data.open_findings.attrs),
                      "node_events": dict(data.node_events.attrs)},
        guard=data.guard,
        notes=data.notes,
        failed=data.failed,
        summary=summary,
        reliability_meta=reliability_meta(data),
        num=_num,
    )
    # Every file through durable.write_atomic: the report directory may be one a group
    # shares, and nothing planted in it is followed.
    html_path = out / REPORT_HTML
    write_atomic(html_path, html, sync_dir=False)
    summary_path = out / SUMMARY_TXT
    write_atomic(summary_path, summary, sync_dir=False)
    document = {
        "format": JSON_FORMAT,
        "as_of": data.as_of.isoformat(sep=" ", timespec="seconds"),
        "window_days": data.window_days,
        "headline": head.to_dict(),
        # Tonight's candidates, or last known ones when the verdicts failed (notes.lemons
        # says why); lemons_as_of: the day they were judged (None: never).
        "lemons": kept,
        "lemons_as_of": judged,
        **{name: _records(getattr(data, name))
           for name in ("rates", "out_of_service", "stale", "xids", "freshness",
                        "open_findings", "node_events", "suspects", "reliability", "triage")},
        "reliability_left_out": {k: _jsonable(v) for k, v in
                                 data.reliability.attrs.get("left_out", {}).items()},
        # Every node the report names, with its story and the site's pages.
        "links": {node: links.of(node) for node in named_nodes(data)},
        "changes": {
            "previous_as_of": changes.previous_as_of,
            "new": changes.new,
            "still": changes.still,
            "cleared": changes.cleared,
            "unavailable": changes.unavailable,
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
    # Written whole or not at all: a crash mid-write must not destroy tomorrow's baseline.
    write_atomic(json_path, json.dumps(document, indent=2, default=str) + "\n")
    return Written(html_path, summary_path, json_path, figures, changes)
