from __future__ import annotations

import json
from datetime import timedelta

import pandas as pd
import pytest

from rsc_health.report.data import ReportData
from rsc_health.report.plots import FIGURES
from rsc_health.report.render import write_report

from .conftest import AS_OF, build_report_data


def test_full_report_has_every_section_and_figure(report_data, tmp_path):
    written = write_report(report_data, tmp_path)
    html = written.html.read_text()
    for anchor in ("lemons", "changes", "figures", "actions", "summary"):
        assert f'<section id="{anchor}">' in html
    for section, (name, _caption, _plot) in FIGURES.items():
        assert f'id="fig-{section}"' in html
        assert f'src="{name}"' in html
        assert (tmp_path / name).stat().st_size > 1000
    assert all(f.has_data for f in written.figures)
    assert "gpu007" in html and "xid_cnt=4 &gt;= 3 (xid79, xid48)" in html
    assert "rsc_health:now:xid79:GPU fell off the bus" in html
    assert "Mass-drain guard: <strong>armed</strong>" in html


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_summary_mentions_each_lemon_with_its_evidence(report_data, tmp_path):
    summary = write_report(report_data, tmp_path).summary.read_text()
    for row in report_data.lemons.to_dict("records"):
        line = next(ln for ln in summary.splitlines() if ln.strip().startswith(row["node"]))
        for item in row["evidence"]:
            assert item in line
    assert "Lemon candidates: 2" in summary
    assert "1 drain, 1 resume" in summary
    assert "Mass-drain guard: armed" in summary


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_report_json_is_machine_readable(report_data, tmp_path):
    document = json.loads(write_report(report_data, tmp_path).json.read_text())
    assert [r["node"] for r in document["lemons"]] == ["gpu007", "gpu013"]
    assert document["as_of"] == "2024-06-30 00:00:00"
    assert {f["section"] for f in document["figures"]} == set(FIGURES)
    assert [a["action"] for a in document["actions"]] == ["drain", "resume"]
    assert document["actions"][1]["job_id"] is None


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_second_report_lists_what_changed_since_the_first(tmp_path):
    first = build_report_data()
    write_report(first, tmp_path)
    second = build_report_data(AS_OF + timedelta(days=1))
    kept = second.lemons[second.lemons["node"] != "gpu007"]
    added = pd.DataFrame(
        [{"node": "gpu031", "rules": ["tickets>=2"], "evidence": ["tickets=2 >= 2"]}])
    second.lemons = pd.concat([kept, added], ignore_index=True)
    written = write_report(second, tmp_path)
    assert written.changes.new == ["gpu031"]
    assert written.changes.still == ["gpu013"]
    assert written.changes.cleared == ["gpu007"]
    assert written.changes.previous_as_of == "2024-06-30 00:00:00"
    summary = written.summary.read_text()
    assert "gpu031 NEW: tickets=2 >= 2" in summary
    assert "No longer candidates: gpu007" in summary
    document = json.loads(written.json.read_text())
    assert document["changes"]["cleared"] == ["gpu007"]


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_previous_report_can_come_from_another_directory(report_data, tmp_path):
    yesterday = write_report(report_data, tmp_path / "yesterday")
    report_data.lemons = report_data.lemons.iloc[:1]
    written = write_report(report_data, tmp_path / "today", previous=yesterday.json)
    assert written.changes.cleared == ["gpu013"]


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_unreadable_previous_report_is_treated_as_a_first_run(report_data, tmp_path):
    (tmp_path / "report.json").write_text("{not json")
    written = write_report(report_data, tmp_path)
    assert written.changes.previous_as_of is None
    assert written.changes.new == ["gpu007", "gpu013"]


def test_empty_data_renders_every_section_with_placeholders(tmp_path):
    # A lemon section with a note had no verdict: "unknown", never "no candidates" (0).
    data = ReportData(as_of=AS_OF, notes={"lemons": "lemon module unavailable"})
    written = write_report(data, tmp_path)
    html = written.html.read_text()
    assert "Lemon candidates unknown tonight: lemon module unavailable" in html
    assert "No drains or resumes by rsc-health in the last day." in html
    assert len(written.figures) == len(FIGURES)
    assert not any(f.has_data for f in written.figures)
    assert all((tmp_path / f.file).exists() for f in written.figures)
    assert "Lemon candidates: unknown (lemon module unavailable)" in written.summary.read_text()


