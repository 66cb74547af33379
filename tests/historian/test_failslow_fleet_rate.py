"""Judged against the fleet's own rate (`fleet_chance`, [failslow] fleet_chance_per_node_day;
issue 25, docs/failslow.md "The fleet's own rate"): a port counting errors two sweeps running is
a suspect at its second sweep unless the fleet's healthy ports, in the same window, burst alone
as large and as often that two in a row on one port would come by chance more often than the
budget allows; then it waits a third sweep. A port counting past every burst the fleet shows is
still a suspect at two. The fleet's rate is its one-sweep excursions only: another node's port
going bad, or a job's fabric event, is not chance."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from rsc_health.config import ConfigError, load_config
from rsc_health.historian.failslow import detect_frame
from rsc_health.historian.failslow.core import Rules, find_runs, fleet_rates, judged

T0 = datetime(2026, 11, 26, 10, 0, 0)
SWEEPS = 12
DEFAULTS = load_config(None)
PORTS = [f"mlx5_{p}:1" for p in range(8)]
TARGET = "t02"  # the judged job's node whose port counts


def _site(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(str(path))


def _fleet(target: dict[int, float], others: int = 6, burst: float = 0.05,
           background: str = "bursts") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The judged job `t` (8 nodes; t02's port mlx5_3 counting target[sweep] errors/s) beside
    `others` jobs of 8 nodes each, in one window. background: "bursts" (three healthy ports
    of each other job burst `burst`/s for one sweep, one node a slot, rotating over the
    ports), "going_bad" (one port of each other job counts `burst`/s from sweep 3 on), or
    "quiet" (no errors anywhere else)."""
    rng = np.random.default_rng(7)
    jobs = {"t": [f"t{i:02d}" for i in range(8)]}
    jobs.update({f"j{j}": [f"j{j}n{i}" for i in range(8)] for j in range(others)})
    members, rows = [], []
    for j, (job, nodes) in enumerate(jobs.items()):
        members += [{"job_id": job, "node": n, "start": T0, "end": T0 + timedelta(hours=2)}
                    for n in nodes]
        for i, node in enumerate(nodes):
            phase = int(rng.integers(5, 290))
            for s in range(SWEEPS):
                value, port = 0.0, PORTS[0]
                if node == TARGET and s in target:
                    value, port = target[s], PORTS[3]
                elif job != "t" and background == "bursts" and s in (2, 5, 8) \
                        and (s + j) % 8 == i:
                    value, port = burst, PORTS[(j + s) % 8]
                elif job != "t" and background == "going_bad" and i == 4 and s >= 3:
                    value, port = burst, PORTS[3]
                rows.append({"node": node, "time": T0 + timedelta(seconds=60 + 300 * s + phase),
                             "metric": "ib_error_rate", "value": value, "component": port})
    return pd.DataFrame(rows), pd.DataFrame(members)


def _confirmed_at(samples: pd.DataFrame, members: pd.DataFrame, cfg) -> list[int]:
    """The sweeps (of TARGET's) at which its runs were confirmed."""
    rules = cfg if isinstance(cfg, Rules) else Rules.from_config(cfg)
    runs = find_runs(judged(samples, members, None, rules), rules)
    runs = runs[runs["node"] == TARGET]
    times = samples[samples["node"] == TARGET].sort_values("time")["time"].tolist()
    return sorted(times.index(t) for t in runs["confirmed"])


def test_the_fleet_rate_is_on_for_port_errors_by_default():
    rules = Rules.from_config(DEFAULTS)
    assert rules.fleet_chance_per_node_day > 0
    assert {m for m, r in rules.metrics.items() if r.fleet_chance} == {"ib_error_rate"}


def test_two_bursts_in_a_row_of_the_size_healthy_ports_burst_to_wait_a_third_sweep():
    pair = _fleet({6: 0.05, 7: 0.05})
    assert _confirmed_at(*pair, DEFAULTS) == []
    assert detect_frame(*pair, None, DEFAULTS) == []
    # the same port counting on: a suspect at its third sweep, and its evidence says why
    on = _fleet({6: 0.05, 7: 0.05, 8: 0.05})
    assert _confirmed_at(*on, DEFAULTS) == [8]
    (ev,) = detect_frame(*on, None, DEFAULTS)
    assert "confirmed a sweep later: the fleet's healthy ones" in ev.detail
    (past,) = detect_frame(*_fleet({6: 0.2, 7: 0.2}), None, DEFAULTS)
    assert "a sweep later" not in past.detail


