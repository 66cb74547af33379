"""Metrics at their edges, found by an adversarial read: a GPU count that fits the jobs
column but not the arithmetic on it, ETTR's Monte Carlo for a run failures outpace, a what-if
rate from a base rate of 0, and a goodput table whose jobs lost no GPU-hours."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rsc_health.cli import AppContext
from rsc_health.commands.metrics import ettr as ettr_cmd
from rsc_health.commands.metrics import goodput as goodput_cmd
from rsc_health.historian import db
from rsc_health.historian.ingest import sacct, sacct_parse
from rsc_health.historian.metrics.ettr import MAX_ROUNDS, EttrModel, monte_carlo

FIELDS = list(sacct_parse.FIELDS)


def _row(job_id: str, **over) -> dict:
    r = {"JobIDRaw": job_id, "JobID": job_id, "JobName": "train", "User": "alice",
         "Partition": "gpu", "State": "COMPLETED", "ExitCode": "0:0",
         "Submit": "2024-03-01T08:00:00", "Eligible": "2024-03-01T08:00:00",
         "Start": "2024-03-01T08:00:05", "End": "2024-03-01T09:00:05", "NNodes": "2",
         "NodeList": "gpu[001-002]", "AllocTRES": "cpu=8,gres/gpu=16,node=2"}
    r.update(over)
    return r


def _parsable(rows: list[dict]) -> str:
    return "\n".join(["|".join(FIELDS)] + ["|".join(r[f] for f in FIELDS) for r in rows]) + "\n"


@pytest.mark.parametrize("gpus", [2**24 + 1, 2147483641, 2**31 - 1])
def test_a_gpu_count_past_any_cluster_is_a_bad_row_not_a_broken_metric(historian, gpus):
    """2147483641 GPUs fit the 32-bit column; the size bucket ((gpus + 7) // 8) * 8 did not:
    on PostgreSQL `healthctl mttf` and the whole Prometheus export failed on that one row."""
    with pytest.raises(ValueError):
        sacct_parse.gpus_in_tres(f"cpu=8,gres/gpu={gpus},node=2")
    assert sacct_parse.gpus_in_tres("gres/gpu=2048") == 2048
    report = sacct.ingest_text(historian, _parsable([
        _row("1", AllocTRES=f"cpu=8,gres/gpu={gpus},node=2"), _row("2", State="NODE_FAIL")]))
    assert report.bad and report.written == 1
    from rsc_health.historian.metrics.mttf import mttf_by_size

    assert len(mttf_by_size(historian)) >= 1  # computed, on PostgreSQL too


def test_monte_carlo_for_a_run_failures_outpace_ends_and_says_so():
    """100,000 nodes at the paper's r_f: no checkpoint cycle completes between failures; the
    loop never ended (past 100 s). Bounded at MAX_ROUNDS requeues a run, scored by progress."""
    model = EttrModel(n_nodes=100_000, r_f=6.5e-3, runtime=30.0)
    result = monte_carlo(model, runs=500)
    assert result.unfinished == 500
    assert 0.0 <= result.mean < 0.05
    assert MAX_ROUNDS >= 1000
    fine = monte_carlo(EttrModel(n_nodes=1024, r_f=6.5e-3, runtime=30.0), runs=500)
    assert fine.unfinished == 0 and fine.mean == pytest.approx(
        EttrModel(n_nodes=1024, r_f=6.5e-3, runtime=30.0).expected(), abs=0.05)


def test_a_what_if_rate_from_a_base_rate_of_zero_is_that_rate(tmp_path):
    out = CliRunner().invoke(ettr_cmd, ["--nodes", "100", "--rf", "0", "--what-if",
                                        "rf=2.34", "--json"],
                             obj=AppContext(db_url=f"sqlite:///{tmp_path / 'h.db'}"))
    assert out.exit_code == 0, out.output
    assert '"r_f_per_1000": 2.34' in out.output


def test_goodput_when_every_lost_job_lost_no_gpu_hours(tmp_path):
    """A NODE_FAIL job that never started lost 0 GPU-hours: the share of preemptions divided
    by that 0 after the table was printed (ZeroDivisionError, exit 1)."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, create_missing=True)
    sacct.ingest_text(engine, _parsable([_row("1", State="NODE_FAIL", Start="Unknown",
                                              NNodes="1", NodeList="gpu001",
                                              AllocTRES="gres/gpu=8")]))
    engine.dispose()
    out = CliRunner().invoke(goodput_cmd, ["--since", "2024-01-01", "--until", "2024-12-31"],
                             obj=AppContext(db_url=url))
    assert out.exit_code == 0, out.output
    assert "none from second-order preemptions" in out.output


def _mttf_on_a_healthy_week(tmp_path, *args):
    """One 512-GPU job that completed, no failure: the measured r_f is 0.0 (helper 203)."""
    from datetime import datetime, timedelta

    from sqlalchemy import create_engine

    from rsc_health.cli import cli
    from rsc_health.historian import schema

    url = f"sqlite:///{tmp_path / 'h.db'}"
    eng = create_engine(url)
    db.create(eng)
    end = datetime(2024, 3, 10, 12)
    with eng.begin() as conn:
        conn.execute(schema.jobs.insert().values(
            job_id="1", job_id_display="1", name="train", user="alice", partition="gpu",
            state="COMPLETED", exit_code="0:0", submit=end - timedelta(hours=30),
            start=end - timedelta(hours=24), end=end, nnodes=64, gpus=512,
            nodelist="gpu[001-064]", instance_key="1:x:y"))
    eng.dispose()
    return CliRunner().invoke(cli, ["--config", "/dev/null", "--db", url, "mttf",
                                    "--since", "2024-03-01", "--until", "2024-04-01", *args],
                              env={"COLUMNS": "200"})


def test_mttf_projection_on_a_fleet_with_no_failure_yet_is_not_a_crash(tmp_path):
    """`mttf --project` divided by a measured r_f of 0.0: ZeroDivisionError, no table."""
    result = _mttf_on_a_healthy_week(tmp_path, "--project", "16384")
    assert result.exit_code == 0, repr(result.exception)
    assert "projected MTTF at 16,384 GPUs: unbounded: r_f is 0" in result.output


def test_mttf_projection_at_a_given_rate_of_zero_is_not_a_crash(tmp_path):
    result = _mttf_on_a_healthy_week(tmp_path, "--rf", "0", "--project", "16384", "--json")
    assert result.exit_code == 0, repr(result.exception)
    assert '"projected_hours": "inf"' in result.output


def test_mttf_refuses_a_projection_of_no_gpus(tmp_path):
    result = _mttf_on_a_healthy_week(tmp_path, "--rf", "6.5", "--project", "0")
    assert result.exit_code == 2, result.output
    assert "--project" in result.output


def test_ettr_projection_never_shows_a_negative_ratio(tmp_path):
    """`ettr --nodes 32000 --rf 6.5` (256k GPUs at the paper's r_f): Eq. 1 and Eq. 2 were
    -0.20 as the expected ETTR; they are held to [0, 1] and the command says the closed form
    does not hold there."""
    import json

    obj = AppContext(db_url=f"sqlite:///{tmp_path / 'h.db'}")
    out = CliRunner().invoke(ettr_cmd, ["--nodes", "32000", "--rf", "6.5", "--json"], obj=obj)
    assert out.exit_code == 0, out.output
    row = json.loads(out.output)[0]
    for key in ("eq1_expected", "eq2_long_run"):
        assert 0.0 <= row[key] <= 1.0, (key, row)
    assert row["closed_form_holds"] is False
    table = CliRunner().invoke(ettr_cmd, ["--nodes", "32000", "--rf", "6.5"], obj=obj,
                               env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "Eq. 1 and Eq. 2 do not hold" in table.output
    assert "-0.2" not in table.output
    # Where it holds, nothing is said.
    small = CliRunner().invoke(ettr_cmd, ["--nodes", "2048", "--rf", "6.5"], obj=obj,
                               env={"COLUMNS": "200"})
    assert small.exit_code == 0 and "do not hold" not in small.output, small.output


@pytest.mark.parametrize("nodes", ["0", "-4"])
def test_ettr_refuses_a_run_of_no_nodes(tmp_path, nodes):
    """`--nodes -4` showed an ETTR of 1.000."""
    out = CliRunner().invoke(ettr_cmd, ["--nodes", nodes, "--rf", "6.5"],
                             obj=AppContext(db_url=f"sqlite:///{tmp_path / 'h.db'}"))
    assert out.exit_code == 2, out.output
    assert "--nodes" in out.output


def test_every_closed_form_is_a_share_of_wall_time():
    from rsc_health.historian.metrics.ettr import eq11_daly_young, expected_ettr

    lam_rf, nodes = 6.5 / 1000, 32000
    model = EttrModel(n_nodes=nodes, r_f=lam_rf)
    assert not model.closed_form_holds()
    assert 0.0 <= model.expected() <= 1.0
    assert 0.0 <= model.expected_long_run() <= 1.0
    assert 0.0 <= float(expected_ettr(nodes, lam_rf, 30.0)) <= 1.0
    assert 0.0 <= eq11_daly_young(nodes, lam_rf, 5 / 1440, 5 / 1440) <= 1.0


def _ettr_cli(tmp_path, config_text, *args):
    from rsc_health.cli import cli

    url = f"sqlite:///{tmp_path / 'h.db'}"
    db.connect(url, upgrade=True, create_missing=True).dispose()
    config = tmp_path / "config.toml"
    config.write_text(config_text)
    return CliRunner().invoke(cli, ["--config", str(config), "--db", url, "ettr", "--nodes",
                                    "4", "--rf", "6.5", "--json", *args])


def test_ettr_what_if_free_checkpoints_is_an_answer_not_a_zero_division(tmp_path):
    """helper-213: wcp=0s made the Daly-Young interval 0 and EttrModel.expected divided by
    it (ZeroDivisionError, exit 1, no table). Refused, naming the value."""
    out = _ettr_cli(tmp_path, "", "--what-if", "wcp=0s")
    assert not isinstance(out.exception, ZeroDivisionError), out.output
    assert out.exit_code == 2 and "wcp" in out.output, out.output


def test_ettr_with_free_checkpoints_in_the_config_names_the_key(tmp_path):
    out = _ettr_cli(tmp_path, "[ettr]\nw_cp_min = 0\n")
    assert not isinstance(out.exception, ZeroDivisionError), out.output
    assert out.exit_code == 1 and "w_cp_min" in out.output, out.output