def test_a_failed_section_is_said_in_the_summary_and_on_the_page_not_left_as_all_clear(
        tmp_path):
    """An empty section reads as nothing to show: one empty because its query failed says
    so in summary.txt (which leaves empty sections out) and on the page."""
    data = ReportData(as_of=AS_OF, failed=["suspects", "stale", "actions"], notes={
        "suspects": "suspect nodes unavailable: OperationalError: database is locked",
        "stale": "nodes whose checks stopped unavailable: OperationalError: locked",
        "actions": "recent actions unavailable: OperationalError: locked"})
    written = write_report(data, tmp_path)
    summary = written.summary.read_text()
    assert "Unavailable tonight: suspect nodes unavailable: OperationalError" in summary
    assert "Unavailable tonight: nodes whose checks stopped unavailable" in summary
    assert "Actions in the last day: unknown (recent actions unavailable" in summary
    html = written.html.read_text()
    assert "No drains or resumes" not in html and "no heartbeats yet" not in html
    assert html.count("nodes whose checks stopped unavailable") >= 2  # the card, the section


def test_embedded_report_is_one_file(report_data, tmp_path):
    written = write_report(report_data, tmp_path, embed=True)
    html = written.html.read_text()
    assert html.count('src="data:image/png;base64,') == len(FIGURES)


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_html_escapes_node_and_reason_text(report_data, tmp_path):
    report_data.actions.loc[0, "reason"] = "<script>alert(1)</script>"
    html = write_report(report_data, tmp_path).html.read_text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_the_page_writes_bidi_overrides_and_controls_as_escapes_as_the_terminal_does(
        report_data, tmp_path):
    """A reason holding U+202E (right-to-left override) reversed the rest of its line on the
    page, and ESC went into the HTML raw (and on into a mail client's text part): the page
    shows them as their escapes, like terminal.shown in healthctl, and keeps its markup."""
    report_data.actions.loc[0, "reason"] = "fan \u202eok\x1b[2J <b>"
    report_data.actions.loc[0, "node"] = "gpu\u202e007"
    html = write_report(report_data, tmp_path).html.read_text()
    assert "\u202e" not in html and "\x1b" not in html
    assert "fan \\u202eok\\x1b[2J &lt;b&gt;" in html and "gpu\\u202e007" in html
    assert '<span class="node"' in html  # the macros' markup is the page's, not text


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_summary_uses_the_verdict_summary_and_caps_long_lists(report_data, tmp_path):
    nodes = [f"gpu{i:03d}" for i in range(45)]
    report_data.lemons = pd.DataFrame({
        "node": nodes,
        "rules": [["node_fails>=3"]] * 45,
        "evidence": [["node_fails=4 >= 3", "failed jobs: 1 FAILED (xid)"]] * 45,
        "summary": ["node_fails=4>=3"] * 45,
    })
    summary = write_report(report_data, tmp_path).summary.read_text()
    assert "  gpu000: node_fails=4>=3\n" in summary
    assert "failed jobs" not in summary  # details stay on the page
    assert "  ... and 15 more (see report.html)" in summary
    html = (tmp_path / "report.html").read_text()
    assert all(f"<code>{n}</code>" in html for n in nodes)


@pytest.mark.usefixtures("figures_not_drawn")  # the figures: the tests above
def test_summary_txt_escapes_terminal_sequences_in_the_historian_s_text(report_data, tmp_path):
    """summary.txt is read in a terminal and posted to chat: evidence carrying a job name or
    a reason must not bring its escape sequences along."""
    report_data.lemons = pd.DataFrame({
        "node": ["gpu001"], "rules": [["node_fails>=3"]],
        "evidence": [["failed jobs: 1 FAILED (\x1b]0;owned\x07\x1bc)"]], "summary": [""],
    })
    summary = write_report(report_data, tmp_path).summary.read_text()
    assert "\x1b" not in summary and "\x07" not in summary
    assert "  gpu001: failed jobs: 1 FAILED (\\x1b]0;owned\\x07\\x1bc)\n" in summary
