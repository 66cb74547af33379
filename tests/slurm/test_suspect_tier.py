"""The suspect tier on a real Slurm 22.05 (Debian's slurm-wlm, whose job_submit/lua plugin is
there): every node declares `rsc_trusted` in slurm.conf, the shipped deploy/slurm/job_submit.lua
makes jobs of 4+ nodes require it, `healthctl suspects apply` takes it off a suspect.

Measured here: a big job never starts on the suspect (it waits for trusted nodes), a small job
still runs there; `scontrol reconfigure` and a slurmctld restart give the node slurm.conf's
feature and weight back, the next pass re-applies both (and says so), and the big job keeps
avoiding the suspect; the strigger hook in deploy/slurm re-applies on its own after a
reconfigure; a person's clear gives the node back at once."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.historian import db
from rsc_health.historian import suspects as hs
from rsc_health.historian.failslow.evidence import TELEMETRY, SuspectEvidence

from .cluster import REPO, SlurmCluster, parse_kv_line, slurm_available

pytestmark = pytest.mark.slurm
LUA = REPO / "deploy" / "slurm" / "job_submit.lua"
TRIGGER = REPO / "deploy" / "slurm" / "rsc-health-suspects-trigger"
SUSPECT = "node03"


@pytest.fixture(scope="module")
def lua_cluster(tmp_path_factory):
    if not slurm_available():
        pytest.skip("slurmctld is not installed")
    if not list(Path("/usr/lib/x86_64-linux-gnu/slurm-wlm").glob("job_submit_lua.so")):
        pytest.skip("this Slurm has no job_submit/lua plugin")
    base = tmp_path_factory.mktemp("suspects")
    (base / "etc").mkdir(parents=True)
    shutil.copy(LUA, base / "etc" / "job_submit.lua")
    cluster = SlurmCluster(base, nodes=6, accounting=False, extra_conf="JobSubmitPlugins=lua\n",
                           node_conf="Features=rsc_trusted")
    cluster.start()
    yield cluster
    cluster.stop()


def _evidence(now):
    return [SuspectEvidence(node=SUSPECT, metric="throttle_hw_frac", value=0.41,
                            peer_median=0.0, deviation=14.2, since=now - timedelta(minutes=10),
                            last=now, job_ids=("77",), source=TELEMETRY,
                            detail="gpu5 HW slowdown 41% of the interval in job 77")]


def _healthctl(c, base, *args):
    config = base / "config.toml"
    config.write_text("[slurm]\ncall_timeout_s = 20\n")
    url = f"sqlite:///{base / 'history.db'}"
    # the historian exists before the tier's pass, as a deployment's first `db upgrade`
    # or ingest makes it (a reader never creates one)
    db.connect(url, create_missing=True).dispose()
    return CliRunner().invoke(cli, ["--config", str(config), "--db", url, *args],
                              env={"SLURM_CONF": c.env["SLURM_CONF"]})


def _trusted(c, node):
    return "rsc_trusted" in c.node(node).get("AvailableFeatures", "").split(",")


def _big_job_avoids_the_suspect(c):
    """node01 busy, so the only five idle nodes include the suspect: a 5-node job must wait
    (the lua asked for rsc_trusted; 4 trusted nodes are idle) and never start there."""
    busy = c.sbatch("-w", "node01", "--exclusive", "--wrap", "sleep 300")
    c.wait_for(lambda: c.job_state(busy) == "RUNNING", 30, "node01 busy")
    big = c.sbatch("-N", "5", "--wrap", "sleep 300")
    assert c.job(big).get("Features") == "rsc_trusted"  # added by the shipped lua
    deadline = time.monotonic() + 8  # four scheduler and backfill passes (2 s each here)
    while time.monotonic() < deadline:
        job = c.job(big)
        assert job.get("JobState") == "PENDING", job
        time.sleep(1)
    c.run(["scancel", big, busy])
    c.wait_for(lambda: not c.run(["squeue", "-h"]).stdout.strip(), 60, "queue empty")


def test_suspect_tier_survives_reconfigure_and_restart_on_real_slurm(lua_cluster, tmp_path,
                                                                     monkeypatch):
    import rsc_health.suspects as tier

    c = lua_cluster
    now = datetime.now(UTC).replace(tzinfo=None)
    monkeypatch.setattr(tier, "detector", lambda: (lambda engine, at, cfg: _evidence(now)))
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    timings = {}

    out = _healthctl(c, tmp_path, "suspects", "apply")
    assert out.exit_code == 0, out.output
    assert not _trusted(c, SUSPECT) and c.node(SUSPECT)["Weight"] == "1000"
    assert "IDLE" == c.node_state(SUSPECT)  # short of a drain
    assert all(_trusted(c, n) for n in c.node_names if n != SUSPECT)

    # Small jobs still run on the suspect; a 1-node job nobody placed goes elsewhere (weight).
    small = c.sbatch("-w", SUSPECT, "--wrap", "sleep 300")
    c.wait_for(lambda: c.job_state(small) == "RUNNING", 30, "small job on the suspect")
    free = c.sbatch("-N", "1", "--wrap", "sleep 300")
    c.wait_for(lambda: c.job_state(free) == "RUNNING", 30, "a 1-node job")
    assert c.job(free)["NodeList"] != SUSPECT
    c.run(["scancel", small, free])
    c.wait_for(lambda: not c.run(["squeue", "-h"]).stdout.strip(), 60, "queue empty")
    _big_job_avoids_the_suspect(c)

    # scontrol reconfigure: slurm.conf's feature and weight are back; the next pass re-applies.
    t0 = time.monotonic()
    c.run(["scontrol", "reconfigure"])
    c.wait_for(lambda: _trusted(c, SUSPECT), 30, "reconfigure gave the feature back")
    timings["reconfigure_lost_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    out = _healthctl(c, tmp_path, "suspects", "apply", "--json")
    timings["reapply_pass_s"] = time.monotonic() - t1
    assert out.exit_code == 0, out.output
    assert '"why": "re-applied' in out.output
    assert not _trusted(c, SUSPECT) and c.node(SUSPECT)["Weight"] == "1000"
    _big_job_avoids_the_suspect(c)

    # slurmctld restarted (as its unit does: no -R): the same.
    c.stop_slurmctld()
    c.start_slurmctld()
    c.wait_for(lambda: _trusted(c, SUSPECT), 30, "restart gave the feature back")
    out = _healthctl(c, tmp_path, "suspects", "apply", "--json")
    assert out.exit_code == 0 and '"why": "re-applied' in out.output, out.output
    assert not _trusted(c, SUSPECT)
    c.wait_for(lambda: all(c.node_state(n) == "IDLE" for n in c.node_names), 60, "nodes back")
    _big_job_avoids_the_suspect(c)

    # The strigger hook re-applies on its own, without waiting for the timer.
    hook = tmp_path / "hook"
    hook.write_text(
        "#!/bin/sh\n"
        f"export SLURM_CONF={c.env['SLURM_CONF']} PYTHONPATH={REPO} "
        f"RSC_HEALTH_DB=sqlite:///{tmp_path / 'history.db'} "
        f"RSC_HEALTH_CONFIG={tmp_path / 'config.toml'} "
        f"RSC_HEALTH_HEALTHCTL='{_python()} -m rsc_health.cli'\n"
        f"exec {TRIGGER} >>{tmp_path / 'hook.log'} 2>&1\n")
    hook.chmod(0o755)
    c.run(["strigger", "--set", "--reconfig", "--flags=PERM", f"--program={hook}"])
    try:
        t2 = time.monotonic()
        c.run(["scontrol", "reconfigure"])
        c.wait_for(lambda: _trusted(c, SUSPECT), 30, "reconfigure gave the feature back")
        c.wait_for(lambda: not _trusted(c, SUSPECT), 60, "the trigger re-applied the tier")
        timings["trigger_reapplied_s"] = time.monotonic() - t2
        # One scontrol update: the weight landed with the feature (it was a second update
        # a moment later, and a CI run read it in between).
        assert c.node(SUSPECT)["Weight"] == "1000"
    finally:
        c.run(["strigger", "--clear", "--user=root"], check=False)

    # A person clears it: trusted again, at slurm.conf's weight.
    out = _healthctl(c, tmp_path, "suspects", "clear", SUSPECT, "--reason", "fan replaced")
    assert out.exit_code == 0, out.output
    assert _trusted(c, SUSPECT) and c.node(SUSPECT)["Weight"] == "1"
    engine = db.connect(f"sqlite:///{tmp_path / 'history.db'}", create_missing=True)
    try:
        assert hs.active(engine) == []
    finally:
        engine.dispose()
    print("suspect tier timings:", {k: round(v, 2) for k, v in timings.items()})


def test_features_and_weight_land_together_under_a_reader_polling_slurm(lua_cluster, tmp_path,
                                                                         monkeypatch):
    """While the tier applies, loses at `scontrol reconfigure`, re-applies and gives back, a
    reader polling `scontrol show node` never sees the suspect without rsc_trusted at
    slurm.conf's weight, nor with it at the suspect weight: one update_node message, which
    slurmctld applies under its node write lock. Measured on this 22.05 while writing it: 30
    rounds of features-then-weight as two updates showed a reader all four combinations; as
    one update, only the two whole ones."""
    import threading

    import rsc_health.suspects as tier

    c = lua_cluster
    now = datetime.now(UTC).replace(tzinfo=None)
    monkeypatch.setattr(tier, "detector", lambda: (lambda engine, at, cfg: _evidence(now)))
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    seen: dict[tuple[bool, str], int] = {}
    done = threading.Event()

    def poll():
        while not done.is_set():
            # One read: features and weight of the same moment. A read refused while
            # slurmctld reconfigures ("Unexpected missing socket error") is no reading.
            out = c.run(["scontrol", "-o", "show", "node", SUSPECT], check=False)
            if out.returncode != 0:
                continue
            held = parse_kv_line(out.stdout.strip())
            key = ("rsc_trusted" in held.get("AvailableFeatures", "").split(","),
                   held.get("Weight", ""))
            seen[key] = seen.get(key, 0) + 1

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for _ in range(4):
            out = _healthctl(c, tmp_path, "suspects", "apply", "--json")
            assert out.exit_code == 0, out.output
            assert not _trusted(c, SUSPECT) and c.node(SUSPECT)["Weight"] == "1000"
            c.run(["scontrol", "reconfigure"])
            c.wait_for(lambda: _trusted(c, SUSPECT), 30, "reconfigure gave the feature back")
        out = _healthctl(c, tmp_path, "suspects", "apply", "--json")
        assert out.exit_code == 0 and '"why": "re-applied' in out.output, out.output
        out = _healthctl(c, tmp_path, "suspects", "clear", SUSPECT, "--reason", "test over")
        assert out.exit_code == 0, out.output
    finally:
        done.set()
        reader.join()
    assert set(seen) == {(True, "1"), (False, "1000")}, seen
    # the reader did read, all along (both whole states, above); how often depends on the
    # machine: 12 reads on a loaded CI run, about 30 on an idle one
    assert sum(seen.values()) >= 8, seen


def test_a_weight_past_slurms_largest_is_refused_whole_not_half_sent(lua_cluster, monkeypatch):
    """scontrol 22.05 takes `Weight=4294967281` as an error of its own, exits 0 and sends the
    rest of the update: the features change, the weight does not. CliSlurm refuses such a
    weight before running scontrol, so the update is never sent in half."""
    from rsc_health.slurm.api import SlurmCommandError
    from rsc_health.slurm.cli_backend import MAX_WEIGHT, CliSlurm

    c, node = lua_cluster, "node06"
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    try:
        said = c.run(["scontrol", "update", f"NodeName={node}", "AvailableFeatures=site_q",
                      "ActiveFeatures=site_q", f"Weight={MAX_WEIGHT + 1}"])
        assert "greater than" in said.stderr  # exit 0 all the same (check=True above)
        assert (c.node(node)["AvailableFeatures"], c.node(node)["Weight"]) == ("site_q", "1")
        c.run(["scontrol", "update", f"NodeName={node}", "AvailableFeatures=rsc_trusted",
               "ActiveFeatures=rsc_trusted"])
        real = CliSlurm(timeout_s=20)
        with pytest.raises(SlurmCommandError, match="Invalid weight"):
            real.update_node(node, features=["site_q"], weight=MAX_WEIGHT + 1)
        assert (c.node(node)["AvailableFeatures"], c.node(node)["Weight"]) == ("rsc_trusted",
                                                                               "1")
        real.update_node(node, features=["site_q"], weight=MAX_WEIGHT)
        assert (c.node(node)["AvailableFeatures"], c.node(node)["Weight"]) == (
            "site_q", str(MAX_WEIGHT))
    finally:
        c.run(["scontrol", "update", f"NodeName={node}", "AvailableFeatures=rsc_trusted",
               "ActiveFeatures=rsc_trusted", "Weight=1"])


def _python() -> str:
    import sys

    return sys.executable


def test_a_site_feature_with_a_colon_is_handed_back_as_slurm_holds_it(lua_cluster, tmp_path,
                                                                      monkeypatch):
    """A site's own feature outside [A-Za-z0-9_.-] (`ib:hdr`, `gpu+nvl`), which Slurm accepts:
    the tier takes rsc_trusted off the suspect and leaves the site's features as Slurm holds
    them (it refused such a node on every pass before), and gives rsc_trusted back, the site's
    kept, when a person clears it."""
    import rsc_health.suspects as tier

    c, node = lua_cluster, "node05"
    site = {"rsc_trusted", "ib:hdr", "gpu+nvl"}
    c.run(["scontrol", "update", f"NodeName={node}", "AvailableFeatures=" + ",".join(sorted(site)),
           "ActiveFeatures=" + ",".join(sorted(site))])
    assert set(c.node(node)["AvailableFeatures"].split(",")) == site  # Slurm took them
    now = datetime.now(UTC).replace(tzinfo=None)
    evidence = [e.__class__(**{**e.__dict__, "node": node}) for e in _evidence(now)]
    monkeypatch.setattr(tier, "detector", lambda: (lambda engine, at, cfg: evidence))
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    out = _healthctl(c, tmp_path, "suspects", "apply", "--json")
    assert out.exit_code == 0, out.output
    held = c.node(node)
    assert set(held["AvailableFeatures"].split(",")) == site - {"rsc_trusted"}
    assert held["Weight"] == "1000"
    out = _healthctl(c, tmp_path, "suspects", "clear", node, "--reason", "checked by hand")
    assert out.exit_code == 0, out.output
    c.wait_for(lambda: _trusted(c, node), 30, "trusted again")
    assert set(c.node(node)["AvailableFeatures"].split(",")) == site


def test_a_big_job_that_names_no_node_count_or_ors_the_feature_away_still_avoids_the_suspect(
        lua_cluster, tmp_path, monkeypatch):
    """A user's own words made a big job skip the tier: `-n 10` on 2-CPU nodes (no -N: the
    lua read min_nodes as 1) and `-N 2-5` (min 2) are five-node jobs; a constraint that ORs
    the feature with another (`rsc_trusted|site_x`) was taken as already requiring it; a het
    job of 2 + 3 nodes reaches the lua one component at a time; and `scontrol update job
    NumNodes=5-5` replaced the job's own constraint by the feature alone.
    Each now requires rsc_trusted, and none starts on the suspect."""
    import rsc_health.suspects as tier
    from rsc_health.hostlist import expand

    c, node = lua_cluster, "node04"
    c.run(["scontrol", "update", f"NodeName={node}", "AvailableFeatures=rsc_trusted,site_x",
           "ActiveFeatures=rsc_trusted,site_x"])
    now = datetime.now(UTC).replace(tzinfo=None)
    evidence = [e.__class__(**{**e.__dict__, "node": node}) for e in _evidence(now)]
    monkeypatch.setattr(tier, "detector", lambda: (lambda engine, at, cfg: evidence))
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    assert _healthctl(c, tmp_path, "suspects", "apply").exit_code == 0
    assert c.node(node)["AvailableFeatures"] == "site_x"
    busy = c.sbatch("-w", "node01", "--exclusive", "--wrap", "sleep 300")
    jobs = []
    try:
        c.wait_for(lambda: c.job_state(busy) == "RUNNING", 30, "node01 busy")
        held = c.sbatch("-N", "1", "--hold", "--constraint=site_x", "--wrap", "sleep 300")
        c.run(["scontrol", "update", f"JobId={held}", "NumNodes=5-5"])
        assert c.job(held).get("Features") == "(site_x)&rsc_trusted"
        het = tmp_path / "het.sh"
        het.write_text("#!/bin/sh\n#SBATCH -N2\n#SBATCH hetjob\n#SBATCH -N3\nsleep 300\n")
        jobs = [c.sbatch("-n", "10", "--wrap", "sleep 300"),
                c.sbatch("-N", "2-5", "--wrap", "sleep 300"),
                c.sbatch("-N", "5", "--constraint=rsc_trusted|site_x", "--wrap", "sleep 300"),
                c.sbatch(str(het))]
        jobs.append(str(int(jobs[-1]) + 1))  # the het job's second component
        plain = c.sbatch("--hold", "--wrap", "sleep 300")  # names no size: one task, small
        assert c.job(plain).get("Features") in (None, "(null)"), c.job(plain)
        c.run(["scancel", plain])
        assert [c.job(j).get("Features") for j in jobs] == [
            "rsc_trusted", "rsc_trusted", "(rsc_trusted|site_x)&rsc_trusted", "rsc_trusted",
            "rsc_trusted"]
        deadline = time.monotonic() + 6  # three scheduler and backfill passes
        while time.monotonic() < deadline:
            for j in jobs:
                placed = c.job(j).get("NodeList", "")
                assert node not in (expand(placed) if placed not in ("", "(null)") else []), (
                    j, c.job(j))
            time.sleep(1)
    finally:
        c.run(["scancel", busy, *jobs, *([held] if "held" in locals() else [])], check=False)
        out = _healthctl(c, tmp_path, "suspects", "clear", node, "--reason", "test over")
        assert out.exit_code == 0, out.output
        c.wait_for(lambda: not c.run(["squeue", "-h"]).stdout.strip(), 60, "queue empty")


@pytest.mark.parametrize("constraint,held_as", [
    ("[site_x|site_y]", "([site_x|site_y])&rsc_trusted"),
    ("[site_x|site_y]&rsc_trusted", "([site_x|site_y]&rsc_trusted)&rsc_trusted"),
])
def test_a_bracketed_constraint_the_lua_wraps_is_accepted_and_runs_on_trusted_nodes(
        lua_cluster, constraint, held_as):
    """A matching-OR constraint (brackets: every node of the job has the same one of the
    features), alone or already AND-ed with rsc_trusted, is wrapped again by the lua: real
    Slurm 22.05 accepts what it writes (sbatch would fail with `Invalid feature
    specification`), and the big job runs on four trusted nodes, never on the suspect that is
    site_x too (rsc_trusted taken off, as `suspects apply` does). Node counts (`site_x*4`),
    which Slurm 22.05 refuses inside the lua's parentheses, are let through as written (the
    next test)."""
    from rsc_health.hostlist import expand

    c = lua_cluster
    site = {"node01": "site_x", "node02": "site_x", "node03": "site_x", "node04": "site_x",
            "node05": "site_x", "node06": "site_y"}
    try:
        for n, f in site.items():
            feats = f if n == "node04" else f"rsc_trusted,{f}"
            c.run(["scontrol", "update", f"NodeName={n}", f"AvailableFeatures={feats}",
                   f"ActiveFeatures={feats}"])
        job = c.sbatch("-N", "4", "--hold", f"--constraint={constraint}", "--wrap", "sleep 300")
        assert c.job(job).get("Features") == held_as
        c.run(["scontrol", "release", job])
        c.wait_for(lambda: c.job_state(job) == "RUNNING", 30, "the big job running")
        placed = expand(c.job(job)["NodeList"])
        assert len(placed) == 4 and "node04" not in placed, placed
    finally:
        c.run(["scancel", *([job] if "job" in locals() else [])], check=False)
        c.wait_for(lambda: not c.run(["squeue", "-h"]).stdout.strip(), 60, "queue empty")
        for n in site:
            c.run(["scontrol", "update", f"NodeName={n}", "AvailableFeatures=rsc_trusted",
                   "ActiveFeatures=rsc_trusted"])



def test_a_big_job_with_node_counts_in_its_constraint_is_let_through_as_written(lua_cluster):
    """`--constraint=site_x*4` on a 4-node job: the lua wrapped it as `(site_x*4)&rsc_trusted`,
    which Slurm 22.05 refuses ("Invalid feature specification"): the user's job could not be
    submitted at all. Now it is accepted with the user's constraint as written (no tier
    protection for it: said in slurmctld's log) and runs."""
    c = lua_cluster
    try:
        for n in c.node_names:
            c.run(["scontrol", "update", f"NodeName={n}", "AvailableFeatures=rsc_trusted,site_x",
                   "ActiveFeatures=rsc_trusted,site_x"])
        job = c.sbatch("-N", "4", "--constraint=site_x*4", "--wrap", "sleep 300")
        assert c.job(job).get("Features") == "site_x*4"
        c.wait_for(lambda: c.job_state(job) == "RUNNING", 30, "the job running")
    finally:
        c.run(["scancel", *([job] if "job" in locals() else [])], check=False)
        c.wait_for(lambda: not c.run(["squeue", "-h"]).stdout.strip(), 60, "queue empty")
        for n in c.node_names:
            c.run(["scontrol", "update", f"NodeName={n}", "AvailableFeatures=rsc_trusted",
                   "ActiveFeatures=rsc_trusted"])


