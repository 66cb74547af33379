"""Step lines for a node the job never ran on make it a suspect *across jobs*.

docs/failslow.md "Step times from jobs": step times "can make a node a suspect, never drain
it, and only a node the job ran on by Slurm's accounting (job_nodes), at a time it ran there:
a file naming other nodes makes none of them a suspect". step_observations (the sweeps)
enforces that with an inner join on the job's membership and its run's times;
load.job_steps (the across-jobs judge, recurring.py) does not: it keeps every (job, node)
row, giving rows of unknown (job, node) pairs the workload "job ID".

Reached whenever the owner filter does not stand between the file and the table: the
documented "jobs write through root (a Slurm epilog that moves the job's file in)" setup (a
root-owned file is read whole), `[failslow] steps_owner_must_match = false`, or stdin."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.cli import cli
from rsc_health.config import load_config
from rsc_health.historian import db, schema
from rsc_health.historian.failslow import detect

POOL = [f"gpu{i:03d}" for i in range(1, 17)]
VICTIM = "gpu099"  # in no job, ever


@pytest.mark.parametrize("owner_check", ["epilog-root-owned", "owner_must_match-false"])
def test_a_file_naming_a_node_outside_every_job_makes_it_an_across_jobs_suspect(
        tmp_path, owner_check):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, create_missing=True)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    t0 = now - timedelta(days=3)
    rng = np.random.default_rng(3)
    drop = tmp_path / "drop"
    drop.mkdir()
    for j in range(6):
        nodes = sorted(rng.choice(POOL, size=8, replace=False).tolist())
        start = t0 + timedelta(hours=7 * j)
        end = start + timedelta(hours=1)
        with engine.begin() as conn:  # real jobs 800.., the victim in none of them
            pk = conn.execute(insert(schema.jobs).values(
                job_id=str(800 + j), job_id_display=str(800 + j), state="COMPLETED",
                submit=start, start=start, end=end, nnodes=8, user=f"u{j}",
                name=f"train-{j}", cluster="c1",
                instance_key=f"{800 + j}:{start}").returning(schema.jobs.c.id)).scalar_one()
            conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
        fake = str(900 + j)  # a job id Slurm never ran
        lines = []
        for w in range(20):
            t = start + timedelta(seconds=150 * w + 120)
            for i, n in enumerate([*nodes, VICTIM]):
                sec = 0.5 * float(np.exp(rng.normal(0, 0.02))) * (1.5 if n == VICTIM else 1)
                lines.append(json.dumps({"job_id": fake, "rank": i * 8, "node": n,
                                         "step": w, "seconds": sec,
                                         "time": t.strftime("%Y-%m-%dT%H:%M:%SZ")}))
        (drop / f"{fake}.jsonl").write_text("\n".join(lines) + "\n")  # root's (epilog)
    site = tmp_path / "site.toml"
    site.write_text("[failslow]\nsteps_owner_must_match = false\n"
                    if owner_check == "owner_must_match-false" else "")
    cfg = load_config(site)
    out = CliRunner().invoke(cli, ["--db", url, "--config", str(site), "ingest", "steps",
                                   "--json", str(drop)])
    assert out.exit_code == 0, out.output
    found = detect(engine, now, cfg)
    engine.dispose()
    assert [(e.node, e.source, e.detail[:40]) for e in found if e.node == VICTIM] == []
