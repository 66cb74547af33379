"""Per-sweep limits are scaled by the sweeps a rise spans, and the span is kept per family
(time_ms/ecc) while baselines are kept per counter (helper-108): a sweep that could not read one
GPU's ECC counts (one NVML answer in error) moved the family's time, so that GPU's next rise,
over two sweeps, was judged against one sweep's limit (750 corrected errors a sweep, under the
1,000 set, drained it for repair). Now a baseline the sweep did not read keeps the time it was
taken (time_ms/<counter>), and its rise is judged over the sweeps since then (helper-207: the
baseline forgotten instead hid a rise past any limit, test_counter_unread_keeps_baseline.py)."""

from __future__ import annotations

from rsc_health.checks import state as checks_state
from tests.node.conftest import bad

MIN5 = 300_000


def test_a_gpu_unread_for_one_sweep_is_judged_over_the_sweeps_its_rise_spans(node, monkeypatch):
    clock = [3_600_000]
    monkeypatch.setattr(checks_state, "_now_ms", lambda: clock[0])
    node.check(sweep=True)  # baselines at 0, their time on record
    clock[0] += MIN5
    node.nvml(lambda d: d["devices"][0]["ecc"]["volatile"].update(
        corrected={"error": "NVML_ERROR_TIMEOUT"}))
    node.check(sweep=True)  # gpu0's count unread this sweep: its baseline stays at 0
    clock[0] += MIN5
    node.nvml(lambda d: d["devices"][0]["ecc"]["volatile"].update(corrected=1500))
    findings, _ = node.check(sweep=True)  # 1,500 over two sweeps: 750 a sweep
    assert [f.reason for f in bad(findings) if f.code == "ecc_sbe_rising"] == []
