"""A stuck checker never fails a job or drains a node: prolog, epilog and sweep exit 0, say why
on stderr and act on nothing when their config is broken or the node lock stays held; a broken
config is also spooled (a checker record and a checker_error heartbeat), so the historian and
`healthctl status` show the node as not checking."""

from __future__ import annotations

import json

import pytest

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE, copy_node

ENTRY_POINTS = ("prolog", "epilog", "sweep")


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    root = copy_node(tmp_path / "node")
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(root))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for name in ("SLURM_JOB_PARTITION", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_broken_config_file_exits_0_and_names_the_problem(entry, node_env, monkeypatch, capsys):
    broken = node_env / "site.toml"
    broken.write_text("[slurm\nsweep_budget_s = 45\n")
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(broken))

    assert nodepath.main([entry]) == 0

    err = capsys.readouterr().err
    assert f"rsc_health: {entry}: bad config" in err
    assert str(broken) in err
    lines = (node_env / NODE_STATE / "spool" / "pending.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    beat = next(r for r in records if r["kind"] == "heartbeat")
    assert beat["level"] == "checker_error" and beat["source"] == entry
    check = next(r for r in records if r["kind"] == "check")
    assert check["code"] == "config_error" and str(broken) in check["reason"]
    assert not (node_env / NODE_STATE / "xid_cursor.json").exists()  # nothing was judged


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_held_node_lock_exits_0_after_judging_read_only(entry, node_env, monkeypatch, capsys):
    """A healthy node whose lock someone else holds: the run still looks (a checker error
    says the lock was held), lets the job run, and moves no cursor or baseline."""
    site = node_env / "site.toml"
    site.write_text((node_env / "config.toml").read_text() + "\n[slurm]\nlock_timeout_s = 0.2\n")
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
    sdir = node_env / NODE_STATE

    with nodepath.node_lock(sdir, 1):
        assert nodepath.main([entry]) == 0

    err = capsys.readouterr().err
    assert f"rsc_health: {entry}: {sdir / nodepath.LOCK_FILE} held for 0.2s" in err
    records = [json.loads(x) for x in (sdir / "spool/pending.jsonl").read_text().splitlines()]
    assert {r["code"] for r in records if r["kind"] == "check" and r["status"] == "error"} == {
        "lock_held"}
    assert not (sdir / "xid_cursor.json").exists()


def _pending(sdir, why: str) -> None:
    from rsc_health.model import Finding, Severity, Status
    from rsc_health.policy import decide

    cause = Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW, "Xid 79: fell off the bus",
                    "xid79", True)
    nodepath.save_pending(sdir, decide([cause]), why=why)


@pytest.mark.parametrize("why", ["slurm_unavailable", "fault"])
def test_a_prolog_with_a_pending_drain_still_fails_the_job_start_when_the_config_breaks(
        why, node_env, monkeypatch, capsys):
    """An XID 79 seen while slurmctld was away is pending; then the site config breaks. The
    prolog exited 0 and jobs kept landing on the dead GPU until the config was fixed; a working
    config would have failed the start (slurmd drains the node). The verdict stays pending."""
    broken = node_env / "site.toml"
    broken.write_text("[slurm\n")
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(broken))
    sdir = node_env / NODE_STATE
    _pending(sdir, why)

    assert nodepath.main(["prolog"]) == 1
    assert "xid79" in capsys.readouterr().err
    assert nodepath.load_pending(sdir) is not None
    assert nodepath.main(["sweep"]) == 0  # only the prolog's exit drains


def test_a_guard_held_verdict_is_not_pushed_through_by_a_broken_config(node_env, monkeypatch):
    """Held by the mass-drain guard, a pending verdict lets jobs run with a working config;
    a broken config must not turn it into slurmd's drain past the guard."""
    broken = node_env / "site.toml"
    broken.write_text("[slurm\n")
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(broken))
    _pending(node_env / NODE_STATE, "guard")
    assert nodepath.main(["prolog"]) == 0
