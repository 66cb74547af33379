"""load.job_steps (across-jobs): a requeued job (sacct -D: two instances, one job id, as
schema.jobs documents) that ran both times on the same nodes loses all its step rows: the
(job, node, stage) aggregate spans both runs, so its min time is before the 2nd run's start
and its max time after the 1st run's end -- inside neither. The sweeps filter per line."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import insert

from rsc_health.cli import cli
from rsc_health.historian import db, schema
from rsc_health.historian.failslow.load import job_steps

NODES = [f"gpu{i:03d}" for i in range(1, 9)]


def test_requeued_job_keeps_its_step_rows(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, create_missing=True)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    runs = [(now - timedelta(hours=10), now - timedelta(hours=9)),   # failed, requeued
            (now - timedelta(hours=8), now - timedelta(hours=7))]
    with engine.begin() as conn:
        for k, (s, e) in enumerate(runs):
            pk = conn.execute(insert(schema.jobs).values(
                job_id="800", job_id_display="800", state="REQUEUED" if k == 0 else "COMPLETED",
                submit=runs[0][0], start=s, end=e, nnodes=8, user="u", name="train",
                cluster="c1", instance_key=f"800:{runs[0][0]}:{s}").returning(
                    schema.jobs.c.id)).scalar_one()
            conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in NODES])
    lines = []
    step = 0
    for s, _e in runs:
        for w in range(10):
            t = s + timedelta(minutes=2 + 5 * w)
            for i, n in enumerate(NODES):
                lines.append(json.dumps({"job_id": "800", "rank": i, "node": n, "step": step,
                                         "seconds": 0.5,
                                         "time": t.strftime("%Y-%m-%dT%H:%M:%SZ")}))
            step += 1
    f = tmp_path / "800.jsonl"
    f.write_text("\n".join(lines) + "\n")
    out = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", "--json", str(f)])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["written"] == 20 * 8
    got = job_steps(engine, now - timedelta(days=1), now, "step_s")
    engine.dispose()
    # every line is inside a run of job 800 on its own node: each node has its row
    assert sorted(got["node"]) == NODES, got
