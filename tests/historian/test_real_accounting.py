"""The historian reads a real slurmdbd: jobs that complete, fail and get cancelled, and a node
drain, go through real `sacct -a -X -D --parsable2` and `sacctmgr -P show event` output."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.db import connect
from rsc_health.historian.ingest import events, sacct

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
    cluster.wait_for(
        lambda: len(sacct.run_sacct("2020-01-01T00:00:00", "2099-01-01T00:00:00", 30).split()) >= 3,
        60,
        "slurmdbd to list the jobs",
    )
    engine = connect(f"sqlite:///{tmp_path / 'h.db'}")
    report = sacct.ingest_incremental(engine, since="2020-01-01T00:00:00", gpus_per_node=8)
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
    sacct.ingest_incremental(engine, since="2020-01-01T00:00:00")
    with engine.connect() as conn:
        assert len(conn.execute(select(schema.jobs)).all()) == len(jobs)

    text = events.run_sacctmgr("2020-01-01T00:00:00", 30)
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
