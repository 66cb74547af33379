"""One odd config value pushed to every node by configuration management: it must be refused
loudly (a config_error, the node judged with its last good config) or do what the operator
meant. Never a node that looks and sees nothing, a check list read as its opposite, a guard
the config switched off or crashed, or a refusal the compiled config forgets to make
(found by helper-105; each failed on the tree before its fix)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rsc_health import nodepath
from rsc_health.actions import Actor
from rsc_health.config import ConfigError, load_config
from rsc_health.model import Finding, Severity, Status
from rsc_health.policy import decide
from rsc_health.slurm.memory import MemorySlurm
from tests.node.test_nodepath_faults import (  # noqa: F401 - node_env is a fixture
    REPO,
    XID79,
    _no_slurm,
    _records,
    node_env,
)
from tests.node.test_state_dir_read_only import node01_slurm

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _site() -> Path:
    return Path(os.environ["RSC_HEALTH_CONFIG"])


def _push(text: str) -> None:
    site = _site()
    site.write_text(site.read_text() + "\n" + text)


def _not_ok(root: Path) -> list[tuple[str, str]]:
    return [(r["check"], r.get("code") or "") for r in _records(root)
            if r["kind"] == "check" and r.get("status") != "ok"]


# ---- (b) blind: [xid] sources that name nothing readable ------------------------------------

@pytest.mark.parametrize("sources", [
    "[]",                                # "[] = the default", as [infiniband] hcas reads it
    '["/var/log/kernel-only.log"]',      # the rsyslog kernel-only file, its name mistyped
])
def test_xid_sources_that_name_no_readable_log_do_not_pass_a_node_with_an_xid79(
        sources, node_env, capsys):  # noqa: F811
    """Every [xid] source missing (or none listed): no kernel log is read at all, and the
    prolog said nothing and let the job start on a GPU that fell off the bus. A node that
    reads no kernel log must say so (a checker error), or the config must be refused."""
    _push(f"[xid]\nsources = {sources}\n")
    (node_env / "dev/kmsg").open("a").write(XID79)

    code = nodepath.run_stage("prolog", slurm_factory=lambda cfg, deadline: node01_slurm())

    said = _not_ok(node_env)
    assert code == 1 or any(check in ("xid", "checker") for check, _ in said), (
        f"prolog exited {code} and said nothing: {said}; {capsys.readouterr().err!r}")


# ---- (d) read as its opposite: an empty family list ------------------------------------------

SWEEP_ONLY = {"sxid", "nvlink", "pcie", "host", "fabric", "dcgm", "site", "telemetry"}


@pytest.mark.parametrize("stage", ["prolog", "epilog"])
def test_an_empty_family_list_does_not_run_every_family_at_job_start(
        stage, node_env):  # noqa: F811
    """`prolog_families = []` (an operator taking the checks out of job starts during an
    incident) ran every family there instead, the sweep-only ones too (SXid, NVLink, PCIe,
    fabric, DCGM, site checks, telemetry): their drain verdicts now fail job starts."""
    _push(f"[slurm]\n{stage}_families = []\n")

    assert nodepath.run_stage(stage, slurm_factory=_no_slurm) == 0

    judged = {r["check"] for r in _records(node_env) if r["kind"] == "check"}
    assert not judged & SWEEP_ONLY, sorted(judged & SWEEP_ONLY)


# ---- (c) past the budget: guard_settle_s -----------------------------------------------------

RUN = ("import sys\nfrom rsc_health import nodepath\n"
       "from rsc_health.slurm.memory import MemorySlurm\n"
       "slurm = MemorySlurm(['node01'])\n"
       "slurm.start_job('node01', '777', whole_node=False)\n"
       "raise SystemExit(nodepath.run_stage(sys.argv[1], slurm_factory=lambda c, d: slurm))\n")


def test_a_long_guard_settle_does_not_hold_a_drain_past_the_budget(node_env):  # noqa: F811
    """[actions] guard_settle_s had no bound and its sleep none from the run's deadline: each
    drain sat in it until the watchdog ended the run. The drain landed in Slurm, but its
    action record was never spooled and the job on the dead GPU was not requeued. Now at most
    30 s (600 is refused) and never more than a quarter of what is left of the budget."""
    with pytest.raises(ConfigError, match="guard_settle_s"):
        load_config_text = _site().read_text() + "\n[actions]\nguard_settle_s = 600\n"
        bad = _site().with_name("bad.toml")
        bad.write_text(load_config_text)
        load_config(bad)
    _push("[slurm]\nsweep_budget_s = 4\n\n[actions]\nguard_settle_s = 30\n")
    (node_env / "dev/kmsg").open("a").write(XID79)

    run = subprocess.run([sys.executable, "-c", RUN, "sweep"], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})

    assert "budget exceeded" not in run.stderr, run.stderr
    actions = [r["action"] for r in _records(node_env) if r["kind"] == "action"]
    assert "drain_now" in actions and "requeue" in actions, (actions, run.stderr)


# ---- (d) a guard the config switched off or crashed: guard_window_min ------------------------

def _actor(slurm: MemorySlurm, cfg, tmp_path: Path, node: str) -> Actor:
    a = Actor(slurm, cfg, node, tmp_path / node, now=lambda: NOW, log=lambda m: None)
    a.sleep = lambda seconds: None
    return a


@pytest.mark.parametrize("window", ["0", "1e13"])
def test_a_guard_window_the_guard_cannot_count_in_is_refused_or_still_holds(
        window, tmp_path):
    """guard_window_min has no range: 0 counts only drains stamped this very second (jittered
    sweeps never are), so the mass-drain guard is off; 1e13 overflows timedelta, and every
    node's act step is a checker fault (no sweep ever carries a drain out). Either is a
    config error, or the guard still holds two recent drains of a 20-node partition."""
    site = tmp_path / "site.toml"
    site.write_text(f"[actions]\nguard_window_min = {window}\n")
    try:
        cfg = load_config(site)
    except ConfigError:
        return  # refused, loudly: the node judges with its last good config
    slurm = MemorySlurm([f"n{i:02d}" for i in range(20)], now=lambda: NOW)
    for i, node in enumerate(("n10", "n11")):  # 10% of 20: the limit, reached a minute ago
        slurm.set_state(node, "IDLE+DRAIN", "rsc_health:now:xid79:gpu0 fell off",
                        user="root", when=NOW - timedelta(seconds=60 + i))
    verdict = decide([Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW,
                              "fell off the bus", "xid79", True)])

    actions = _actor(slurm, cfg, tmp_path, "n01").apply(verdict)

    assert actions[0].action == "guard_tripped"
    assert not slurm.info["n01"].drain_set


# ---- (d) the compiled config skips the refusal load_config makes ----------------------------

def test_a_site_config_in_a_directory_others_can_write_is_refused_by_the_compiled_config_too(
        node_env, tmp_path, monkeypatch):  # noqa: F811
    """README: a config in a directory others could write is 'refused as a broken config,
    loudly, and nothing in it is used'. load_config refuses it; the compiled config, keyed on
    the file's own stat only, kept serving it: no config_error, for as long as the file
    stays unchanged."""
    etc = tmp_path / "etc"
    etc.mkdir()
    os.chmod(etc, 0o755)
    site = etc / "config.toml"
    site.write_text(_site().read_text())
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0  # compiled, kept

    os.chmod(etc, 0o777)
    with pytest.raises(ConfigError):
        load_config(site)  # what the README promises
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    assert ("checker", "config_error") in _not_ok(node_env)


# ---- (d) silently ignored: [node] syslog in a node table -------------------------------------

def test_syslog_off_in_a_node_table_is_honoured_like_every_other_node_key(
        node_env, monkeypatch):  # noqa: F811
    """[nodes."GLOB".node] syslog = false validates, and `config show --node` shows it off,
    but the node path reads [node] syslog from the site's tables before the node's view is
    made: the node's lines still went to syslog."""
    import types

    sent: list[str] = []
    fake = types.ModuleType("syslog")
    fake.LOG_PID = fake.LOG_DAEMON = fake.LOG_WARNING = 0
    fake.openlog = lambda *a, **k: None
    fake.syslog = lambda prio, msg: sent.append(msg)
    monkeypatch.setitem(sys.modules, "syslog", fake)
    _push('[nodes."node01".node]\nsyslog = false\n')
    (node_env / "dev/kmsg").open("a").write(XID79)

    assert nodepath.run_stage("prolog", slurm_factory=lambda cfg, d: node01_slurm()) == 1

    assert sent == []
