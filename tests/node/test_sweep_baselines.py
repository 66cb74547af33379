"""Limits "per sweep" judged over a sweep, whatever job starts and ends run between two sweeps:
a prolog or epilog judges the rise since the sweep's baseline and moves none (a bad part whose
jobs crash and requeue must not split its errors into steps under the limit), and a rise that
spans more than a sweep (sweeps missed) is judged against the limit times the sweeps it spans,
never less than one's."""

from __future__ import annotations

import pytest

from rsc_health.checks import state as state_mod
from rsc_health.model import Level

from .conftest import bad

PROLOG = {"gpu", "xid", "ecc", "remap", "mount", "infiniband", "leftover"}  # the default
EPILOG = {"gpu", "xid", "ecc", "remap"}
SYMBOL = "sys/class/infiniband/mlx5_3/ports/1/counters/symbol_error"
MIN = 60_000  # ms


@pytest.fixture
def clock(monkeypatch):
    """The baselines' clock (CLOCK_MONOTONIC ms), set by the test."""
    now = [10 * MIN]
    monkeypatch.setattr(state_mod, "_now_ms", lambda: now[0])
    return now


def _prolog(node):
    return node.check(only=PROLOG, stage="prolog")


def _drains(found):
    return [(f.component, f.code) for f in bad(found)]


def test_ib_symbol_errors_past_the_sweep_limit_drain_even_with_a_job_start_between(node):
    counter = node.path(SYMBOL)
    node.check(sweep=True)                         # sweep at t0: baseline 0
    counter.write_text("9\n")
    assert bad(_prolog(node)[0]) == []             # a job starts at t0+2.5 min: +9, under 10
    counter.write_text("18\n")
    found, verdict = node.check(sweep=True)        # sweep at t0+5 min: +18 in one sweep
    # 18 symbol errors in one five-minute sweep is past DEFAULT_LIMITS' 10 "a sweep".
    assert _drains(found) == [("mlx5_3/1", "ib_symbol_errors")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_corrected_ecc_burst_past_the_sweep_limit_drains_even_with_job_starts_between(node):
    node.check(sweep=True)
    for count in (700, 1400):                      # one job ends (epilog), the next starts
        node.nvml(lambda d, c=count: d["devices"][5]["ecc"]["volatile"].update(corrected=c))
        found, _ = node.check(only=EPILOG if count == 700 else PROLOG,
                              stage="epilog" if count == 700 else "prolog")
        # The job start judges the 1,400 since the sweep too: past the limit already.
        assert _drains(found) == ([] if count == 700 else [("gpu5", "ecc_sbe_rising")])
    node.nvml(lambda d: d["devices"][5]["ecc"]["volatile"].update(corrected=2100))
    found, verdict = node.check(sweep=True)
    # 2,100 corrected errors in one sweep against ecc_corrected_per_sweep = 1000.
    assert ("gpu5", "ecc_sbe_rising") in _drains(found)
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_job_start_sees_the_rise_since_the_sweep_and_the_next_sweep_sees_it_again(node):
    counter = node.path(SYMBOL)
    node.check(sweep=True)
    counter.write_text("6\n")
    assert bad(_prolog(node)[0]) == []
    counter.write_text("12\n")                     # +12 since the sweep, one job start later
    assert _drains(_prolog(node)[0]) == [("mlx5_3/1", "ib_symbol_errors")]
    found, _ = node.check(sweep=True)              # the sweep judges its whole interval
    assert _drains(found) == [("mlx5_3/1", "ib_symbol_errors")]
    assert bad(node.check(sweep=True)[0]) == []    # and moves the baseline: nothing new


def test_a_rise_under_the_limit_every_sweep_never_drains_however_many_job_starts(node, clock):
    counter = node.path(SYMBOL)
    node.check(sweep=True)
    count = 0
    for _ in range(4):                             # 8 a sweep, under 10, in 4-error steps
        for stage in ("epilog", "prolog"):
            clock[0] += MIN
            count += 4
            counter.write_text(f"{count}\n")
            if stage == "prolog":
                found, _ = _prolog(node)
            else:
                found, _ = node.check(only=EPILOG | {"infiniband"}, stage="epilog")
            assert bad(found) == []
        clock[0] += 3 * MIN
        assert bad(node.check(sweep=True)[0]) == []


def test_sweeps_missed_widen_the_limit_by_the_time_since_the_sweep_never_below_one(
        node, clock):
    counter = node.path(SYMBOL)
    node.check(sweep=True)
    # No sweep for 15 minutes (the timer stopped, sweeps killed): job starts judge 8 errors
    # every five minutes against the limit over the time since the sweep, not one sweep's.
    for n in (1, 2, 3):
        clock[0] += 5 * MIN
        counter.write_text(f"{8 * n}\n")
        assert bad(_prolog(node)[0]) == []
    clock[0] += 1000                               # +24 in 15 min is under 3 x 10, not +31
    counter.write_text("31\n")
    found, _ = _prolog(node)
    assert _drains(found) == [("mlx5_3/1", "ib_symbol_errors")]
    assert "over the last 15 min" in bad(found)[0].reason
    clock[0] += 5 * MIN                            # the sweep: +31 in 20 min, under 40
    assert bad(node.check(sweep=True)[0]) == []
    clock[0] += 1000                               # a second after it: one sweep's limit
    counter.write_text("42\n")
    assert _drains(_prolog(node)[0]) == [("mlx5_3/1", "ib_symbol_errors")]


def test_a_counter_reset_between_sweeps_counts_from_zero_at_the_job_start_and_the_sweep(node):
    counter = node.path(SYMBOL)
    counter.write_text("50\n")
    node.check(sweep=True)
    counter.write_text("4\n")                      # reset (a link retrain, a driver reload)
    assert bad(_prolog(node)[0]) == []             # 4 since the reset
    counter.write_text("14\n")
    found, _ = node.check(sweep=True)              # 14 since the reset, in one sweep
    assert _drains(found) == [("mlx5_3/1", "ib_symbol_errors")]


def test_a_job_start_after_a_reboot_keeps_the_first_baselines_of_the_new_boot(node):
    counter = node.path(SYMBOL)
    counter.write_text("18\n")
    node.check(sweep=True)
    node.write("proc/sys/kernel/random/boot_id", "0f3c5d7e-1111-4a2b-9c3d-5e6f7a8b9c0d\n")
    counter.write_text("3\n")
    assert bad(_prolog(node)[0]) == []             # 3 since boot: the new boot's baseline
    counter.write_text("14\n")
    found, _ = node.check(sweep=True)              # +11 since that job start
    assert _drains(found) == [("mlx5_3/1", "ib_symbol_errors")]
