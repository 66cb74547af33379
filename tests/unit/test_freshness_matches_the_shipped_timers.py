"""`[historian] stale_after_s` against the cadence the shipped units deliver at: a healthy node
is never shown as stopped, and one whose sweeps stopped is shown within a flush interval of it.

The node's newest heartbeat in the historian is the last sweep before its last flush. With
sweeps every five minutes (slurm.conf HealthCheckInterval=300, README) and a flush on
deploy/node/rsc-health-flush.timer (OnCalendar every N minutes; FixedRandomDelay keeps each
node's offset, so its period stays N), the age of that heartbeat runs up to a flush interval
plus a sweep interval. A default of three sweeps alone (900 s) showed a sixth of a healthy fleet as
"checks stopped" at any moment."""

from __future__ import annotations

import re
from pathlib import Path

from rsc_health.config import load_config

REPO = Path(__file__).resolve().parents[2]
SWEEP_S = 300


def _seconds(value: str) -> int:
    units = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    m = re.fullmatch(r"(\d+)\s*(s|sec|min|m|h)?", value.strip())
    assert m, value
    return int(m.group(1)) * units[m.group(2) or "s"]


def _timer() -> dict[str, str]:
    text = (REPO / "deploy/node/rsc-health-flush.timer").read_text()
    return dict(re.findall(r"^(\w+)=(.+)$", text, re.M))


def _flush_period_s() -> int:
    """The flush period: OnCalendar=*:0/N fires every N minutes; the random delay, fixed per
    node, only moves each node within the period."""
    timer = _timer()
    m = re.fullmatch(r"\*:0/(\d+)", timer["OnCalendar"].strip())
    assert m, timer["OnCalendar"]
    return int(m.group(1)) * 60


def test_the_shipped_flush_timer_keeps_each_nodes_period_fixed():
    """With OnUnitActiveSec the random delay would be added on top of every period (15 min
    became 15 to 30); OnCalendar with FixedRandomDelay keeps it exact and spread."""
    timer = _timer()
    assert "OnUnitActiveSec" not in timer
    assert timer["FixedRandomDelay"].strip() == "true"
    assert 0 < _seconds(timer["RandomizedDelaySec"]) <= _flush_period_s()


def _newest_delivered_age(t: int, flush_s: int, offset: int, stopped_at: int | None) -> int:
    """Age at time t of the newest heartbeat the historian holds for a node sweeping every
    SWEEP_S (until stopped_at) and flushing every flush_s from `offset`."""
    last_flush = (t - offset) // flush_s * flush_s + offset
    last_sweep = last_flush // SWEEP_S * SWEEP_S
    if stopped_at is not None:
        last_sweep = min(last_sweep, (stopped_at - 1) // SWEEP_S * SWEEP_S)
    return t - last_sweep


def test_a_healthy_node_flushing_on_the_shipped_timer_is_never_stale():
    stale_after = float(load_config("/dev/null").get("historian.stale_after_s"))
    flush_s = _flush_period_s()
    worst = max(_newest_delivered_age(t, flush_s, offset, None)
                for offset in range(0, flush_s, 37) for t in range(flush_s * 4, flush_s * 8, 11))
    assert worst > flush_s  # the lag is real: a flush interval and more
    assert worst < stale_after, (worst, stale_after)


def test_a_node_whose_sweeps_stopped_is_stale_within_a_flush_interval_of_the_threshold():
    stale_after = float(load_config("/dev/null").get("historian.stale_after_s"))
    flush_s = _flush_period_s()
    stopped = flush_s * 10
    for offset in range(0, flush_s, 37):
        t = stopped + int(stale_after) + flush_s
        assert _newest_delivered_age(t, flush_s, offset, stopped) > stale_after


def test_the_fail_slow_detector_waits_longer_than_a_flush_for_a_jobs_samples():
    """[failslow] complete_after_s: a slot not every node of its job has delivered is judged
    once it is that old. Under a flush period, a healthy node's samples of a slot (up to a
    sweep late in it, delivered at its next flush) came after the slot was judged without
    them: the early flushers judged alone again."""
    complete = float(load_config("/dev/null").get("failslow.complete_after_s"))
    assert complete >= _flush_period_s() + SWEEP_S