def test_a_port_counting_past_every_burst_the_fleet_shows_is_a_suspect_at_two_sweeps():
    assert _confirmed_at(*_fleet({6: 0.2, 7: 0.2}), DEFAULTS) == [7]
    # rising from a burst's size past them (a partial first interval, then the port's rate):
    # one slot past every burst the fleet showed is not chance
    assert _confirmed_at(*_fleet({6: 0.05, 7: 0.2}), DEFAULTS) == [7]
    # falling from past them to a burst's size is no run at all (`counts`: under half)
    assert _confirmed_at(*_fleet({6: 0.2, 7: 0.05}), DEFAULTS) == []


def test_in_a_fleet_whose_ports_do_not_burst_two_sweeps_are_enough():
    assert _confirmed_at(*_fleet({6: 0.05, 7: 0.05}, background="quiet"), DEFAULTS) == [7]


def test_other_ports_going_bad_are_not_the_fleets_chance():
    """Six other jobs each with a port counting from sweep 3 on (runs, not one-sweep
    excursions): the target's pair is not made to wait by them (and they are suspects)."""
    samples, members = _fleet({6: 0.05, 7: 0.05}, background="going_bad")
    assert _confirmed_at(samples, members, DEFAULTS) == [7]
    found = {e.node for e in detect_frame(samples, members, None, DEFAULTS)}
    assert found == {TARGET} | {f"j{j}n4" for j in range(6)}


def test_a_budget_of_zero_or_the_key_off_gives_the_two_sweep_rule_back(tmp_path):
    pair = _fleet({6: 0.05, 7: 0.05})
    off = _site(tmp_path, "[failslow]\nfleet_chance_per_node_day = 0\n")
    assert _confirmed_at(*pair, off) == [7]
    (tmp_path / "b").mkdir()
    key_off = _site(tmp_path / "b", '[failslow.metrics.ib_error_rate]\ndirection = "high"\n'
                                    "fleet_chance = false\n")
    assert _confirmed_at(*pair, key_off) == [7]
    # a budget so loose that the fleet's own bursts are rare enough: two sweeps
    (tmp_path / "c").mkdir()
    loose = _site(tmp_path / "c", "[failslow]\nfleet_chance_per_node_day = 1.0\n")
    assert _confirmed_at(*pair, loose) == [7]


@pytest.mark.parametrize("value", [-1.0, 1.5])
def test_a_budget_outside_0_to_1_is_a_config_error(tmp_path, value):
    with pytest.raises(ConfigError, match="fleet_chance_per_node_day"):
        _site(tmp_path, f"[failslow]\nfleet_chance_per_node_day = {value}\n")


