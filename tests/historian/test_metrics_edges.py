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
