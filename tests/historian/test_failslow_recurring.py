"""A node slow from the start of every job it runs: missed inside each job (read as a role the
job did not name), found across jobs against the fleet's own rate of outlying nodes
(historian/failslow/recurring.py, read by load.detect from telemetry_job_rollups)."""

from __future__ import annotations

import itertools
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import insert

from rsc_health import ConfigError
from rsc_health.config import load_config
from rsc_health.historian import schema, telemetry
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow import detect, detect_frame
from rsc_health.historian.failslow.core import Rules
from rsc_health.historian.failslow.recurring import (
    ACROSS_JOBS,
    ROLLUP_COLUMNS,
    chance_at_least,
    recurring_frame,
)

from .test_failslow_detect import T0, _samples

CFG = load_config(None)
RULES = Rules.from_config(CFG)
ALPHA = float(CFG.get("failslow.recurring_alpha"))
MIN_JOBS = int(CFG.get("failslow.recurring_min_jobs"))
POOL = [f"gpu{i:03d}" for i in range(1, 17)]
SLOW = "gpu005"


def _alloc(j: int, size: int = 8) -> list[str]:
    """Job j's nodes: a different eight of the sixteen each time, SLOW always among them, at
    another rank each time (a role follows the rank, not the node)."""
    others = [n for n in POOL if n != SLOW]
    rng = np.random.default_rng(j)
    pick = sorted(rng.choice(others, size=size - 1, replace=False).tolist())
    pick.insert(j % size, SLOW)
    return pick


def _rollups(jobs: int, share: float, *, alloc=_alloc, metric: str = "nvlink_data_rate",
             level: float = 8e10, role=None, workload=lambda j: f"alice\ntrain-{j}"
             ) -> pd.DataFrame:
    """Each job's nodes' means: the level, a few percent of per-node noise, SLOW at `share`;
    `role(j, nodes)` may return {node: factor} for the job's own roles; each job a workload
    of its own unless `workload(j)` says otherwise."""
    rng = np.random.default_rng(7)
    rows = []
    for j in range(jobs):
        nodes = alloc(j)
        start = T0 + timedelta(hours=7 * j)
        extra = role(j, nodes) if role else {}
        for n in nodes:
            v = level * float(np.exp(rng.normal(0, 0.03))) * extra.get(n, 1.0)
            rows.append((str(9000 + j), n, "H100", metric, v * (share if n == SLOW else 1.0),
                         start, start + timedelta(hours=6), workload(j)))
    return pd.DataFrame(rows, columns=list(ROLLUP_COLUMNS))


def _found(rollups: pd.DataFrame, **kw) -> list:
    return recurring_frame(rollups, RULES, alpha=ALPHA, min_jobs=MIN_JOBS, **kw)


def test_nvlink_at_half_from_the_start_is_excused_inside_the_job_and_found_across_six():
    # inside one job: the node is level with itself from its first sweep (levelled): no word
    member = pd.DataFrame({"job_id": "9000", "node": _alloc(0), "start": T0,
                           "end": T0 + timedelta(hours=6)})
    rng = np.random.default_rng(3)
    table = 8e10 * np.exp(rng.normal(0, 0.04, (8, 12)))
    samples = _samples(_alloc(0), "nvlink_data_rate",
                       lambda i, s: float(table[i, s]) * (0.5 if _alloc(0)[i] == SLOW else 1.0),
                       12)
    assert detect_frame(samples, member, None, CFG) == []
    # across jobs: the only outlier of 8 in each, a chance of 1/8 a job; 5 jobs (3e-5) are not
    # enough at the default alpha (1e-5), the sixth (3.8e-6) is
    assert _found(_rollups(5, 0.5)) == []
    found = _found(_rollups(6, 0.5))
    assert [(e.node, e.metric, e.source) for e in found] == [
        (SLOW, "nvlink_data_rate", "telemetry")]
    ev = found[0]
    assert ev.job_ids == tuple(str(9000 + j) for j in range(6))
    assert 0.45 < ev.value / ev.peer_median < 0.55
    assert ev.detail.startswith(ACROSS_JOBS) and "6 of its 6 placements" in ev.detail
    assert ev.since == T0 and ev.last == T0 + timedelta(hours=7 * 5 + 6)


def test_a_node_level_with_its_peers_or_a_few_percent_off_is_never_a_suspect():
    assert _found(_rollups(30, 1.0)) == []
    assert _found(_rollups(30, 0.9)) == []  # under the nvlink line (30% under its peers)


