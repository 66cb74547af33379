"""`healthctl node NODE`: one node's story from the historian (and Slurm when it answers)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from click.testing import CliRunner

from rsc_health.cli import cli
from tests.historian.test_status_historian_away import _hidden_historian, _slurm_hiding_a_partition


def test_node_view_tells_a_lemons_story_and_says_slurm_was_not_consulted(fleet, tmp_path,
                                                                        monkeypatch):
    now = datetime.utcnow().replace(microsecond=0)
    for k in range(6):
        fleet.xid("bad1", now - timedelta(days=k + 1, hours=k))
    pk = fleet.failed(["bad1", "ok1"], "bad1", end=now - timedelta(days=2))
    assert pk
    fleet.ticket("bad1", now - timedelta(days=3), reason="GPU3 RMA")
    fleet.job(["ok1"], end=now - timedelta(days=1))
    url = fleet.engine.url.render_as_string(hide_password=False)
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nbin_dir = "/nonexistent"\n')
    out = CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "bad1", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    h = doc["historian"]
    assert h["lemon"]["candidate"] and "xid_cnt" in h["lemon"]["fired"]
    assert [t["reason"] for t in h["tickets"]] == ["GPU3 RMA"]
    assert h["failed_jobs"] and h["failed_jobs"][0]["cause"] == "xid"
    assert any("Slurm not consulted" in p for p in doc["problems"])
    text = CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "ok1"]).output
    assert "lemon     no: no rule fired" in text


def test_node_view_without_a_historian_still_answers(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nbin_dir = "/nonexistent"\n')
    out = CliRunner().invoke(cli, ["--config", str(site), "node", "n1"])
    assert out.exit_code == 0
    assert "no historian configured" in out.output and "Traceback" not in out.output


def test_node_view_as_of_judges_a_past_period_the_way_it_was(fleet, tmp_path):
    """A historian of last year's fleet: as of today the window is empty; --as-of a day in
    that period finds the lemon it was."""
    then = datetime(2024, 3, 31)
    for k in range(6):
        fleet.xid("bad1", then - timedelta(days=k + 1, hours=k))
    fleet.job(["bad1"], end=then - timedelta(days=1))
    url = fleet.engine.url.render_as_string(hide_password=False)
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nbin_dir = "/nonexistent"\n')

    today = CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "bad1",
                                     "--json"])
    past = CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "bad1",
                                    "--as-of", "2024-03-31", "--json"])

    assert not json.loads(today.output)["historian"]["lemon"]["candidate"]
    doc = json.loads(past.output)
    assert doc["time"].startswith("2024-03-31")
    assert doc["historian"]["lemon"]["candidate"]


def test_node_view_shows_the_nodes_qualification_runs_and_what_did_not_pass(fleet, tmp_path):
    from rsc_health.historian.schema import qualify_results, qualify_runs

    now = datetime.utcnow().replace(microsecond=0)
    with fleet.engine.begin() as conn:
        conn.execute(qualify_runs.insert().values(
            run_id="q1", node="ok1", tier="full", started=now - timedelta(minutes=20),
            ended=now - timedelta(minutes=10), verdict="fail", gpu_model="H100", driver="570",
            reason="nccl_all_reduce: nccl-bw/allreduce_8589934592_busbw -6.1% vs peers median"))
        conn.execute(qualify_results.insert().values(
            run_id="q1", test="nccl_all_reduce", metric="nccl-bw/allreduce_8589934592_busbw",
            idx="", value=217.0, unit="GB/s", higher_is_better=True, status="fail",
            reason="-6.1%", basis="peers", peer_median=231.0, threshold=225.2, percentile=0.0,
            peers=12))
    url = fleet.engine.url.render_as_string(hide_password=False)
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nbin_dir = "/nonexistent"\n')
    doc = json.loads(CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "ok1",
                                              "--json"]).output)
    [run] = doc["historian"]["qualified"]
    assert run["verdict"] == "fail" and run["results"][0]["peer_median"] == 231.0
    text = CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "ok1"]).output
    assert "qualify   1 recent run(s)" in text and "FAIL" in text and "-6.1% vs peers" in text
    assert "(1 not passed)" in text
    other = CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "bad1"]).output
    assert "qualify   never qualified" in other


def test_node_view_shows_the_drivers_and_firmware_the_heartbeats_said_and_the_last_change(
        fleet, tmp_path):
    from rsc_health import spool
    from rsc_health.compat import UTC
    from rsc_health.historian.ingest.delivery import deliver

    t0 = datetime.now(UTC) - timedelta(hours=1)
    d = tmp_path / "spool"
    d.mkdir()
    spool.append(d, [spool.record("heartbeat", "gpu080", t0 + timedelta(minutes=k),
                                  source="sweep", level="ok", checker_errors=0, duration_s=0.3,
                                  families={}, version="t",
                                  versions={"driver": drv, "vbios": {"0": "96.00.AF.00.01"}})
                     for k, drv in enumerate(("570.133.20", "580.95.05"))])
    assert deliver(fleet.engine, d).quarantined_count == 0
    url = fleet.engine.url.render_as_string(hide_password=False)
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nbin_dir = "/nonexistent"\n')
    out = CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node", "gpu080"])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.startswith("  versions"))
    assert "driver=580.95.05 vbios=96.00.AF.00.01 since" in line
    assert "(was driver=570.133.20 vbios=96.00.AF.00.01)" in line
    doc = json.loads(CliRunner().invoke(cli, ["--config", str(site), "--db", url, "node",
                                              "gpu080", "--json"]).output)
    assert doc["historian"]["versions"]["previous"].startswith("driver=570.133.20")


def test_node_view_calls_a_repeat_offender_the_lemon_candidate_that_lemons_calls_it(fleet,
                                                                                     tmp_path):
    """A node back from a lemon repair that failed a job again is a candidate for `healthctl
    lemons`, the report and the exporter (rsc_health_lemon_candidate{node} 1): the
    repeat-offender rule. `healthctl node NODE`, the command the report links every node
    to, judged only the threshold crossings and said "lemon no: no rule fired"."""
    as_of, day = datetime(2024, 3, 31), timedelta(days=1)
    fleet.ticket("n1", as_of - 10 * day, as_of - 5 * day, source="lemon")
    fleet.failed(["n1"], None, end=as_of - 2 * day, state="NODE_FAIL")  # failed again
    fleet.job(["n2"], end=as_of - day)
    url = fleet.engine.url.render_as_string(hide_password=False)
    site = tmp_path / "site.toml"
    site.write_text('[slurm]\nbin_dir = "/nonexistent"\n')
    run = CliRunner()
    lemons = run.invoke(cli, ["--config", str(site), "--db", url, "lemons", "--as-of",
                              "2024-03-31", "--json"])
    assert lemons.exit_code == 0, lemons.output
    assert [v["node"] for v in json.loads(lemons.output)["verdicts"]] == ["n1"]
    node = run.invoke(cli, ["--config", str(site), "--db", url, "node", "n1", "--as-of",
                            "2024-03-31", "--json"])
    assert node.exit_code == 0, node.output
    lemon = json.loads(node.output)["historian"]["lemon"]
    assert lemon["candidate"] and lemon["fired"][0] == "repeat_offender", lemon
    assert lemon["why"].startswith("repeat_offender: failed a job again since its lemon repair")
    text = run.invoke(cli, ["--config", str(site), "--db", url, "node", "n2", "--as-of",
                            "2024-03-31"]).output
    assert "lemon     no: no rule fired" in text


def _historian_with_gpu001(tmp_path):
    from sqlalchemy import create_engine

    from rsc_health.historian import db, schema

    url = f"sqlite:///{tmp_path / 'h.db'}"
    eng = create_engine(url)
    db.create(eng)
    with eng.begin() as conn:
        conn.execute(schema.node_runs.insert(), [{
            "node": "gpu001", "source": "sweep", "level": "ok",
            "last_seen": datetime.utcnow() - timedelta(minutes=2)}])
    return url, eng


def test_healthctl_node_counts_every_failed_job_blamed_on_the_node(tmp_path):
    """The count was len() of a list cut at LIMIT 20: 25 failed jobs read "20", the tickets
    line likewise (helper 203). Counted apart now, and the cut list says it is cut."""
    from rsc_health.historian import schema

    url, eng = _historian_with_gpu001(tmp_path)
    end = datetime.utcnow() - timedelta(days=1)
    with eng.begin() as conn:
        for i in range(25):
            e = end - timedelta(hours=i)
            pk = conn.execute(schema.jobs.insert().values(
                job_id=str(100 + i), job_id_display=str(100 + i), name="t", user="u",
                partition="gpu", state="NODE_FAIL", exit_code="0:0",
                submit=e - timedelta(hours=2), start=e - timedelta(hours=1), end=e, nnodes=1,
                gpus=8, nodelist="gpu001", instance_key=f"{100 + i}:x:y")).inserted_primary_key[0]
            conn.execute(schema.attributions.insert().values(
                job_pk=pk, node="gpu001", cause="node_down", code="DOWN", evidence="",
                kind="event"))
        conn.execute(schema.tickets.insert(), [
            {"node": "gpu001", "opened": end - timedelta(days=i), "reason": f"r{i}",
             "source": "manual"} for i in range(23)])
    eng.dispose()
    result = CliRunner().invoke(cli, ["--config", "/dev/null", "--db", url, "node", "gpu001"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    failures = next(ln for ln in lines if "blamed on it" in ln)
    assert "25 failed job(s)" in failures and "(newest 10 listed)" in failures, failures
    tickets = next(ln for ln in lines if ln.startswith("  tickets"))
    assert "23 (newest 5 listed)" in tickets, tickets
    doc = json.loads(CliRunner().invoke(cli, ["--config", "/dev/null", "--db", url, "node",
                                              "gpu001", "--json"]).output)
    assert doc["historian"]["totals"] == {"actions": 0, "failed_jobs": 25, "tickets": 23}


def test_healthctl_node_of_a_name_the_historian_never_heard_of_does_not_say_checks_stopped(
        tmp_path):
    """A mistyped name (gpu0001 for gpu001) printed "STALE (checks stopped)", 0 failed jobs,
    lemon no, exit 0, for a node that does not exist (helper 203)."""
    url, eng = _historian_with_gpu001(tmp_path)
    eng.dispose()
    result = CliRunner().invoke(cli, ["--config", "/dev/null", "--db", url, "node", "gpu0001"])
    assert "checks stopped" not in result.output, result.output
    assert "historian has no record of this node" in result.output, result.output
    assert result.exit_code == 1
    as_json = CliRunner().invoke(cli, ["--config", "/dev/null", "--db", url, "node", "gpu0001",
                                       "--json"])
    assert as_json.exit_code == 1
    assert json.loads(as_json.output)["historian"]["known"] is False
    known = CliRunner().invoke(cli, ["--config", "/dev/null", "--db", url, "node", "gpu001"])
    assert known.exit_code == 0 and "(fresh)" in known.output, known.output


def test_node_view_of_an_inventoried_slurm_node_that_never_reported_is_not_unknown(
        tmp_path, monkeypatch):
    """helper-213: a node racked today, in the inventory and in Slurm, whose rsc-health never
    delivered a run (the very node an operator asks about) is a node, not a mistyped name:
    no 'historian has no record', exit 0."""
    monkeypatch.delenv("RSC_HEALTH_DB", raising=False)
    now = datetime.utcnow()
    url = _hidden_historian(tmp_path, [
        {"node": "node02", "source": "sweep", "level": "ok",
         "last_seen": now - timedelta(minutes=3)}],
        inventory=[{"node": "hidden01", "cluster": "", "partition": "admin",
                    "start": now - timedelta(days=1), "end": None, "source": "csv"}])
    config = _slurm_hiding_a_partition(tmp_path)
    out = CliRunner().invoke(cli, ["--config", str(config), "--db", url, "node", "hidden01"])
    assert "slurm     IDLE" in out.output, out.output  # Slurm has the node
    assert "historian has no record of this node" not in out.output, out.output
    assert "mistyped" not in out.output
    assert out.exit_code == 0, out.output
