"""The historian reads a real slurmdbd: jobs that complete, fail and get cancelled, and a node
drain, go through real `sacct -a -X -D --parsable2` and `sacctmgr -P show event` output."""

from __future__ import annotations

import importlib.util
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.db import connect
from rsc_health.historian.ingest import events, sacct
from rsc_health.slurm.accounting import Accounting

ACCT = Accounting(timeout_s=600)  # sacct and sacctmgr from PATH, as the test cluster has them

pytestmark = pytest.mark.slurm

_spec = importlib.util.spec_from_file_location(
    "rsc_test_slurm_cluster", Path(__file__).parents[1] / "slurm" / "cluster.py"
)
cluster_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cluster_mod)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not cluster_mod.slurm_available():
        pytest.skip("slurmctld is not installed")
    c = cluster_mod.SlurmCluster(tmp_path_factory.mktemp("acct"), nodes=3)
    if not c.accounting:
        pytest.skip("mariadb is not installed: no slurmdbd")
    c.start()
    yield c
    c.stop()


def _listed(c) -> set[str]:
    """The job ids slurmdbd lists for a window query (what an incremental ingest reads)."""
    out = c.run(["sacct", "-a", "-X", "-n", "--parsable2", "--format=JobIDRaw,End",
                 "-S", "2020-01-01"]).stdout
    return {line.split("|")[0] for line in out.split("\n") if line and "Unknown" not in line}


def _final(c, job_id: str, states: set[str]) -> bool:
    rows = c.sacct(job_id, "State")
    return bool(rows) and rows[-1][0].split()[0] in states


def test_real_sacct_and_sacctmgr_output_lands(cluster, tmp_path, monkeypatch):
    ok = cluster.sbatch("-N", "1", "-J", "hist_ok", "--wrap", "true")
    bad = cluster.sbatch("-N", "2", "-J", "hist_bad", "--wrap", "exit 3")
    for job_id, states in ((ok, {"COMPLETED"}), (bad, {"FAILED"})):
        cluster.wait_for(lambda j=job_id, s=states: _final(cluster, j, s), 60, f"job {job_id}")
    node = cluster.node_names[-1]
    cluster.run(
        ["scontrol", "update", f"nodename={node}", "state=drain", "reason=rsc_health:now:t:x"]
    )
    time.sleep(1)

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    # slurmdbd stores a job's end a moment after sacct -j shows it (the reason for the
    # cursor's overlap): wait until the window query sees both jobs
    cluster.wait_for(lambda: {ok, bad} <= _listed(cluster), 60, "slurmdbd to list the jobs")
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    report = sacct.ingest_incremental(engine, acct=ACCT, since="2020-01-01T00:00:00",
                                      gpus_per_node=8)
    assert report.bad == []
    with engine.connect() as conn:
        jobs = {r.job_id: r for r in conn.execute(select(schema.jobs))}
        nodes = conn.execute(
            select(schema.job_nodes.c.node).where(schema.job_nodes.c.job_pk == jobs[bad].id)
        ).scalars()
        assert len(list(nodes)) == 2
    assert (jobs[ok].state, jobs[ok].name) == ("COMPLETED", "hist_ok")
    assert (jobs[bad].state, jobs[bad].exit_code, jobs[bad].nnodes) == ("FAILED", "3:0", 2)
    assert jobs[bad].end >= jobs[bad].start
    assert sacct.get_cursor(engine) is not None
    # a second incremental run from the cursor adds nothing twice
    sacct.ingest_incremental(engine, acct=ACCT, since="2020-01-01T00:00:00")
    with engine.connect() as conn:
        assert len(conn.execute(select(schema.jobs)).all()) == len(jobs)

    text = events.run_sacctmgr("2020-01-01T00:00:00", ACCT)
    header = text.splitlines()[0].split("|")
    assert {"NodeName", "TimeStart", "TimeEnd", "State", "Reason"} <= set(header), header
    rep = events.ingest_text(engine, text)
    assert rep.bad == []
    with engine.connect() as conn:
        rows = conn.execute(
            select(schema.node_events).where(schema.node_events.c.node == node)
        ).all()
    assert any(r.reason == "rsc_health:now:t:x" and r.end is None for r in rows), rows
    engine.dispose()


# Job names as an adversary picks them: the parsable delimiter with Key=Value text, a newline,
# a Latin-1 byte (bytes, passed to sbatch as they are), and the longest name sbatch takes.
ADVERSARIAL_NAMES: list[str | bytes] = [
    "sweep|lr=3e-4", "two\nlines", b"caf\xe9", "fake ExcNodeList=node0[1-6] Requeue=0",
]
LONG_NAMES = (10_000, 4_000, 1_000)