def test_a_spread_job_sized_by_tasks_per_node_never_starts_on_the_suspect(lua_cluster):
    """`-n 6 --ntasks-per-node=2 --spread-job` (found by helper-97): --ntasks-per-node is a
    maximum when -n is given, and --spread-job spreads the tasks over as many nodes as it can:
    six here, a big job, which the lua counted as ceil(6 / 2) = 3 nodes and let start on the
    suspect."""
    from rsc_health.hostlist import expand

    c = lua_cluster
    c.run(["scontrol", "update", f"NodeName={SUSPECT}", "AvailableFeatures=",
           "ActiveFeatures=", "Weight=1000"])
    job = None
    try:
        job = c.sbatch("-n", "6", "--ntasks-per-node", "2", "--spread-job", "--wrap",
                       "sleep 60")
        assert c.job(job).get("Features") == "rsc_trusted", c.job(job)
        deadline = time.monotonic() + 6  # three scheduler passes
        while time.monotonic() < deadline:
            placed = c.job(job).get("NodeList", "")
            assert SUSPECT not in (expand(placed) if placed not in ("", "(null)") else []), (
                c.job(job))
            time.sleep(1)
        small = c.sbatch("-n", "2", "--ntasks-per-node", "2", "--hold", "--wrap", "sleep 1")
        assert c.job(small).get("Features") in (None, "(null)"), c.job(small)  # still small
        c.run(["scancel", small])
    finally:
        if job:
            c.run(["scancel", job], check=False)
        c.run(["scontrol", "update", f"NodeName={SUSPECT}", "AvailableFeatures=rsc_trusted",
               "ActiveFeatures=rsc_trusted", "Weight=1"])
        c.wait_for(lambda: not c.run(["squeue", "-h"]).stdout.strip(), 60, "queue empty")
