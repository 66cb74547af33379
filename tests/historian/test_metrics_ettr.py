"""Expected ETTR: the paper's closed forms, its worked numbers, and agreement with Monte Carlo."""

import math

import pytest

from rsc_health.historian.metrics.ettr import (
    EttrModel,
    daly_young_interval,
    eq11_daly_young,
    hours,
    minutes,
    monte_carlo,
)

RSC1_RF = 6.50e-3  # failures per node-day, paper section III


def test_daly_young_interval_is_sqrt_of_2w_over_failure_rate():
    # N r_f = 1024 * 5e-3 = 5.12 per day, w = 5 min -> sqrt(2 * 5 / 7372.8 min^-1) min
    dt = daly_young_interval(1024, 5e-3, minutes(5))
    assert dt * 1440 == pytest.approx(math.sqrt(2 * 5 / (5.12 / 1440)), rel=1e-12)


def test_eq2_by_hand_for_a_1024_node_run():
    m = EttrModel(n_nodes=1024, r_f=5e-3, dt_cp=hours(1))
    lam = 5.12
    expected = (1 - lam * (minutes(5) + hours(0.5))) / (1 + minutes(5) / hours(1))
    assert m.expected_long_run() == pytest.approx(expected, rel=1e-12)


def test_eq11_is_eq10_with_the_daly_young_interval():
    m = EttrModel(n_nodes=700, r_f=RSC1_RF)
    assert eq11_daly_young(700, RSC1_RF, m.u0, m.w_cp) == pytest.approx(
        m.expected_long_run(), rel=1e-12
    )


def test_full_form_tends_to_eq2_for_long_runs_without_queueing():
    m = EttrModel(n_nodes=512, r_f=RSC1_RF, runtime=1e6, queue=0.0)
    assert m.expected() == pytest.approx(m.expected_long_run(), rel=1e-5)


def test_queue_time_lowers_expected_ettr():
    base = EttrModel(n_nodes=512, r_f=RSC1_RF, runtime=2.0)
    assert base.expected() > EttrModel(512, RSC1_RF, runtime=2.0, queue=hours(2)).expected()


def test_paper_observation_10_rsc1_2k_to_4k_gpu_runs_near_0_85_to_0_9():
    # 2048 and 4096 GPUs = 256 and 512 nodes, Daly-Young, u0 = w_cp = 5 min.
    at_2k = EttrModel(256, RSC1_RF).expected_long_run()
    at_4k = EttrModel(512, RSC1_RF).expected_long_run()
    assert 0.88 < at_2k < 0.90
    assert 0.84 < at_4k < 0.86


def test_paper_fig10_12k_gpus_needs_rf_near_1_or_10s_checkpoints_for_0_9():
    today = EttrModel(1500, RSC1_RF)  # 12,000 GPUs
    assert today.expected_long_run() == pytest.approx(0.74, abs=0.01)
    assert today.what_if(rf_scale=1.0 / 6.5).expected_long_run() == pytest.approx(0.9, abs=0.01)
    assert today.what_if(w_cp=10 / 86400).expected_long_run() == pytest.approx(0.92, abs=0.01)


def test_what_if_halving_failure_rate_shortens_mttf_inverse_and_raises_ettr():
    m = EttrModel(1024, RSC1_RF)
    half = m.what_if(rf_scale=0.5)
    assert half.mttf == pytest.approx(2 * m.mttf)
    assert half.expected_long_run() > m.expected_long_run()
    assert half.interval == pytest.approx(m.interval * math.sqrt(2))


@pytest.mark.parametrize(
    "model",
    [
        EttrModel(1024, 5e-3, runtime=7.0),  # the paper's 8k-GPU check, r_f ~ 5e-3
        EttrModel(1500, RSC1_RF, runtime=7.0),
        EttrModel(256, RSC1_RF, runtime=2.0, u0=minutes(20), queue=hours(1)),
        EttrModel(128, 2.34e-3, runtime=3.0, dt_cp=hours(1), queue=hours(3)),
    ],
    ids=["8k-gpus", "12k-gpus", "2k-gpus-u0-20m-queue", "1k-gpus-rsc2-hourly-ckpt"],
)
def test_closed_form_within_5_percent_of_monte_carlo(model):
    mc = monte_carlo(model, runs=4000, seed=1)
    assert model.expected() == pytest.approx(mc.mean, rel=0.05)
    assert model.expected_failures() == pytest.approx(mc.mean_failures, rel=0.05)


def test_monte_carlo_without_failures_only_pays_overheads():
    m = EttrModel(8, 0.0, runtime=1.0, dt_cp=hours(1), queue=0.0)
    mc = monte_carlo(m, runs=10, seed=0)
    assert mc.mean_failures == 0
    assert mc.mean == pytest.approx(1.0 / (1.0 + minutes(5) + 24 * minutes(5)), rel=1e-9)


def test_monte_carlo_is_reproducible_with_a_seed():
    m = EttrModel(512, RSC1_RF, runtime=2.0)
    assert monte_carlo(m, runs=500, seed=7) == monte_carlo(m, runs=500, seed=7)


def test_vectorised_expected_ettr_matches_the_model_row_by_row():
    from rsc_health.historian.metrics.ettr import expected_ettr

    models = [
        EttrModel(64, RSC1_RF, runtime=3.0, queue=hours(2)),
        EttrModel(512, 2.34e-3, runtime=10.0, u0=minutes(15), queue=hours(0.5)),
        EttrModel(1, RSC1_RF, runtime=0.5, dt_cp=hours(1)),
    ]
    import numpy as np

    got = expected_ettr(
        np.array([m.n_nodes for m in models]),
        RSC1_RF * np.array([1.0, 2.34 / 6.5, 1.0]),
        np.array([m.runtime for m in models]),
        u0=np.array([m.u0 for m in models]),
        dt_cp=np.array([np.nan, np.nan, hours(1)]),
        queue=np.array([m.queue for m in models]),
    )
    assert got == pytest.approx([m.expected() for m in models], rel=1e-12)
