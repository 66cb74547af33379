"""The sections the on-call operator reads first, each proven from a small historian built here:
headline r_f and its weekly change, the pull list, nodes out of service, nodes whose checks
stopped, XIDs per GPU, data freshness; and an empty historian where every section says why."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import pandas as pd
import pytest
from scipy import stats
from sqlalchemy import insert

from rsc_health.historian.db import connect
from rsc_health.historian.freshness import Heartbeat, record_runs
from rsc_health.historian.schema import (
    attributions,
    check_results,
    job_nodes,
    jobs,
    node_actions,
    node_events,
    tickets,
)
from rsc_health.report import morning
from rsc_health.report.gather import GatherOptions, gather
from rsc_health.report.render import write_report

AS_OF = datetime(2024, 6, 30)
LEMON_RULES = {"strong": ["node_fails"], "node_fails": 3, "single_node_node_fails": 2,
               "min_signals": 2}
# The figures are drawn and checked in test_plots/test_render: here, a placeholder each.
pytestmark = pytest.mark.usefixtures("figures_not_drawn")
# Only the sections under test.
FIGURES = ["outcomes", "causes", "rolling", "deployments", "mttf", "goodput", "ettr"]


def _opts(**kw) -> GatherOptions:
    return GatherOptions(metrics_days=30, lemon=LEMON_RULES, skip=frozenset(kw.pop("skip", ())),
                         **kw)


@pytest.fixture
def engine(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'historian.db'}", create_missing=True)
    yield engine
    engine.dispose()


class Jobs:
    def __init__(self, engine):
        self.engine, self.pk = engine, 0

    def add(self, node: str, state: str, end: datetime, *, hours: float = 2.0, gpus: int = 8,
            nnodes: int = 1, cause: str | None = None) -> None:
        self.pk += 1
        pk, start = self.pk, end - timedelta(hours=hours)
        with self.engine.begin() as conn:
            conn.execute(insert(jobs).values(
                id=pk, job_id=str(pk), job_id_display=str(pk), state=state,
                submit=start, eligible=start, start=start, end=end, nnodes=nnodes, gpus=gpus,
                nodelist=node, instance_key=f"{pk}:x"))
            conn.execute(insert(job_nodes).values(job_pk=pk, node=node))
            if cause:
                conn.execute(insert(attributions).values(
                    job_pk=pk, node=node, cause=cause, code="", evidence="e", kind="check"))


def _section(html: str, anchor: str) -> str:
    match = re.search(rf'<section id="{anchor}">(.*?)</section>', html, re.S)
    assert match, f"no section {anchor}"
    return match.group(1)


# --- 1. headline r_f ---------------------------------------------------------------------------


def test_headline_rf_of_the_last_week_against_the_week_before(engine, tmp_path):
    made = Jobs(engine)
    # 256-GPU (32-node) jobs of 10 h: every day of two weeks, the last week with 3 NODE_FAILs
    # and the week before with 1.
    week_fails, prev_fails = {1, 3, 5}, {9}
    for day in range(14):
        state = "NODE_FAIL" if day in week_fails | prev_fails else "COMPLETED"
        made.add("gpu001", state, AS_OF - timedelta(days=day, hours=1), hours=10, gpus=256,
                 nnodes=32)
    data = gather(engine, AS_OF, _opts(skip=FIGURES[1:]))
    rows = data.rates.set_index("period")
    node_days = 7 * 10 * 32 / 24
    week, prev = rows.loc["last 7 days"], rows.loc["previous 7 days"]
    assert week["failures"] == len(week_fails) and prev["failures"] == len(prev_fails)
    assert week["node_days"] == pytest.approx(node_days)
    assert week["r_f"] == pytest.approx(1000 * len(week_fails) / node_days)
    assert week["ci_low"] < week["r_f"] < week["ci_high"]
    assert rows.loc["last 30 days", "failures"] == len(week_fails | prev_fails)

    change = morning.rate_change(data.rates)
    expected_p = stats.binomtest(len(week_fails), len(week_fails | prev_fails), 0.5).pvalue
    assert change.delta == pytest.approx(1000 * (len(week_fails) - len(prev_fails)) / node_days)
    assert change.p_value == pytest.approx(expected_p)
    assert change.words.startswith("up ") and "within noise" in change.words

    written = write_report(data, tmp_path / "out")
    html = written.html.read_text()
    cards = html[html.index('id="headline"'):html.index('<section id="lemons">')]
    assert f"{week['r_f']:.2f}" in cards and f"{change.delta:+.2f}" in cards
    assert f"CI {week['ci_low']:.2f}" in cards
    summary = written.summary.read_text()
    assert f"r_f last 7 days: {week['r_f']:.2f}" in summary
    doc = json.loads(written.json.read_text())
    assert doc["headline"]["change"]["p_value"] == pytest.approx(expected_p)


# --- 2. nodes out of service ---------------------------------------------------------------


def test_out_of_service_from_open_events_and_unresumed_drains(engine, tmp_path):
    with engine.begin() as conn:
        conn.execute(insert(node_events).values(  # open: out
            node="gpu001", start=AS_OF - timedelta(days=2), end=None, state="DRAIN",
            reason="bad psu (jdoe)"))
        conn.execute(insert(node_events).values(  # closed before as_of: back
            node="gpu002", start=AS_OF - timedelta(days=5), end=AS_OF - timedelta(days=4),
            state="DOWN", reason="reboot"))
        actions = [
            ("a3", "gpu003", 6, "drain_now", "rsc_health:now:xid79:gpu2 fell off the bus"),
            ("a4", "gpu004", 9, "drain_after_job", "rsc_health:job:ecc:x"),
            ("a4r", "gpu004", 3, "resume", ""),  # resumed: back
            ("a5", "gpu005", 30, "manual_drain", "rsc_health:manual:x"),
            ("a6", "gpu006", 2, "would_drain", "rsc_health:now:x"),  # shadow mode: never out
        ]
        for aid, node, hours_ago, action, reason in actions:
            conn.execute(insert(node_actions).values(
                id=aid, time=AS_OF - timedelta(hours=hours_ago), node=node, action=action,
                reason=reason))
        # gpu005's drain was undone by a person: its event closed after the drain.
        conn.execute(insert(node_events).values(
            node="gpu005", start=AS_OF - timedelta(hours=30), end=AS_OF - timedelta(hours=20),
            state="DRAIN", reason="rsc_health:manual:x"))
    data = gather(engine, AS_OF, _opts(skip=FIGURES))
    out = data.out_of_service.set_index("node")
    assert list(data.out_of_service["node"]) == ["gpu003", "gpu001"]  # newest outage first
    assert out.loc["gpu001", "state"] == "DRAIN" and out.loc["gpu001", "source"] == "node event"
    assert out.loc["gpu001", "age_hours"] == pytest.approx(48)
    assert out.loc["gpu003", "state"] == "DRAIN (drain_now)"
    assert out.loc["gpu003", "source"] == "rsc-health action"
    assert out.loc["gpu003", "age_hours"] == pytest.approx(6)

    html = write_report(data, tmp_path / "out").html.read_text()
    section = _section(html, "out_of_service")
    assert "Out of service now (2)" in section
    assert "bad psu (jdoe)" in section and "2.0 d" in section and "6.0 h" in section
    assert "gpu004" not in section and "gpu005" not in section and "gpu006" not in section


# --- 3. the pull list ----------------------------------------------------------------------------

FAIL_DAYS = (2, 3, 4, 5, 6)  # gpu001 fails a single-node job 5 h before each of these days


def _lemon_history(engine) -> None:
    made = Jobs(engine)
    for day in range(1, 21):
        for node in ("gpu001", "gpu002", "gpu003"):
            made.add(node, "COMPLETED", AS_OF - timedelta(days=day))
    for day in FAIL_DAYS:
        made.add("gpu001", "FAILED", AS_OF - timedelta(days=day, hours=5), cause="xid")


def test_pull_list_says_how_long_each_candidate_has_been_listed_its_state_and_ticket(
        engine, tmp_path):
    _lemon_history(engine)
    with engine.begin() as conn:
        conn.execute(insert(tickets).values(node="gpu001", opened=AS_OF - timedelta(days=1),
                                            reason="swap GPU tray", source="lemon"))
        conn.execute(insert(tickets).values(  # closed: not the node's ticket any more
            node="gpu001", opened=AS_OF - timedelta(days=9), closed=AS_OF - timedelta(days=8),
            reason="old", source="manual"))
        conn.execute(insert(node_actions).values(
            id="l1", time=AS_OF - timedelta(hours=1), node="gpu001", action="lemon_drain",
            reason="rsc_health:lemon:node_fails:node_fails 5 (min 3)"))
    # The node is a candidate on every day on which at least node_fails (3) of its failures
    # came before that day: today and each earlier day k with 3 failures on or before it.
    earlier = [k for k in range(1, 10) if sum(d >= k for d in FAIL_DAYS) >= 3]
    expected = 1 + len(earlier)

    data = gather(engine, AS_OF, _opts(skip=FIGURES, listed_days_max=10))
    row = data.lemons.set_index("node").loc["gpu001"]
    assert list(data.lemons["node"]) == ["gpu001"]
    assert row["days_listed"] == expected and not row["listed_capped"]
    assert row["slurm_state"] == "DRAIN (lemon_drain) for 1.0 h"
    assert row["ticket"].endswith("(lemon): swap GPU tray") and "old" not in row["ticket"]
    assert row["last_action"] == f"lemon_drain {AS_OF - timedelta(hours=1):%Y-%m-%d %H:%M}"

    written = write_report(data, tmp_path / "out")
    section = _section(written.html.read_text(), "lemons")
    assert f"{expected} d" in section and "swap GPU tray" in section
    assert "DRAIN (lemon_drain) for 1.0 h" in section
    assert f"gpu001 (listed {expected} d)" in written.summary.read_text()

    capped = gather(engine, AS_OF, _opts(skip=FIGURES, listed_days_max=2))
    assert capped.lemons["days_listed"].tolist() == [2] and capped.lemons["listed_capped"].all()


def test_days_listed_stops_walking_back_once_every_candidate_dropped_out():
    asked: list[datetime] = []
    listed = {1: {"a", "b"}, 2: {"a"}, 3: set(), 4: {"a", "b"}}

    def listed_on(when: datetime) -> set[str]:
        asked.append(when)
        return listed[(AS_OF - when).days]

    assert morning.days_listed(["a", "b"], listed_on, AS_OF, 10) == {"a": 3, "b": 2}
    assert len(asked) == 3  # day 4 is never evaluated: the streaks had ended


def test_nightly_days_listed_carry_on_from_last_nights_report_with_no_walk(engine, tmp_path):
    """Last night's report.json (24 h earlier) listed gpu001 for 4 days: tonight it is 5, and
    no earlier day is judged again; the result is what the full walk gives."""
    _lemon_history(engine)
    walked = gather(engine, AS_OF, _opts(skip=FIGURES, listed_days_max=10))
    last_night = {"as_of": (AS_OF - timedelta(days=1)).isoformat(sep=" "),
                  "lemons": [{"node": "gpu001",
                              "days_listed": int(walked.lemons["days_listed"].iloc[0]) - 1}]}

    carried = gather(engine, AS_OF, _opts(skip=FIGURES, listed_days_max=10,
                                          previous=last_night))

    assert carried.lemons["days_listed"].tolist() == walked.lemons["days_listed"].tolist()


@pytest.mark.parametrize("previous", [
    None,
    {"as_of": "2024-01-01 00:00:00", "lemons": [{"node": "a", "days_listed": 3}]},  # a gap
    {"as_of": "not a time", "lemons": []},
    {"lemons": [{"node": "a", "days_listed": 3}]},  # no as_of
    {"as_of": "{day}", "lemons": [{"node": "a", "days_listed": None}]},  # not counted then
])
def test_without_a_usable_report_from_the_day_before_the_walk_decides(previous):
    if previous and previous.get("as_of") == "{day}":
        previous = {**previous, "as_of": (AS_OF - timedelta(days=1)).isoformat(sep=" ")}
    assert morning.streak_from_previous(["a"], previous, AS_OF, 7) is None


def test_a_carried_streak_counts_new_candidates_as_one_and_stops_at_the_cap():
    last_night = {"as_of": (AS_OF - timedelta(hours=24)).isoformat(),
                  "lemons": [{"node": "a", "days_listed": 7}, {"node": "gone", "days_listed": 2}]}
    assert morning.streak_from_previous(["a", "b"], last_night, AS_OF, 7) == {"a": 7, "b": 1}


# --- 4. nodes whose checks stopped ----------------------------------------------------------


def test_nodes_whose_checks_stopped_or_cannot_look(engine, tmp_path):
    beats = [
        Heartbeat("gpu001", AS_OF - timedelta(minutes=5), "sweep", "ok", 0, 1.0, "1"),
        Heartbeat("gpu002", AS_OF - timedelta(hours=3), "sweep", "ok", 0, 1.0, "1"),
        Heartbeat("gpu002", AS_OF - timedelta(hours=30), "prolog", "ok", 0, 1.0, "1"),
        Heartbeat("gpu003", AS_OF - timedelta(minutes=2), "sweep", "checker_error", 2, 1.0, "1"),
    ]
    with engine.begin() as conn:
        record_runs(conn, beats)
    data = gather(engine, AS_OF, _opts(skip=FIGURES, stale_after_s=900))
    rows = data.stale.set_index("node")
    assert list(data.stale["node"]) == ["gpu002", "gpu003"]  # stopped first
    assert rows.loc["gpu002", "stopped"] and not rows.loc["gpu002", "broken"]
    assert rows.loc["gpu002", "age_hours"] == pytest.approx(3)  # its newest run, any source
    assert rows.loc["gpu003", "broken"] and not rows.loc["gpu003", "stopped"]

    html = write_report(data, tmp_path / "out").html.read_text()
    section = _section(html, "stale")
    assert "checks stopped (1) or cannot look (1)" in section
    assert "3.0 h" in section and "checker error" in section and "gpu001" not in section
    cards = html[html.index('id="headline"'):html.index('<section id="lemons">')]
    assert "1 with a broken checker" in cards


# --- 5. XIDs per GPU ----------------------------------------------------------------------


def test_xids_per_gpu_counts_intervals_in_the_window_most_first(engine, tmp_path):
    rows = [  # (node, gpu, code, days ago, status)
        *[("gpu001", "gpu3", "xid79", d, "fail") for d in (1, 2, 3)],
        ("gpu001", "gpu3", "xid48", 4, "fail"),
        ("gpu002", "gpu0", "xid63", 1, "warn"),
        ("gpu002", "gpu0", "xid63", 40, "fail"),  # before the 28-day window
        ("gpu002", "gpu1", "", 2, "ok"),  # an all-clear is no XID
        ("gpu003", "gpu5", "xid94", 2, "fail"),
        ("gpu003", "gpu5", "xid94", 6, "fail"),
    ]
    with engine.begin() as conn:
        for i, (node, gpu, code, days, status) in enumerate(rows):
            when = AS_OF - timedelta(days=days)
            conn.execute(insert(check_results).values(
                id=f"x{i}", time=when, last_seen=when, node=node, source="sweep",
                check="xid", component=gpu, status=status, severity="none", code=code,
                reason=""))
    data = gather(engine, AS_OF, _opts(skip=FIGURES))
    assert data.xids[["node", "gpu", "intervals"]].values.tolist() == [
        ["gpu001", "gpu3", 4], ["gpu003", "gpu5", 2], ["gpu002", "gpu0", 1]]
    assert data.xids.loc[0, "codes"] == "xid79 x3, xid48 x1"
    assert data.xids.loc[0, "last_seen"] == AS_OF - timedelta(days=1)

    top = gather(engine, AS_OF, _opts(skip=FIGURES, xid_top=1))
    html = write_report(top, tmp_path / "out").html.read_text()
    section = _section(html, "xids")
    assert "top 1 of 3 GPUs, 7 intervals" in section
    assert "xid79 x3, xid48 x1" in section and "gpu5" not in section


# --- 6. data freshness -------------------------------------------------------------------


def test_freshness_names_the_newest_row_of_each_input_and_flags_a_stale_one(engine, tmp_path):
    made = Jobs(engine)
    made.add("gpu001", "COMPLETED", AS_OF - timedelta(hours=1))
    made.add("gpu001", "COMPLETED", AS_OF + timedelta(hours=1))  # after as_of: not counted
    with engine.begin() as conn:
        record_runs(conn, [Heartbeat("gpu001", AS_OF - timedelta(hours=2), "sweep", "ok", 0,
                                     1.0, "1")])
        conn.execute(insert(node_events).values(
            node="gpu001", start=AS_OF - timedelta(days=10), end=AS_OF - timedelta(days=9),
            state="DOWN", reason="x"))
    data = gather(engine, AS_OF, _opts(skip=FIGURES, stale_after_s=900, sacct_stale_hours=6))
    rows = {r["input"].split(" (")[0]: r for r in data.freshness.to_dict("records")}
    assert rows["node heartbeats"]["newest"] == AS_OF - timedelta(hours=2)
    assert rows["node heartbeats"]["stale"]  # 2 h > 900 s
    assert rows["sacct jobs"]["newest"] == AS_OF - timedelta(hours=1)
    assert not rows["sacct jobs"]["stale"]
    assert rows["node events"]["age_hours"] == pytest.approx(240) and not rows["node events"][
        "stale"]
    assert pd.isna(rows["tickets"]["newest"]) and rows["tickets"]["note"] == (
        "none in the historian yet")

    written = write_report(data, tmp_path / "out")
    section = _section(written.html.read_text(), "freshness")
    assert section.count("STALE") == 1 and "10.0 d" in section
    assert "STALE INPUT: node heartbeats (node path spools) (newest 2.0 h old)" in (
        written.summary.read_text())


# --- 8. the empty historian ---------------------------------------------------------------

SECTIONS = ("lemons", "out_of_service", "stale", "xids", "freshness", "actions")


def test_an_empty_historian_renders_every_section_with_a_reason(engine, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING):
        data = gather(engine, AS_OF)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [n for n in data.notes.values() if "unavailable" in n or "Error" in n], data.notes
    html = write_report(data, tmp_path / "out").html.read_text()
    assert "Traceback" not in html and "unavailable" not in html
    for anchor in SECTIONS:
        section = _section(html, anchor)
        assert re.search(r'class="(why|muted)"[^>]*>[^<]*\w', section), anchor
    # The reasons name the missing input, not just "none".
    assert "no node events or rsc-health actions in the historian yet" in _section(
        html, "out_of_service")
    assert "no node-path heartbeats in the historian yet" in _section(html, "stale")
    assert "no check results in the historian yet" in _section(html, "xids")
    assert _section(html, "freshness").count("none in the historian yet") == 4
    cards = html[html.index('id="headline"'):html.index('<section id="lemons">')]
    assert "no r_f yet" in cards and "no heartbeats yet" in cards
    for figure in re.findall(r"<figcaption>(.*?)</figcaption>", html, re.S):
        assert "muted" in figure  # every empty figure says why


# --- qualification ------------------------------------------------------------------------


def test_qualification_runs_of_the_last_day_say_passed_failed_and_why(engine, tmp_path):
    from rsc_health.historian.schema import qualify_runs

    runs = [("r1", "gpu010", "full", AS_OF - timedelta(hours=2), "pass", "", "101"),
            ("r2", "gpu011", "full", AS_OF - timedelta(hours=1), "fail",
             "nccl_all_reduce: nccl-bw/allreduce_8589934592_busbw -6.0% vs peers median", "102"),
            ("r3", "gpu012", "lite", AS_OF - timedelta(hours=3), "inconclusive",
             "dcgm_r1: tool not found", None),
            ("r0", "gpu013", "full", AS_OF - timedelta(hours=30), "pass", "", "90")]  # too old
    with engine.begin() as conn:
        for run_id, node, tier, ended, verdict, reason, job in runs:
            conn.execute(insert(qualify_runs).values(
                run_id=run_id, node=node, tier=tier, started=ended - timedelta(minutes=9),
                ended=ended, verdict=verdict, reason=reason, gpu_model="H100", driver="570",
                job_id=job))
    data = gather(engine, AS_OF, _opts(skip=FIGURES))
    assert list(data.qualified["node"]) == ["gpu011", "gpu010", "gpu012"]  # newest first
    section = _section(write_report(data, tmp_path / "out").html.read_text(), "qualified")
    assert "(1 passed, 1 failed, 1 inconclusive)" in section
    assert "FAIL" in section and "-6.0% vs peers median" in section and "gpu013" not in section
