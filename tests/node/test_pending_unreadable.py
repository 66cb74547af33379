"""pending_verdict.json exists only while a drain verdict is held (Slurm away, the mass-drain
guard, someone else's drain). One that cannot be read (garbled, cut short, nested too deep) is
discarded, and the run went on as if none had been held: heartbeat "ok", no checker error,
only a line on stderr, so the fault it held (an XID whose kernel-log line was consumed when it
was held) was lifted in silence. Now the run that discards it says so as a checker error: the
verdict is not "ok", the spool and the textfile carry it, and the next run is clean."""

from __future__ import annotations

import json

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import _no_slurm, _records, node_env  # noqa: F401 - the fixture


@pytest.mark.parametrize("text", ['{"level": 3, "why": "slurm_unavail', "[" * 200_000,
                                  '{"level": NaN, "why": "guard", "causes": []}',
                                  '{"level": 3, "causes": [{"family": "xid"}]}'],
                         ids=["cut_short", "nested_too_deep", "nan_level", "cause_missing_keys"])
def test_an_unreadable_pending_verdict_is_a_checker_error_never_a_silent_ok(node_env, text):  # noqa: F811
    sdir = node_env / NODE_STATE
    sdir.mkdir(parents=True, exist_ok=True)
    (sdir / nodepath.PENDING_VERDICT_FILE).write_text(text)

    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0  # the job runs

    records = _records(node_env)
    beat = [r for r in records if r["kind"] == "heartbeat"][-1]
    assert beat["level"] == "checker_error" and beat["checker_errors"] == 1
    lost = [r for r in records if r.get("code") == "state_error"]
    assert len(lost) == 1 and nodepath.PENDING_VERDICT_FILE in lost[0]["reason"]
    assert not (sdir / nodepath.PENDING_VERDICT_FILE).exists()  # discarded, said once
    assert nodepath.run_stage("prolog", slurm_factory=_no_slurm) == 0
    assert [r for r in _records(node_env) if r["kind"] == "heartbeat"][-1]["level"] == "ok"


def test_a_readable_pending_verdict_is_no_checker_error(node_env):  # noqa: F811
    """The guard-held XID 79 verdict it was written for: a drain, never a lost-state error."""
    sdir = node_env / NODE_STATE
    sdir.mkdir(parents=True, exist_ok=True)
    cause = {"family": "xid", "component": "gpu0", "status": "fail", "severity": "drain_now",
             "reason": "XID 79", "code": "xid79"}
    (sdir / nodepath.PENDING_VERDICT_FILE).write_text(json.dumps(
        {"level": 3, "why": "slurm_unavailable", "causes": [cause],
         "time": "2026-11-24T00:00:00+00:00"}))
    nodepath.run_stage("prolog", slurm_factory=_no_slurm)
    assert not [r for r in _records(node_env) if r.get("code") == "state_error"]
    assert [r for r in _records(node_env) if r["kind"] == "heartbeat"][-1]["level"] == "drain_now"
