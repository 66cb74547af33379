"""A counter that could not be read for one run (a garbled sysfs count, an NVML error on
one field) keeps its last good baseline, and the time that baseline was taken, so the next
good read is judged against it (helper-207). A sweep that read the family's other counters
moved the family's time (time_ms/<family>), and the unread counter's baseline was dropped
with it: the next read was a fresh baseline with no rise, and a host-memory uncorrectable
error logged in between never drained the node. Its own time (time_ms/<counter key>) keeps
the per-sweep limits true over the sweeps its rise spans (helper-108's 1,500 corrected ECC
errors over two sweeps is no drain; 2,500 is)."""

from __future__ import annotations

import json

import pytest

from rsc_health.checks import state as checks_state
from rsc_health.model import Level
from tests.node.conftest import bad

MC = "sys/devices/system/edac/mc/mc0"
AER = "sys/devices/pci0000:b7/0000:b7:01.0/aer_dev_nonfatal"
MIN5 = 300_000


@pytest.fixture
def clock(monkeypatch):
    now = [3_600_000]
    monkeypatch.setattr(checks_state, "_now_ms", lambda: now[0])
    return now


def _saved(node) -> dict:
    return json.loads(node.path("var/lib/rsc_health/counters.json").read_text())["counters"]


@pytest.mark.parametrize("sweep", [True, False], ids=["sweeps", "plain-runs"])
def test_an_uncorrectable_error_after_one_unreadable_read_still_drains(node, sweep):
    """Sweep 1 keeps ue=0 as mc0's baseline. Sweep 2 cannot read ue_count (a checker error,
    garbled for one read) but reads ce_count. Meanwhile a UE hits: sweep 3 reads ue_count=1,
    a rise over the baseline sweep 1 kept: drain now for a DIMM swap."""
    node.write(f"{MC}/ce_count", "0\n")
    node.write(f"{MC}/ue_count", "0\n")
    node.check(only={"host"}, sweep=sweep)
    node.write(f"{MC}/ue_count", "garbled\n")
    found, verdict = node.check(only={"host"}, sweep=sweep)
    assert verdict.level is Level.CHECKER_ERROR, [f.reason for f in bad(found)]
    node.write(f"{MC}/ue_count", "1\n")
    found, verdict = node.check(only={"host"}, sweep=sweep)
    assert verdict.level is Level.DRAIN_NOW, [f.reason for f in bad(found)]
    assert [f.code for f in bad(found)] == ["edac_ue"]


def test_an_unread_counter_keeps_the_time_of_its_baseline_until_it_is_read(node, clock):
    """What counters.json holds: the unread counter's baseline and, under its own time key,
    when that baseline was taken (sweep 1's); a good read moves both with the family's."""
    node.write(f"{MC}/ce_count", "0\n")
    node.write(f"{MC}/ue_count", "0\n")
    node.check(only={"host"}, sweep=True)
    taken = clock[0]
    clock[0] += MIN5
    node.write(f"{MC}/ue_count", "garbled\n")
    node.check(only={"host"}, sweep=True)
    saved = _saved(node)
    assert saved["edac/mc0/ue"] == 0 and saved["time_ms/edac/mc0/ue"] == taken, saved
    assert saved["time_ms/host"] == clock[0] and "time_ms/edac/mc0/ce" not in saved, saved
    clock[0] += MIN5
    node.write(f"{MC}/ue_count", "0\n")
    node.check(only={"host"}, sweep=True)
    saved = _saved(node)
    assert "time_ms/edac/mc0/ue" not in saved and saved["time_ms/host"] == clock[0], saved


def test_corrected_ecc_errors_after_an_unread_sweep_are_judged_over_the_sweeps_they_span(
        node, clock):
    """gpu0's corrected count unread for one sweep (an NVML error on that field): 2,500 over
    the two sweeps since its baseline is past two sweeps' limit (1,000 a sweep) and drains
    after the job; the dropped baseline made it a first reading, judged never."""
    node.check(sweep=True)
    clock[0] += MIN5
    node.nvml(lambda d: d["devices"][0]["ecc"]["volatile"].update(
        corrected={"error": "NVML_ERROR_TIMEOUT"}))
    node.check(sweep=True)
    clock[0] += MIN5
    node.nvml(lambda d: d["devices"][0]["ecc"]["volatile"].update(corrected=2500))
    found, _ = node.check(sweep=True)
    rising = [f.reason for f in bad(found) if f.code == "ecc_sbe_rising"]
    assert rising == ["gpu0 2500 corrected ECC errors over the last 10 min (> 2000)"], rising


def test_nvlink_errors_after_an_unread_sweep_still_drain(node, clock):
    """One link's CRC counter unanswered for a sweep, then rising: nvlink_errors."""
    link = lambda d: d["devices"][0]["nvlink"][0]  # noqa: E731
    node.check(sweep=True)
    clock[0] += MIN5
    node.nvml(lambda d: link(d).update(crc_flit={"error": "NVML_ERROR_UNKNOWN"}))
    node.check(sweep=True)
    clock[0] += MIN5
    node.nvml(lambda d: link(d).update(crc_flit=40))
    found, _ = node.check(sweep=True)
    assert [f.code for f in bad(found) if f.code == "nvlink_errors"] == ["nvlink_errors"], \
        [f.reason for f in bad(found)]


def test_pcie_nonfatal_aer_errors_after_an_unreadable_read_still_drain(node, clock):
    """A device's AER total garbled for one sweep, then 3 non-fatal errors: aer_nonfatal."""
    text = node.path(AER).read_text()
    node.check(sweep=True)
    clock[0] += MIN5
    node.write(AER, text.replace("TOTAL_ERR_NONFATAL 0", "TOTAL_ERR_NONFATAL x"))
    node.check(sweep=True)
    clock[0] += MIN5
    node.write(AER, text.replace("TOTAL_ERR_NONFATAL 0", "TOTAL_ERR_NONFATAL 3"))
    found, _ = node.check(sweep=True)
    assert [f.code for f in bad(found)] == ["aer_nonfatal"], [f.reason for f in bad(found)]


def test_infiniband_errors_after_an_unreadable_counter_are_judged_over_their_span(
        node, clock):
    """A port's symbol_error garbled for one sweep, then 25 errors: past two sweeps' limit
    (10 a sweep), judged over the ten minutes since its baseline."""
    counter = "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    node.check(sweep=True)
    clock[0] += MIN5
    node.write(counter, "x\n")
    node.check(sweep=True)
    clock[0] += MIN5
    node.write(counter, "25\n")
    found, _ = node.check(sweep=True)
    assert [f.reason for f in bad(found) if f.code == "ib_symbol_errors"] == [
        "mlx5_0/1 symbol_error +25 over the last 10 min (limit 10 a sweep)"], \
        [f.reason for f in bad(found)]