def _submit(cluster, name: str | bytes) -> str | None:
    argv = ["sbatch", "--parsable", "-o", "/dev/null", "-e", "/dev/null", "-N", "1",
            "-J", name, "--wrap", "true"]
    proc = subprocess.run([a if isinstance(a, bytes) else a.encode() for a in argv],
                          env=cluster.env, capture_output=True, timeout=30)
    return proc.stdout.decode().strip().split(";")[0] if proc.returncode == 0 else None


@pytest.mark.parametrize("form", ["json", "parsable"])
def test_every_adversarially_named_job_lands_in_an_incremental_ingest(
    cluster, tmp_path, monkeypatch, form
):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    submitted = {name: _submit(cluster, name) for name in ADVERSARIAL_NAMES}
    assert all(submitted.values()), submitted
    long_name = next(
        ("L" * n for n in LONG_NAMES if (job := _submit(cluster, "L" * n)) and
         submitted.setdefault("L" * n, job)),
        None,
    )
    assert long_name is not None, "sbatch took none of the long names"
    ids = set(submitted.values())
    for job_id in ids:
        cluster.wait_for(lambda j=job_id: _final(cluster, j, {"COMPLETED"}), 60, f"job {job_id}")
    cluster.wait_for(lambda: ids <= _listed(cluster), 60, "slurmdbd to list the jobs")
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    report = sacct.ingest_incremental(engine, acct=ACCT, since="2020-01-01T00:00:00", form=form)
    assert report.bad == [], report.bad
    with engine.connect() as conn:
        names = dict(conn.execute(select(schema.jobs.c.job_id, schema.jobs.c.name)).all())
        clusters = set(conn.execute(select(schema.jobs.c.cluster)).scalars())
    assert ids <= set(names)
    assert clusters == {cluster.cluster_name}  # sacct's own Cluster field names every job
    for name, job_id in submitted.items():
        if isinstance(name, bytes):  # slurmdbd may keep the byte or store '?': either lands
            assert names[job_id] in ("caf\ufffd", "caf?", "café"), names[job_id]
        elif name == long_name:  # slurmdbd keeps a prefix of a long name; all of that lands
            assert len(names[job_id]) >= 255 and name.startswith(names[job_id])
        else:
            assert names[job_id] == name
    engine.dispose()


def test_a_drain_inside_a_real_maint_reservation_is_not_the_nodes_outage(
    cluster, tmp_path, monkeypatch
):
    from datetime import UTC, datetime, timedelta

    from rsc_health.historian.ingest import reservations
    from rsc_health.historian.lemons.features import lemon_features

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    planned, unplanned = cluster.node_names[0], cluster.node_names[1]
    cluster.run(["scontrol", "create", "reservation", "reservationname=rsc_maint",
                 "starttime=now", "duration=30", f"nodes={planned}", "flags=maint,ignore_jobs",
                 "users=root"])
    try:
        for node in (planned, unplanned):  # a reason that says nothing of maintenance
            cluster.run(["scontrol", "update", f"nodename={node}", "state=drain",
                         "reason=bob: cabling"])
        engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
        since = "2020-01-01T00:00:00"
        cluster.wait_for(
            lambda: "rsc_maint" in reservations.run_sacctmgr(since, ACCT), 60,
            "slurmdbd to list the reservation",
        )
        cluster.wait_for(
            lambda: all(f"|{n}|" in events.run_sacctmgr(since, ACCT) for n in (planned, unplanned)),
            60, "slurmdbd to list both drains",
        )
        assert reservations.ingest_text(engine, reservations.run_sacctmgr(since, ACCT)).bad == []
        assert events.ingest_text(engine, events.run_sacctmgr(since, ACCT)).bad == []
        as_of = datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=1)
        counts = lemon_features(engine, as_of)["out_count"]
        assert counts.get(planned, 0) == 0
        assert counts[unplanned] >= 1
        engine.dispose()
    finally:
        cluster.run(["scontrol", "delete", "reservation=rsc_maint"], check=False)
        for node in (planned, unplanned):
            cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)


def test_a_requeued_jobs_instances_all_land_through_sacct_json(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    job = cluster.sbatch("-N", "1", "-J", "requeued", "--requeue", "--wrap", "sleep 4")
    cluster.wait_for(lambda: cluster.job_state(job) == "RUNNING", 60, "the job to run")
    cluster.run(["scontrol", "requeue", job])
    cluster.run(["scontrol", "release", job], check=False)
    cluster.wait_for(lambda: _final(cluster, job, {"COMPLETED"}), 120, "the requeued job")
    cluster.wait_for(lambda: job in _listed(cluster), 60, "slurmdbd to list the job")
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    report = sacct.ingest_incremental(engine, acct=ACCT, since="2020-01-01T00:00:00", form="json")
    assert report.bad == []
    with engine.connect() as conn:
        states = conn.execute(
            select(schema.jobs.c.state).where(schema.jobs.c.job_id == job)
            .order_by(schema.jobs.c.submit)
        ).scalars().all()
    assert states == ["REQUEUED", "COMPLETED"]
    engine.dispose()