def test_a_garbled_count_in_the_fleet_or_the_run_neither_warns_nor_breaks_the_rule():
    """Counters that jumped: 1e300/s is a value like any (the fleet's bursts that large make a
    pair that large wait); inf is no sample at all (telemetry_observations drops it), so a
    fleet whose bursts all read inf is a quiet one. No numpy warning either way."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        huge = _fleet({6: 1e300, 7: 1e300}, burst=1e300)
        assert _confirmed_at(*huge, DEFAULTS) == []
        assert _confirmed_at(*_fleet({6: 1e300, 7: 1e300, 8: 1e300}, burst=1e300),
                             DEFAULTS) == [8]
        assert _confirmed_at(*_fleet({6: 0.05, 7: 0.05}, burst=float("inf")), DEFAULTS) == [7]


def test_a_site_that_also_asks_for_a_slowdown_waits_until_both_hold(tmp_path):
    """`corroborated_by` beside the fleet's rate: two conditions, both to hold before two
    sweeps suffice. Past every burst but with no slowdown shown: a third sweep; in a quiet
    fleet with no slowdown shown: a third sweep too (the site's rule, as before)."""
    site = _site(tmp_path, '[failslow.metrics.ib_error_rate]\ndirection = "high"\n'
                           'corroborated_by = ["ib_xmit_wait_rate"]\n')
    assert _confirmed_at(*_fleet({6: 0.2, 7: 0.2}), site) == []
    assert _confirmed_at(*_fleet({6: 0.2, 7: 0.2, 8: 0.2}), site) == [8]
    assert _confirmed_at(*_fleet({6: 0.05, 7: 0.05, 8: 0.05}, background="quiet"), site) == [8]


def test_the_fleets_rate_is_shown_as_the_rule_reads_it():
    """`fleet_rates`, the operator's view (healthctl suspects rates): the bursty fleet's 18
    one-sweep bursts among its judged node-sweeps, 2.5 lines past (0.05/s over a 0.02/s line),
    and a pair of them waiting; the target's own run (three sweeps) is not an excursion. A quiet
    fleet: none, nothing waits. Every judged metric is shown, the rule on or off."""
    rules = Rules.from_config(DEFAULTS)
    samples, members = _fleet({6: 0.05, 7: 0.05, 8: 0.05})
    (rate,) = fleet_rates(judged(samples, members, None, rules), rules)
    assert (rate.metric, rate.fleet_chance, rate.excursions) == ("ib_error_rate", True, 18)
    # each node's first and last judged sweeps have no sweep beside them on one side
    assert 7 * 8 * (SWEEPS - 4) <= rate.judged <= 7 * 8 * (SWEEPS - 2)
    assert rate.median_lines == pytest.approx(2.5) and rate.p90_lines == pytest.approx(2.5)
    assert rate.pair_per_node_day > rate.budget_per_node_day and rate.pair_waits
    assert rate.as_dict()["rate"] == pytest.approx(18 / rate.judged)
    quiet = fleet_rates(judged(*_fleet({}, background="quiet"), None, rules), rules)
    assert [(r.excursions, r.pair_per_node_day, r.pair_waits) for r in quiet] == [(0, 0.0, False)]
    off = Rules.from_config(DEFAULTS)
    off = type(off)(**{**off.__dict__, "fleet_chance_per_node_day": 0.0})
    assert not fleet_rates(judged(samples, members, None, off), off)[0].pair_waits
    # bursts of a counter that jumped to the float's edge: sizes past any float, and still
    # JSON (no Infinity, which strict JSON readers refuse)
    import json
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (edge,) = fleet_rates(judged(*_fleet({}, burst=1.7e308), None, rules), rules)
    assert edge.excursions == 18 and edge.median_lines == float("inf")
    assert json.loads(json.dumps(edge.as_dict(), allow_nan=False))["median_lines"] is None


def _historian_with_a_bursty_fleet(url: str, now: datetime) -> None:
    """The bursty fleet's last hour, as the historian keeps it: jobs, job_nodes and one
    telemetry_samples row per (time, node)."""
    from rsc_health.historian import db, schema

    samples, members = _fleet({6: 0.05, 7: 0.05})
    shift = now - timedelta(minutes=61) - T0
    engine = db.connect(url, upgrade=True, create_missing=True)
    try:
        with engine.begin() as conn:
            for pk, (job, nodes) in enumerate(members.groupby("job_id")["node"], start=1):
                start = T0 + shift
                conn.execute(schema.jobs.insert().values(
                    id=pk, job_id=job, job_id_display=job, state="RUNNING", submit=start,
                    start=start, end=None, nnodes=len(nodes), gpus=8 * len(nodes),
                    nodelist=",".join(nodes), instance_key=f"{job}:{start}:{start}"))
                conn.execute(schema.job_nodes.insert(), [{"job_pk": pk, "node": n}
                                                         for n in nodes])
            conn.execute(schema.telemetry_samples.insert(), [
                {"time": (r.time + shift).to_pydatetime(), "node": r.node,
                 "ib_error_rate": r.value, "ib_error_rate_c": r.component}
                for r in samples.itertuples()])
    finally:
        engine.dispose()


def test_healthctl_suspects_rates_reads_the_detectors_window(tmp_path, historian_url):
    """On SQLite and PostgreSQL: the command reads the window `detect` reads."""
    import json

    from click.testing import CliRunner

    from rsc_health.cli import cli

    url = historian_url
    _historian_with_a_bursty_fleet(url, datetime.now(UTC).replace(tzinfo=None))
    res = CliRunner().invoke(cli, ["--db", url, "suspects", "rates", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    (rate,) = out["metrics"]
    assert out["lookback_min"] == 60 and rate["metric"] == "ib_error_rate"
    # the window is the last hour: its first sweep or so is out of it, bursts kept
    assert rate["excursions"] >= 12 and rate["pair_waits"] is True
    text = CliRunner().invoke(cli, ["--db", url, "suspects", "rates"])
    assert text.exit_code == 0, text.output
    assert "ib_error_rate (fleet_chance on)" in text.output and "waits a sweep more" in text.output
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    from rsc_health.historian import db
    db.connect(empty, upgrade=True, create_missing=True).dispose()
    res = CliRunner().invoke(cli, ["--db", empty, "suspects", "rates"])
    assert res.exit_code == 0 and "no judged node-sweeps" in res.output
    # a historian that cannot be read: one line, exit 1, never "no excursions"
    (tmp_path / "dir.db").mkdir()
    res = CliRunner().invoke(cli, ["--db", f"sqlite:///{tmp_path / 'dir.db'}", "suspects",
                                   "rates"])
    assert res.exit_code == 1 and "historian database" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1
