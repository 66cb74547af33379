"""Reliability metrics over a small hand-built job table, on SQLite and on PostgreSQL.

Every expected number below is worked out by hand from the table in `_JOBS`.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from datetime import datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, insert, text

from rsc_health.cli import cli
from rsc_health.commands.metrics import parse_what_if
from rsc_health.historian.db import connect
from rsc_health.historian.metrics._sql import Window, poisson_rate_ci
from rsc_health.historian.metrics.goodput import goodput_lost
from rsc_health.historian.metrics.mttf import mttf_by_size, projected_mttf_hours
from rsc_health.historian.metrics.rates import (
    causes,
    cooccurrence,
    failure_rate,
    outcomes,
    rolling,
)
from rsc_health.historian.schema import attributions, job_nodes, jobs, metadata

PG_URL = os.environ.get(
    "RSC_HEALTH_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
T0 = datetime(2024, 1, 1)
H = timedelta(hours=1)

# pk, job_id, state, gpus, nnodes, start (hours after T0; None = never ran), runtime h, nodes
_JOBS = [
    (1, "100", "COMPLETED", 256, 32, 0, 10, [f"a{i:02d}" for i in range(32)]),
    (2, "200", "NODE_FAIL", 256, 32, 0, 2, [f"b{i:02d}" for i in range(32)]),
    (3, "300", "FAILED", 512, 64, 1, 5, [f"c{i:02d}" for i in range(64)]),
    (4, "400", "FAILED", 512, 64, 1, 1, [f"d{i:02d}" for i in range(64)]),
    (5, "500", "FAILED", 8, 1, 0, 20, ["e00"]),
    (6, "600", "COMPLETED", 128, 16, 0, 24, [f"f{i:02d}" for i in range(16)]),
    # The requeue of job 200 one minute after its NODE_FAIL, taking node x00 from job 800.
    (7, "200", "COMPLETED", 256, 32, 2 + 1 / 60, 4, [f"b{i:02d}" for i in range(31)] + ["x00"]),
    (8, "800", "PREEMPTED", 4, 1, 2 + 1 / 60 - 3, 3, ["x00"]),
    (9, "900", "PREEMPTED", 16, 2, 2 + 1 / 60 - 3, 3, ["y00", "y01"]),
    (10, "1000", "CANCELLED", 8, 1, None, 0, ["z00"]),
]
# job pk, node, cause, kind
_ATTRIBUTIONS = [
    (3, "c00", "xid", "check"),
    (3, "c00", "pcie", "check"),
    (4, None, "unattributed", "unattributed"),
    (5, "e00", "infiniband", "check"),
]


def _load(engine) -> None:
    metadata.create_all(engine)
    job_rows, node_rows = [], []
    for pk, job_id, state, gpus, nnodes, start_h, run_h, nodes in _JOBS:
        submit = T0 - H
        start = None if start_h is None else T0 + start_h * H
        end = (T0 + 30 * H) if start is None else start + run_h * H
        job_rows.append(
            dict(
                id=pk,
                job_id=job_id,
                job_id_display=job_id,
                name=f"job{job_id}",
                user="u",
                partition="p",
                state=state,
                exit_code="0:0",
                submit=submit,
                eligible=submit,
                start=start,
                end=end,
                nnodes=nnodes,
                gpus=gpus,
                nodelist="",
                instance_key=f"{job_id}:{pk}",
            )
        )
        node_rows += [dict(job_pk=pk, node=n) for n in nodes]
    with engine.begin() as conn:
        conn.execute(insert(jobs), job_rows)
        conn.execute(insert(job_nodes), node_rows)
        conn.execute(
            insert(attributions),
            [
                dict(job_pk=p, node=n, cause=c, code="", evidence="", kind=k)
                for p, n, c, k in _ATTRIBUTIONS
            ],
        )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request, tmp_path):
    if request.param == "sqlite":
        eng = create_engine(f"sqlite:///{tmp_path / 'h.db'}")
        _load(eng)
        yield eng
        eng.dispose()
        return
    name = f"rsc_metrics_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng = create_engine(PG_URL.rsplit("/", 1)[0] + f"/{name}")
    try:
        _load(eng)
        yield eng
    finally:
        eng.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_failure_rate_counts_node_fail_and_attributed_failed_over_large_job_node_days(engine):
    fr = failure_rate(engine)
    # > 128 GPUs: jobs 1, 2, 3, 4, 7. Node-days = (32*10 + 32*2 + 64*5 + 64*1 + 32*4) / 24.
    assert fr.jobs == 5
    assert fr.node_days == pytest.approx(896 / 24)
    # NODE_FAIL (job 2) + FAILED with a check (job 3); job 4's FAILED is unattributed.
    assert fr.failures == 2
    assert fr.r_f == pytest.approx(2 / (896 / 24))
    assert fr.ci_low < fr.r_f < fr.ci_high


def test_failure_rate_threshold_is_strictly_more_than(engine):
    # At > 0 GPUs job 5 (8 GPUs, ib) joins and so does the 128-GPU job 6's runtime.
    fr = failure_rate(engine, large_job_gpus=0)
    assert fr.failures == 3
    assert fr.node_days == pytest.approx((896 + 20 + 16 * 24 + 1 * 3 + 2 * 3) / 24)


def test_window_selects_jobs_by_end_time(engine):
    # Only jobs that ended before T0+3h: 2 (ends 2h), 4 (2h); 8 and 9 end at 2h01m.
    fr = failure_rate(engine, Window(until=T0 + 3 * H))
    assert (fr.jobs, fr.failures) == (2, 1)
    assert fr.node_days == pytest.approx((32 * 2 + 64 * 1) / 24)


def test_outcomes_split_hardware_failures_and_weigh_gpu_hours(engine):
    df = outcomes(engine).set_index("outcome")
    assert df["jobs"].to_dict() == {
        "COMPLETED": 3,
        "FAILED (HW)": 2,
        "PREEMPTED": 2,
        "NODE_FAIL (HW)": 1,
        "FAILED": 1,
        "CANCELLED": 1,
    }
    total = 2560 + 512 + 2560 + 512 + 160 + 3072 + 1024 + 12 + 48
    assert df.loc["COMPLETED", "gpu_hours"] == pytest.approx(2560 + 3072 + 1024)
    assert df.loc["FAILED (HW)", "gpu_hours"] == pytest.approx(2560 + 160)
    assert df.loc["CANCELLED", "gpu_hours"] == 0
    assert df.loc["NODE_FAIL (HW)", "gpu_hour_share"] == pytest.approx(512 / total)
    assert df.loc["COMPLETED", "job_share"] == pytest.approx(0.3)
    assert df["gpu_hour_share"].sum() == pytest.approx(1.0)


def test_causes_rate_per_gpu_hour_and_cooccurrence(engine):
    df = causes(engine).set_index("cause")
    total_gpu_h = 2560 + 512 + 2560 + 512 + 160 + 3072 + 1024 + 12 + 48
    assert set(df.index) == {"xid", "pcie", "infiniband", "unattributed"}
    assert (df["failures"] == 1).all()
    assert df.loc["xid", "per_gpu_hour"] == pytest.approx(1 / total_gpu_h)
    assert df.loc["pcie", "cooccurring"] == 1 and df.loc["infiniband", "cooccurring"] == 0
    # Shares are of the three distinct failures (2, 3 and 5).
    assert df.loc["unattributed", "share"] == pytest.approx(1 / 3)
    pairs = cooccurrence(engine)
    assert pairs.to_dict("records") == [{"cause_a": "pcie", "cause_b": "xid", "failures": 1}]


def test_rolling_rate_stacks_modes_to_the_cluster_rate(engine):
    df = rolling(engine, days=30)
    last = df.iloc[-1]
    # Everything ends within two days, so the last 30-day window holds all large jobs.
    assert last["node_days"] == pytest.approx(896 / 24)
    assert last["total"] == pytest.approx(1000 * 2 / (896 / 24))
    # Job 3 splits half to xid and half to pcie; job 2 is unattributed.
    assert last["xid"] == pytest.approx(last["pcie"])
    assert last["unattributed"] == pytest.approx(2 * last["xid"])
    assert "infiniband" not in df.columns  # 8 GPUs is not a large job


def test_mttf_by_size_buckets_and_gamma_interval(engine):
    df = mttf_by_size(engine, r_f=6.5e-3).set_index("size")
    # 8 bucket: job 5 (8 GPUs, 20 h, failure), job 8 (4 -> 8 GPUs, 3 h), job 10 (never ran).
    assert df.loc["8", "jobs"] == 3 and df.loc["8", "failures"] == 1
    assert df.loc["8", "mttf_hours"] == pytest.approx(23.0)
    assert df.loc["256", "runtime_hours"] == pytest.approx(16.0)
    assert df.loc["256", "mttf_hours"] == pytest.approx(16.0)
    assert df.loc["512", "mttf_hours"] == pytest.approx(6.0)
    assert df.loc["16", "failures"] == 0 and math.isnan(df.loc["16", "mttf_hours"])
    assert math.isinf(df.loc["16", "ci_high_hours"])
    lo, hi = poisson_rate_ci(1, 16.0, 0.9)
    assert df.loc["256", "ci_low_hours"] == pytest.approx(1 / hi)
    assert df.loc["256", "ci_high_hours"] == pytest.approx(1 / lo)
    assert df.loc["256", "projected_hours"] == pytest.approx(24 / (32 * 6.5e-3))


def test_goodput_lost_to_failures_and_to_the_requeues_preemptions(engine):
    df = goodput_lost(engine)
    got = {(r.size, r.kind): r.gpu_hours_lost for r in df.itertuples()}
    assert got == pytest.approx(
        {
            ("8", "failure"): 0.5 * 8,  # job 5: min(20 h, 30 min) x 8
            ("8", "preemption"): 0.5 * 4,  # job 8 lost x00 to job 200's requeue
            ("256", "failure"): 0.5 * 256,  # job 2's NODE_FAIL after 2 h
            ("512", "failure"): 0.5 * 512,  # job 3
        }
    )


def test_paper_mttf_projections_at_16k_and_131k_gpus():
    rf = 6.50 / 1000
    assert round(projected_mttf_hours(16_384, rf), 1) == 1.8
    assert round(projected_mttf_hours(131_072, rf), 2) == 0.23


def test_gamma_interval_matches_chi_square_form():
    from scipy.stats import chi2

    lo, hi = poisson_rate_ci(7, 100.0, 0.9)
    assert lo == pytest.approx(chi2.ppf(0.05, 14) / 200)
    assert hi == pytest.approx(chi2.ppf(0.95, 16) / 200)


def _add_runs(engine) -> None:
    """Run A: job 5000 NODE_FAILs after 20 h, its requeue FAILs after 10 h, the user resubmits
    (job 5001, 1 h later) which completes after 30 h. Run B: a resubmission 37 h later."""
    rows = [
        # pk, job_id, state, eligible h, start h, runtime h
        (100, "5000", "NODE_FAIL", 100, 101, 20),
        (101, "5000", "FAILED", 121, 122, 10),
        (102, "5001", "COMPLETED", 133, 133, 30),
        (103, "5002", "COMPLETED", 200, 200, 12),
    ]
    with engine.begin() as conn:
        conn.execute(
            insert(jobs),
            [
                dict(
                    id=pk,
                    job_id=jid,
                    job_id_display=jid,
                    name="llama",
                    user="alice",
                    partition="p",
                    state=st,
                    exit_code="0:0",
                    submit=T0 + el * H,
                    eligible=T0 + el * H,
                    start=T0 + s * H,
                    end=T0 + (s + r) * H,
                    nnodes=64,
                    gpus=512,
                    nodelist="",
                    instance_key=f"{jid}:{pk}",
                )
                for pk, jid, st, el, s, r in rows
            ],
        )


def test_measured_ettr_chains_requeues_and_linked_resubmissions(engine):
    from rsc_health.historian.metrics.ettr import EttrModel, hours, minutes
    from rsc_health.historian.metrics.runs import RunOptions, job_runs

    _add_runs(engine)
    opts = RunOptions(link_by="name_user", dt_cp=hours(1), min_run_hours=10, gap_s=6 * 3600)
    runs = job_runs(engine, r_f=6.5e-3, opts=opts)
    runs = runs[runs["name"] == "llama"].reset_index(drop=True)
    assert list(runs["runtime_hours"]) == pytest.approx([60.0, 12.0])
    a = runs.iloc[0]
    assert (a["job_ids"], a["instances"], a["interruptions"]) == (2, 3, 2)
    assert a["wallclock_hours"] == pytest.approx(63.0)
    # 3 starts x 5 min, 2 interruptions x half an hour, 60 h x 5/65 writing checkpoints.
    productive = 60 - 3 * 5 / 60 - 2 * 0.5 - 60 * 5 / 65
    assert a["productive_hours"] == pytest.approx(productive)
    assert a["measured_ettr"] == pytest.approx(productive / 63)
    model = EttrModel(
        64,
        6.5e-3,
        runtime=hours(productive),
        u0=minutes(5),
        w_cp=minutes(5),
        dt_cp=hours(1),
        queue=hours(1),
    )
    assert a["expected_ettr"] == pytest.approx(model.expected())


def test_link_by_job_id_keeps_resubmissions_apart(engine):
    from rsc_health.historian.metrics.ettr import hours
    from rsc_health.historian.metrics.runs import RunOptions, job_runs

    _add_runs(engine)
    opts = RunOptions(link_by="job_id", dt_cp=hours(1), min_run_hours=10)
    runs = job_runs(engine, r_f=6.5e-3, opts=opts)
    llama = runs[runs["name"] == "llama"]
    assert sorted(llama["runtime_hours"]) == pytest.approx([12.0, 30.0, 30.0])
    assert sorted(llama["instances"]) == [1, 1, 2]


# -- the commands ---------------------------------------------------------------------------


@pytest.fixture()
def db_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    # the store's own versioned schema, as `healthctl` expects it
    engine = connect(url, create_missing=True)
    _load(engine)
    _add_runs(engine)
    engine.dispose()
    return url


def _run(db_url, *args):
    result = CliRunner().invoke(cli, ["--config", "/dev/null", "--db", db_url, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_failure_rate_json_matches_the_hand_count(db_url):
    out = json.loads(_run(db_url, "failure-rate", "--json"))
    # The base table (2 failures, 896/24 node-days) plus run A/B: 4 x 64-node instances, 1
    # NODE_FAIL, 72 h; the FAILED requeue has no attribution.
    node_days = 896 / 24 + 64 * 72 / 24
    assert out["failures"] == 3
    assert out["node_days"] == pytest.approx(node_days)
    # JSON in the table's unit, named in the key: failures per 1000 node-days.
    assert out["r_f_per_1000_node_days"] == pytest.approx(3000 / node_days)


def test_failure_rate_and_ettr_on_a_young_cluster_say_why_and_exit_0(tmp_path):
    from click.testing import CliRunner

    from rsc_health.cli import cli

    url = f"sqlite:///{tmp_path / 'young.db'}"
    assert CliRunner().invoke(cli, ["--db", url, "db", "upgrade"]).exit_code == 0
    fr = CliRunner().invoke(cli, ["--db", url, "failure-rate"])
    assert fr.exit_code == 0 and "nothing to measure yet" in fr.output and "---" not in fr.output
    ettr = CliRunner().invoke(cli, ["--db", url, "ettr"])
    assert ettr.exit_code == 0 and "no ETTR yet" in ettr.output


def test_no_historian_configured_is_one_line_and_no_database_file(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rsc_health.cli import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    out = CliRunner().invoke(cli, ["--config", "/dev/null", "failure-rate"])
    assert out.exit_code == 1 and "no historian configured" in out.output
    assert list(tmp_path.iterdir()) == []


def test_outcomes_table_names_hardware_failures(db_url):
    out = _run(db_url, "outcomes")
    assert "NODE_FAIL (HW)" in out and "FAILED (HW)" in out


def test_mttf_projection_option_reproduces_the_paper(db_url):
    out = json.loads(
        _run(db_url, "mttf", "--rf", "6.5", "--project", "16384", "--project", "131072", "--json")
    )
    got = {p["gpus"]: round(p["projected_hours"], 2) for p in out["projections"]}
    assert got == {16384: 1.8, 131072: 0.23}
    assert {s["size"] for s in out["sizes"]} >= {"8", "256", "512"}


def test_ettr_what_if_halving_rf_raises_expected_ettr(db_url):
    out = json.loads(
        _run(
            db_url,
            "ettr",
            "--nodes",
            "1500",
            "--rf",
            "6.5",
            "--what-if",
            "rf=0.5x",
            "--what-if",
            "wcp=10s",
            "--json",
        )
    )
    base, half, fast = out
    assert half["r_f_per_1000"] == pytest.approx(3.25)
    assert fast["w_cp_min"] == pytest.approx(10 / 60)
    assert half["eq1_expected"] > base["eq1_expected"]
    assert fast["eq1_expected"] == pytest.approx(0.92, abs=0.01)
    for row in out:
        assert row["eq1_expected"] == pytest.approx(row["monte_carlo"], rel=0.05)


def test_ettr_lists_measured_runs_with_what_if_column(db_url, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[ettr]\nmin_run_hours = 10.0\n")
    result = CliRunner().invoke(
        cli,
        [
            "--config",
            str(cfg),
            "--db",
            db_url,
            "ettr",
            "--top",
            "2",
            "--what-if",
            "rf=0.5x",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    top = out["top"]
    assert [r["runtime_hours"] for r in top] == pytest.approx([60.0, 24.0])
    assert top[0]["name"] == "llama" and top[0]["instances"] == 3
    assert top[0]["expected rf=0.5x"] > top[0]["expected_ettr"]


def test_causes_rolling_goodput_render(db_url):
    assert "pcie" in _run(db_url, "causes")
    rolling = json.loads(_run(db_url, "rolling", "--json"))
    assert rolling[-1]["total"] > 0
    lost = json.loads(_run(db_url, "goodput", "--json"))
    assert {r["kind"] for r in lost} == {"failure", "preemption"}


def test_since_until_narrow_the_window(db_url):
    out = json.loads(_run(db_url, "outcomes", "--until", "2024-01-01T03:00:00", "--json"))
    # Ended before 03:00: jobs 2 and 4 (02:00), 8 and 9 (02:01).
    assert {r["outcome"]: r["jobs"] for r in out} == {
        "NODE_FAIL (HW)": 1,
        "FAILED": 1,
        "PREEMPTED": 2,
    }


@pytest.mark.parametrize(
    "text, expected",
    [
        ("rf=0.5x", ("rf", 0.5, True)),
        ("rf=2.34", ("rf", 2.34e-3, False)),
        ("wcp=2m", ("wcp", 2 / 1440, False)),
        ("wcp=10s", ("wcp", 10 / 86400, False)),
    ],
)
def test_what_if_parsing(text, expected):
    what, value, rel = parse_what_if(text)
    assert (what, rel) == (expected[0], expected[2])
    assert value == pytest.approx(expected[1])


def test_link_by_tag_joins_differently_named_jobs_with_the_same_tag(engine):
    from rsc_health.historian.metrics.ettr import hours
    from rsc_health.historian.metrics.runs import RunOptions, job_runs

    _add_runs(engine)
    with engine.begin() as conn:
        conn.execute(
            jobs.update().where(jobs.c.job_id == "5001").values(name="llama-resume run=L7")
        )
        conn.execute(jobs.update().where(jobs.c.job_id == "5000").values(name="llama run=L7"))
    opts = RunOptions(link_by="tag", dt_cp=hours(1), min_run_hours=10)
    runs = job_runs(engine, r_f=6.5e-3, opts=opts)
    tagged = runs[runs["name"].str.contains("run=L7")]
    assert list(tagged["runtime_hours"]) == pytest.approx([60.0])
    assert int(tagged["instances"].iloc[0]) == 3
    # Job 5002 ("llama", no tag) stays a run of its own.
    assert (runs["name"] == "llama").sum() == 1


def test_preemption_counts_only_within_the_window_of_the_requeue_start(engine):
    # Job 11 held x00 too, but was preempted 10 minutes before job 200's requeue started.
    requeue_start = T0 + (2 + 1 / 60) * H
    with engine.begin() as conn:
        conn.execute(
            insert(jobs),
            [
                dict(
                    id=11,
                    job_id="1100",
                    job_id_display="1100",
                    name="j",
                    user="u",
                    partition="p",
                    state="PREEMPTED",
                    exit_code="0:0",
                    submit=T0,
                    eligible=T0,
                    start=requeue_start - 2 * H,
                    end=requeue_start - timedelta(minutes=10),
                    nnodes=1,
                    gpus=8,
                    nodelist="",
                    instance_key="1100:11",
                )
            ],
        )
        conn.execute(insert(job_nodes), [dict(job_pk=11, node="x00")])

    def preempted(window_s):
        df = goodput_lost(engine, preempt_window_s=window_s)
        return df.loc[df["kind"] == "preemption", "jobs"].sum()

    assert preempted(300) == 1  # job 8 only
    assert preempted(900) == 2  # job 11 joins


def test_a_victim_ending_at_either_edge_of_the_preemption_window_counts_on_every_database(
        engine):
    """The window [requeue start - w, requeue start + w] is closed at both ends. On SQLite the
    shifted edge was rendered "...SS.fff" and compared as text with the stored "...SS.ffffff",
    so a victim that ended exactly at requeue start + w sorted after it and was left out: the
    same accounting gave SQLite one preempted job fewer than PostgreSQL."""
    requeue_start = T0 + (2 + 1 / 60) * H
    w = timedelta(seconds=300)
    _one_node_jobs(engine, [
        (11, "1100", "PREEMPTED", 8, requeue_start - 3 * H, requeue_start - w, "x00"),
        (12, "1200", "PREEMPTED", 8, requeue_start - 3 * H, requeue_start + w, "x00"),
        (13, "1300", "PREEMPTED", 8, requeue_start - 3 * H,
         requeue_start + w + timedelta(seconds=1), "x00"),
        (14, "1400", "PREEMPTED", 8, requeue_start - 3 * H,
         requeue_start - w - timedelta(seconds=1), "x00"),
    ])
    df = goodput_lost(engine, preempt_window_s=w.total_seconds())
    # job 8 (ended at the requeue start), 11 and 12 (at the edges); not 13 or 14 (a second out)
    assert df.loc[df["kind"] == "preemption", "jobs"].sum() == 3


def _one_node_jobs(engine, rows: list[tuple], **extra) -> None:
    """One-node job instances (pk, job id, state, GPUs, start, end, node) and their node."""
    with engine.begin() as conn:
        conn.execute(insert(jobs), [dict(
            id=pk, job_id=jid, job_id_display=jid, name="j", user="u", partition="p",
            state=state, exit_code="0:0", submit=T0, eligible=T0, start=s, end=e, nnodes=1,
            gpus=gpus, nodelist=node, instance_key=f"{jid}:{pk}", **extra)
            for pk, jid, state, gpus, s, e, node in rows])
        conn.execute(insert(job_nodes), [dict(job_pk=row[0], node=row[-1]) for row in rows])


def test_a_job_id_of_another_cluster_is_no_requeue_in_goodput(engine):
    """Two clusters in one historian both count job ids up from their own start: cluster
    beta's job 200, which began after alpha's job 200 failed, was taken for its requeue, and
    the beta job it displaced by chance on one of its own nodes was charged to alpha's
    failure. A requeue is the same job id on the same cluster."""
    start = T0 + 5 * H
    _one_node_jobs(engine, [(20, "200", "COMPLETED", 8, start, start + H, "q00"),
                            (21, "2100", "PREEMPTED", 4, start - 3 * H, start, "q00")],
                   cluster="beta")
    df = goodput_lost(engine)
    preempted = df[df["kind"] == "preemption"]
    assert preempted["jobs"].sum() == 1  # job 8 only, as before beta's jobs came
    assert preempted["gpu_hours_lost"].sum() == pytest.approx(0.5 * 4)


def test_only_the_next_instance_of_a_failed_job_is_its_requeue_in_goodput(engine):
    """Job 200 failed, was requeued (pk 7, COMPLETED at 6 h), and ran again at 8 h (a user
    resubmitting under the same id, or its own preemption's requeue). That third instance
    took node w00 from job 2300: charged to the failure at 2 h as if it were the requeue.
    Only the next instance after the failure is."""
    start = T0 + 8 * H
    _one_node_jobs(engine, [(22, "200", "COMPLETED", 8, start, start + H, "w00"),
                            (23, "2300", "PREEMPTED", 4, start - 3 * H, start, "w00")])
    df = goodput_lost(engine)
    preempted = df[df["kind"] == "preemption"]
    assert preempted["jobs"].sum() == 1  # job 8, displaced by the requeue at 2 h 1 min
    assert preempted["gpu_hours_lost"].sum() == pytest.approx(0.5 * 4)


@pytest.mark.parametrize("link_by", ["job_id", "name_user", "tag"])
def test_a_job_id_of_another_cluster_is_not_folded_into_one_run(engine, link_by):
    """Alpha's job 7000 and beta's job 7000 (two clusters in one historian, each counting job
    ids from its own start) ran 30 hours each, four days apart, under one name and user: they
    were folded into one Job ID's requeue chain, a 60-hour run from alpha's start to beta's
    end (its ETTR the idle days between). Each cluster's job is its own submission now."""
    from rsc_health.historian.metrics.runs import RunOptions, job_runs

    rows = [(30, "alpha", T0 + 100 * H), (31, "beta", T0 + 230 * H)]
    with engine.begin() as conn:
        conn.execute(insert(jobs), [dict(
            id=pk, job_id="7000", job_id_display="7000", name="sweep run=x7", user="carol",
            partition="p", state="COMPLETED", exit_code="0:0", submit=s, eligible=s, start=s,
            end=s + 30 * H, nnodes=2, gpus=16, nodelist="", instance_key=f"7000:{pk}",
            cluster=cluster) for pk, cluster, s in rows])
    opts = RunOptions(link_by=link_by, min_run_hours=40)
    runs = job_runs(engine, r_f=6.5e-3, opts=opts)
    assert not (runs["name"] == "sweep run=x7").any(), runs[["name", "runtime_hours"]]
    assert len(job_runs(engine, r_f=6.5e-3, opts=RunOptions(link_by=link_by,
                                                             min_run_hours=25))
               .query("name == 'sweep run=x7'")) == 2