def test_a_requeued_job_on_the_same_nodes_is_one_placement_its_roles_are_not_chance():
    # the same eight nodes six times (a job requeued, a training resubmitted): SLOW's rank is
    # the same each time, so its offset may be the rank's; it counts once, never six times
    same = _rollups(6, 0.5, alloc=lambda j: _alloc(0), workload=lambda j: "alice\ntrain")
    assert _found(same) == []
    # a frame that names no workload: every job on the same nodes is taken as one
    assert _found(same.drop(columns="workload")) == []
    # six different workloads on those nodes lay out their own roles: six placements
    assert [e.node for e in _found(_rollups(6, 0.5, alloc=lambda j: _alloc(0)))] == [SLOW]
    # and the last stage of a pipeline landing on whichever nodes the job got is no one's
    def last_stage(j, nodes):
        return {n: 0.55 for n in nodes[-1:]}
    roles = _rollups(40, 1.0, alloc=lambda j: sorted(
        np.random.default_rng(j).choice(POOL, 8, replace=False).tolist()), role=last_stage)
    assert _found(roles) == []


def test_a_job_where_many_nodes_are_off_together_says_nothing_of_any_of_them():
    # a two-stage pipeline: the first four ranks move less in every job, SLOW always among
    # them (at rank 0-3): more than max_outlier_share of the job is the workload's
    def first_stage(j, nodes):
        return {n: 0.5 for n in nodes[:4]}
    r = _rollups(20, 1.0, alloc=lambda j: _alloc(j * 8), role=first_stage)
    assert (r[r["node"] == SLOW]["value"] < 0.6 * 8e10).all()
    assert _found(r) == []


def test_only_jobs_after_the_nodes_last_ended_episode_count():
    r = _rollups(10, 0.5)
    assert [e.node for e in _found(r)] == [SLOW]
    # a qualification cleared it after job 5 began: jobs 5-9 (five) are not enough alone
    cleared = T0 + timedelta(hours=7 * 5 - 1)
    assert _found(r, counted_from={SLOW: cleared}) == []
    # ... and the other nodes' peers in those jobs are untouched (a node cleared long ago)
    assert [e.node for e in _found(r, counted_from={"gpu001": T0 + timedelta(days=90)})] == [
        SLOW]


@pytest.mark.parametrize("metric,share,level", [
    ("sm_clock_ratio", 0.88, 0.99),     # clocks held 12% low
    ("throttle_hw_frac", 1.0, 0.0),     # (below: HIGH, over a median of 0)
])
def test_every_rolled_up_metric_is_judged_with_its_own_line(metric, share, level):
    if metric == "throttle_hw_frac":
        r = _rollups(8, 1.0, metric=metric, level=0.01)
        r.loc[r["node"] == SLOW, "value"] = 0.5  # in HW slowdown half of every interval
    else:
        r = _rollups(8, share, metric=metric, level=level)
    assert [(e.node, e.metric) for e in _found(r)] == [(SLOW, metric)]


def test_garbled_rollups_cost_their_own_rows_nothing_else():
    r = _rollups(8, 0.5)
    bad = r.iloc[:6].copy()
    bad["value"] = [np.nan, np.inf, -np.inf, -5e30, 1e300, 0.0]
    bad["node"] = ["x" * 300, "", "gpu099", "gpu098", "gpu097", "gpu096"]
    alien = r.iloc[:3].assign(metric="no_such_metric")
    found = _found(pd.concat([r, bad, alien], ignore_index=True))
    assert [e.node for e in found] == [SLOW]
    assert _found(pd.DataFrame(columns=list(ROLLUP_COLUMNS))) == []
    assert _found(r.iloc[:8]) == []  # one job: never enough


def test_the_chance_is_the_exact_poisson_binomial_tail():
    rng = np.random.default_rng(0)
    rows, per = [], []
    for pair in range(12):
        qs = rng.choice([0.0, 1 / 64, 1 / 8, 1 / 4, 1 / 2, 1.0], size=int(rng.integers(1, 9)))
        x = int(rng.integers(0, len(qs) + 1))
        rows += [{"node": f"n{pair}", "metric": "m", "q": float(q)} for q in qs]
        exact = sum(np.prod([q if b else 1 - q for q, b in zip(qs, bits, strict=True)])
                    for bits in itertools.product([0, 1], repeat=len(qs)) if sum(bits) >= x)
        per.append(((f"n{pair}", "m"), x, exact))
    frame = pd.DataFrame([{"x": x} for _k, x, _e in per],
                         index=pd.MultiIndex.from_tuples([k for k, _x, _e in per],
                                                         names=["node", "metric"]))
    got = chance_at_least(pd.DataFrame(rows), frame)
    assert np.allclose(got, [e for _k, _x, e in per], rtol=1e-9, atol=1e-15)


