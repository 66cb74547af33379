"""`healthctl qualify auto` takes suspects in order of the deviation alone (hs.active), so a
job's step files, whose deviation is whatever the job wrote, put their (healthy) nodes ahead
of a node its own telemetry showed slow: with [qualify] auto_max_nodes 4 per run, four
step-file suspects take the run and the telemetry suspect waits for a later one.

The tier's guard ranks "the node's own telemetry before a job's step files (untrusted: their
deviation is what the job wrote)" (rsc_health/suspects.py plan); qualify.flow
.suspect_candidates iterates hs.active(), sorted by -deviation, node, with no source key."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from rsc_health.cli import AppContext
from rsc_health.commands.qualify import qualify as qualify_cmd
from rsc_health.config import load_config
from rsc_health.historian import db
from rsc_health.historian.failslow.evidence import STEPS, TELEMETRY, SuspectEvidence
from rsc_health.slurm.memory import MemorySlurm
from rsc_health.suspects import manager_pass

TRUSTED = "rsc_trusted"


def _ev(node, at, dev, source, metric):
    return SuspectEvidence(node=node, metric=metric, value=1.0, peer_median=0.5,
                           deviation=dev, since=at - timedelta(minutes=10), last=at,
                           job_ids=("101",), source=source, detail="x")


def test_step_file_suspects_go_to_qualification_before_a_telemetry_suspect(tmp_path):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm = MemorySlurm()
    for i in range(1, 41):
        slurm.add_node(f"node{i:02d}", features=("h100", TRUSTED), weight=10)
    conf = tmp_path / "c.toml"
    conf.write_text("[suspects]\nmax_share = 0.2\n")
    config = load_config(str(conf))
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
    evidence = [_ev(f"node{i:02d}", now, 99.0, STEPS, "step_seconds") for i in range(1, 6)]
    evidence.append(_ev("node10", now, 5.0, TELEMETRY, "throttle_hw_frac"))
    manager_pass(engine, slurm, config, now, detect=lambda e, n, c: list(evidence))
    lost = sorted(n for n, i in slurm.info.items() if TRUSTED not in i.features)
    assert "node10" in lost and len(lost) == 6  # all six applied by the tier
    obj = AppContext(config_path=str(conf), db_url=str(engine.url))
    obj.slurm = slurm
    out = CliRunner().invoke(qualify_cmd, ["auto", "--dry-run", "--json"], obj=obj)
    assert out.exit_code == 0, out.output
    due = [d["node"] for d in json.loads(out.output)["due"]]
    engine.dispose()
    assert len(due) == 4
    assert "node10" in due, f"qualified this run: {due}; the telemetry suspect node10 waits"
