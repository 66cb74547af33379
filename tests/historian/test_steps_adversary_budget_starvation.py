"""One user's files spend the pass's line budget (steps_max_lines_per_pass) before another
user's later files, in every pass: "the next pass reads them again" never comes.

step_files takes each owner's files in turn so a flood cannot push another user's files past
steps_max_files (docs/failslow.md "Limits"); the line budget is spent first-come in that same
order, so one owner with steps_max_lines_per_pass / steps_max_lines files of steps_max_lines
lines (4 files of 5M by default: garbage will do) leaves every other owner's files after
their 3rd-4th unread, pass after pass. Scaled down through the config keys themselves:
steps_max_lines 5, steps_max_lines_per_pass 20 (the defaults' 1:4 ratio)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner
from sqlalchemy import func, insert, select

from rsc_health.cli import cli
from rsc_health.historian import db, schema


def test_a_flooders_files_starve_another_users_later_files_in_every_pass(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, create_missing=True)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    with engine.begin() as conn:
        pk = conn.execute(insert(schema.jobs).values(
            job_id="555", job_id_display="555", state="RUNNING", submit=now,
            start=now - timedelta(hours=1), end=None, nnodes=2, user="nobody",
            instance_key="555:x").returning(schema.jobs.c.id)).scalar_one()
        conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n}
                                                for n in ("n1", "n2")])
    drop = tmp_path / "drop"
    drop.mkdir()
    t = (now - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for i in range(5):  # nobody's five jobs' windows: one line each
        f = drop / f"nobody-{i}.jsonl"
        f.write_text(json.dumps({"job_id": "555", "rank": 0, "node": "n1", "step": i,
                                 "seconds": 1.0, "time": t}) + "\n")
        os.chown(f, 65534, 65534)
        os.chmod(f, 0o644)
    for i in range(5):  # daemon's flood: max_lines lines of nothing each
        f = drop / f"flood-{i}.jsonl"
        f.write_text("x\n" * 5)
        os.chown(f, 1, 1)
        os.chmod(f, 0o644)
    site = tmp_path / "site.toml"
    site.write_text("[failslow]\nsteps_max_lines = 5\nsteps_max_lines_per_pass = 20\n")
    for _ in range(3):  # three passes
        out = CliRunner().invoke(cli, ["--db", url, "--config", str(site), "ingest", "steps",
                                       "--json", str(drop)])
        assert out.exit_code == 0, out.output
    with engine.connect() as conn:
        kept = conn.execute(select(func.count()).select_from(schema.step_times)).scalar()
    engine.dispose()
    said = json.loads(out.output)
    assert kept == 5, f"nobody's rows after 3 passes: {kept} of 5; last pass said " + \
        "; ".join(str(b) for b in said["bad"] if "budget" in str(b))