def _store(engine, rollup_jobs: int) -> None:
    """rollup_jobs finished jobs of 8 nodes with NVLink samples every 5 minutes, SLOW at half
    its peers from each job's start."""
    rng = np.random.default_rng(5)
    with engine.begin() as conn:
        for j in range(rollup_jobs):
            nodes = _alloc(j)
            start = T0 + timedelta(hours=7 * j)
            end = start + timedelta(hours=1)
            pk = conn.execute(insert(schema.jobs).values(
                job_id=str(9000 + j), job_id_display=str(9000 + j), state="COMPLETED",
                submit=start, start=start, end=end, nnodes=8,
                instance_key=f"{9000 + j}:{start}:{start}").returning(schema.jobs.c.id)
            ).scalar_one()
            conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
            conn.execute(insert(schema.telemetry_samples), [
                {"time": start + timedelta(seconds=30 + 300 * s + i), "node": n,
                 "nvlink_data_rate": 8e10 * float(np.exp(rng.normal(0, 0.04)))
                 * (0.5 if n == SLOW else 1.0), "nvlink_data_rate_c": "gpu3"}
                for i, n in enumerate(nodes) for s in range(11)])


def test_the_historian_rolls_up_the_jobs_and_the_detector_finds_the_node_across_them(historian):
    _store(historian, 6)
    now = T0 + timedelta(hours=7 * 6)
    telemetry.rollup(historian, now, CFG)
    found = [e for e in detect(historian, now, CFG) if e.detail.startswith(ACROSS_JOBS)]
    assert [(e.node, e.metric, len(e.job_ids)) for e in found] == [
        (SLOW, "nvlink_data_rate", 6)]
    assert hs.record(historian, found, now, expire_after=timedelta(hours=24)) == {SLOW: "new"}
    # found on history whose last slow job ended days ago (the judge's first pass on a new
    # install): the judgement is now's, so the episode waits for qualification, not expiry
    later = now + timedelta(days=3)
    again = [e for e in detect(historian, later, CFG) if e.detail.startswith(ACROSS_JOBS)]
    assert [e.last for e in again] == [later]
    assert hs.record(historian, again, later, expire_after=timedelta(hours=24)) == {
        SLOW: "renewed"}
    assert hs.expire(historian, later + timedelta(hours=1)) == []
    # a qualification cleared it: the jobs it had already run are judged, none count again
    hs.clear(historian, SLOW, later, who="qualify", why="passed against 7 peers")
    assert [e for e in detect(historian, later + timedelta(minutes=5), CFG)
            if e.detail.startswith(ACROSS_JOBS)] == []


def test_recurring_days_zero_turns_the_judge_off(historian, tmp_path):
    _store(historian, 6)
    now = T0 + timedelta(hours=7 * 6)
    telemetry.rollup(historian, now, CFG)
    site = tmp_path / "rsc-health.toml"
    site.write_text("[failslow]\nrecurring_days = 0\n")
    cfg = load_config(site)
    assert [e for e in detect(historian, now, cfg) if e.detail.startswith(ACROSS_JOBS)] == []
    assert [e.node for e in detect(historian, now, CFG)
            if e.detail.startswith(ACROSS_JOBS)] == [SLOW]


def test_a_historian_lost_while_reading_the_rollups_is_an_error_never_no_suspects(
        historian, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from rsc_health.historian.db import HistorianUnavailable
    from rsc_health.historian.failslow import load

    def gone(*a, **k):
        raise OperationalError("SELECT telemetry_job_rollups", {},
                               Exception("server closed the connection"))

    monkeypatch.setattr(load, "job_rollups", gone)
    with pytest.raises(HistorianUnavailable, match="server closed the connection"):
        detect(historian, T0 + timedelta(hours=1), CFG)


def test_a_historian_lost_while_keeping_the_judgements_time_is_an_error_and_judged_again(
        historian, monkeypatch):
    # the judgement was made, the write of its time failed: the pass says so in one line, and
    # the next pass judges again rather than waiting an hour on a time never kept
    from sqlalchemy.exc import OperationalError

    from rsc_health.historian.db import HistorianUnavailable
    from rsc_health.historian.failslow import load

    _store(historian, 6)
    now = T0 + timedelta(hours=7 * 6)
    telemetry.rollup(historian, now, CFG)
    keep = load._judged_across

    def gone(*a, **k):
        raise OperationalError("INSERT INTO ingest_cursors", {},
                               Exception("could not write: No space left on device"))

    monkeypatch.setattr(load, "_judged_across", gone)
    with pytest.raises(HistorianUnavailable, match="No space left on device") as err:
        detect(historian, now, CFG)
    assert "\n" not in str(err.value)
    monkeypatch.setattr(load, "_judged_across", keep)
    assert _across(historian, now + timedelta(minutes=1)) == [SLOW]


@pytest.mark.parametrize("key,value", [("recurring_alpha", 0), ("recurring_alpha", 1.5),
                                       ("recurring_alpha", -1e-5), ("recurring_days", -1),
                                       ("recurring_days", "inf"), ("recurring_min_jobs", 0),
                                       ("recurring_every_min", -1),
                                       ("recurring_every_min", "nan")])
def test_a_nonsense_setting_is_refused_in_one_line_naming_it(historian, tmp_path, key, value):
    # refused where the site file is read (the schema's ranges) or, for what a range cannot
    # say (a chance of exactly 0), where the detector reads it: never judged with it
    site = tmp_path / "rsc-health.toml"
    site.write_text(f"[failslow]\n{key} = {value}\n")
    with pytest.raises((ConfigError, ValueError), match=rf"\[failslow\] {key}") as err:
        detect(historian, T0, load_config(site))
    assert "\n" not in str(err.value)


def _across(engine, when, cfg=CFG) -> list[str]:
    return [e.node for e in detect(engine, when, cfg) if e.detail.startswith(ACROSS_JOBS)]


def test_across_jobs_is_judged_once_an_hour_and_its_episode_holds_between(historian, tmp_path):
    """`suspects apply` runs every minute; reading and judging a 16,000-node week takes about
    14 s. The passes between two judgements judge inside jobs only, and the episode the last
    one opened stays open until the next renews it."""
    _store(historian, 6)
    now = T0 + timedelta(hours=7 * 6)
    telemetry.rollup(historian, now, CFG)
    assert _across(historian, now) == [SLOW]
    hs.record(historian, [e for e in detect(historian, now + timedelta(hours=1), CFG)
                          if e.detail.startswith(ACROSS_JOBS)], now + timedelta(hours=1),
              expire_after=timedelta(hours=24))
    t = now + timedelta(hours=1)
    for minutes in (1, 30, 59):
        assert _across(historian, t + timedelta(minutes=minutes)) == []
    assert [e.node for e in hs.active(historian)] == [SLOW]
    assert _across(historian, t + timedelta(minutes=60)) == [SLOW]
    # 0: every pass
    site = tmp_path / "every.toml"
    site.write_text("[failslow]\nrecurring_every_min = 0\n")
    every = load_config(site)
    assert _across(historian, t + timedelta(minutes=61), every) == [SLOW]
    assert _across(historian, t + timedelta(minutes=61), every) == [SLOW]
    # never more than half of expire_after_h: an hour's episodes would expire between
    short = tmp_path / "short.toml"
    short.write_text("[suspects]\nexpire_after_h = 1\n")
    assert _across(historian, t + timedelta(minutes=61 + 29), load_config(short)) == []
    assert _across(historian, t + timedelta(minutes=61 + 30), load_config(short)) == [SLOW]


def test_the_suspects_list_says_when_the_judge_last_looked_across_jobs(historian, tmp_path):
    # an operator asking why a node is not (yet) a suspect: when was it last judged, how often
    import json

    from click.testing import CliRunner

    from rsc_health.cli import cli

    url = historian.url.render_as_string(hide_password=False)
    listed = CliRunner().invoke(cli, ["--db", url, "suspects"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[0] == (
        "across jobs: not judged yet (every 60 min by `suspects apply`; [failslow] "
        "recurring_every_min)")
    _store(historian, 6)
    now = T0 + timedelta(hours=7 * 6)
    telemetry.rollup(historian, now, CFG)
    detect(historian, now, CFG)
    listed = CliRunner().invoke(cli, ["--db", url, "suspects"])
    assert listed.output.startswith(f"across jobs: last judged {now:%Y-%m-%d %H:%M} UTC (")
    js = json.loads(CliRunner().invoke(cli, ["--db", url, "suspects", "--json"]).output)
    assert js["across_jobs_judged"] == now.isoformat()
    off = tmp_path / "off.toml"
    off.write_text("[failslow]\nrecurring_days = 0\n")
    listed = CliRunner().invoke(cli, ["--config", str(off), "--db", url, "suspects"])
    assert listed.output.startswith("across jobs: off ([failslow] recurring_days = 0)")
    # the cadence the detector keeps, not the key's: capped at half of expire_after_h
    short = tmp_path / "short.toml"
    short.write_text("[suspects]\nexpire_after_h = 1\n")
    listed = CliRunner().invoke(cli, ["--config", str(short), "--db", url, "suspects"])
    assert "(every 30 min by `suspects apply`" in listed.output.splitlines()[0], listed.output


@pytest.mark.parametrize("kept", ["2099-01-01T00:00:00", "not a time", "", "\x00" * 300,
                                  "2099-01-01T00:00:00+05:00"])
def test_a_last_judgement_in_the_future_or_garbled_is_no_reason_to_wait(historian, kept):
    # the clock stepped back, or a row someone edited: judged now, and the time kept again
    from sqlalchemy import text

    from rsc_health.historian.failslow.load import ACROSS_CURSOR

    _store(historian, 6)
    now = T0 + timedelta(hours=7 * 6)
    telemetry.rollup(historian, now, CFG)
    with historian.begin() as conn:
        conn.execute(insert(schema.ingest_cursors).values(name=ACROSS_CURSOR,
                                                          value=kept.replace("\x00", "?")))
    assert _across(historian, now) == [SLOW]
    with historian.connect() as conn:
        assert conn.execute(text("SELECT value FROM ingest_cursors WHERE name = :n"),
                            {"n": ACROSS_CURSOR}).scalar() == now.isoformat()
    assert _across(historian, now + timedelta(minutes=1)) == []


def test_passes_at_once_each_keep_the_judgements_time_none_fails(historian):
    # the timer's pass and the strigger hook's at the same second, on PostgreSQL: a delete
    # then an insert by each met the other's uncommitted row and failed (a unique violation,
    # the pass a traceback); the time is kept by one upsert (ingest.bulk_write), as sacct's is
    import threading

    from rsc_health.historian.failslow import load

    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def keep(k: int) -> None:
        start.wait()
        for i in range(25):
            try:
                load._judged_across(historian, T0 + timedelta(minutes=k * 100 + i))
            except BaseException as exc:  # noqa: BLE001  (collected, asserted below)
                errors.append(exc)

    threads = [threading.Thread(target=keep, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert load.last_across(historian) is not None


def _store_steps(engine, jobs: int, factor: float, *, with_jobs: bool = True) -> None:
    """jobs jobs of 8 nodes writing step times (the historian keeps each node's slowest rank
    per step), SLOW's ranks `factor` slower from each job's first step: a steady offset.
    `with_jobs`: the jobs themselves too, as sacct delivers them (a step file is the job's
    word: only rows of a job Slurm ran, on its nodes, in its run, are judged)."""
    rng = np.random.default_rng(12)
    with engine.begin() as conn:
        for j in range(jobs):
            nodes = _alloc(j)
            start = T0 + timedelta(hours=7 * j)
            if with_jobs:
                jid = str(9100 + j)
                pk = conn.execute(insert(schema.jobs).values(
                    job_id=jid, job_id_display=jid, state="COMPLETED", submit=start,
                    start=start, end=start + timedelta(hours=1), nnodes=8, user=f"u{j}",
                    name=f"w{j}", cluster="c1", instance_key=f"{jid}:{start}:{start}")
                    .returning(schema.jobs.c.id)).scalar_one()
                conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n}
                                                        for n in nodes])
            # eight ranks a node, 2% noise a step, rank 3 of SLOW `factor` slower
            sec = 0.5 * np.exp(rng.normal(0, 0.02, (8, 8, 24)))
            sec[nodes.index(SLOW), 3] *= factor
            rows = [{"job_id": str(9100 + j), "node": n, "stage": "", "step": w,
                     "rank": i * 8 + int(sec[i, :, w].argmax()),
                     "time": start + timedelta(seconds=150 * w + 149),
                     "seconds": float(sec[i, :, w].max())}
                    for i, n in enumerate(nodes) for w in range(24)]
            conn.execute(insert(schema.step_times), rows)


def test_steps_a_steady_few_percent_behind_in_every_job_are_a_suspect_across_jobs(historian):
    # in each job the node is 10% behind from its first step: a steady offset (no onset),
    # which the sweeps excuse once the job's start is out of their window (the suspect-memory
    # tests); job after job, at another rank each time, it is the node's
    _store_steps(historian, 6, 1.1)
    now = T0 + timedelta(hours=7 * 6)
    found = detect(historian, now, CFG)
    assert [(e.node, e.metric, e.source) for e in found] == [(SLOW, "step_seconds", "steps")]
    assert found[0].detail.startswith(ACROSS_JOBS)
    # a node level with its peers in every job: nothing
    with historian.begin() as conn:
        conn.execute(schema.step_times.delete())
    _store_steps(historian, 6, 1.0, with_jobs=False)
    assert detect(historian, now, CFG) == []
    # the same files of job ids Slurm never ran (no jobs rows): nothing either, slow or not
    with historian.begin() as conn:
        conn.execute(schema.step_times.delete())
        conn.execute(schema.job_nodes.delete())
        conn.execute(schema.jobs.delete())
    _store_steps(historian, 6, 1.1, with_jobs=False)
    assert detect(historian, now, CFG) == []


def test_a_trainings_stageless_last_stage_resubmitted_under_new_ids_is_one_placement(historian):
    # a team's training resubmitted every 7 hours onto its 8 reserved nodes under a new job id
    # each time, its step files naming no stage: its last stage's node (the last in hostlist
    # order, the loss and the head) computes 20% longer in every run. One workload on one node
    # set: one placement, a role, never a suspect. Counted once per job id (before), it was
    # the only outlier of 8 in 8 placements, chance 6e-8: a suspect every 6 resubmissions.
    nodes = POOL[:8]
    rng = np.random.default_rng(21)
    with historian.begin() as conn:
        for j in range(8):
            start = T0 + timedelta(hours=7 * j)
            pk = conn.execute(insert(schema.jobs).values(
                job_id=str(9300 + j), job_id_display=str(9300 + j), state="COMPLETED",
                submit=start, start=start, end=start + timedelta(hours=1), nnodes=8,
                user="alice", name="llama-pretrain", cluster="c1",
                instance_key=f"{9300 + j}:{start}:{start}").returning(schema.jobs.c.id)
            ).scalar_one()
            conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
            sec = 0.5 * np.exp(rng.normal(0, 0.02, (8, 24)))
            sec[-1] *= 1.2
            conn.execute(insert(schema.step_times), [
                {"job_id": str(9300 + j), "node": n, "stage": "", "step": w, "rank": i * 8,
                 "time": start + timedelta(seconds=150 * w + 149), "seconds": float(sec[i, w])}
                for i, n in enumerate(nodes) for w in range(24)])
    now = T0 + timedelta(hours=7 * 8)
    assert _across(historian, now) == []
    # the same node 20% behind in jobs of eight workloads (another user's each time): found
    with historian.begin() as conn:
        conn.execute(schema.jobs.update().values(name=schema.jobs.c.job_id))
    assert _across(historian, now + timedelta(hours=1)) == [nodes[-1]]


def test_hostile_job_names_are_only_part_of_a_key_never_a_suspect_of_their_own(historian):
    # six jobs whose names carry a newline, '|', Latin-1 text and 4,000 characters, one
    # name looking like another user's key: read, judged, and the node found as before
    _store(historian, 6)
    names = ["a\nb", "x|y|z", "caf\u00e9 \xff", "n" * 4000, "alice\ntrain", ""]
    with historian.begin() as conn:
        for j, name in enumerate(names):
            conn.execute(schema.jobs.update().where(schema.jobs.c.job_id == str(9000 + j))
                         .values(name=name, user="a\nb" if j == 0 else "bob"))
    now = T0 + timedelta(hours=7 * 6)
    telemetry.rollup(historian, now, CFG)
    found = [e for e in detect(historian, now, CFG) if e.detail.startswith(ACROSS_JOBS)]
    assert [(e.node, len(e.job_ids)) for e in found] == [(SLOW, 6)]
    assert "\n" not in found[0].detail
