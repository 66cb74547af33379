"""The node path on a real GPU node's capture (tests/fixtures/real/h200-vm-2026-11-26: one H200,
driver 580.159.04, NVLink answering NOT_SUPPORTED): replayed anywhere it judges as it did live."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.collect.gpu import parse_answers

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-vm-2026-11-26"


def _key(doc: dict) -> list[tuple]:
    return sorted((f["family"], f["component"], f["code"], f["status"]) for f in doc["findings"])


def test_real_h200_snapshot_replays_to_the_verdict_the_node_gave_live():
    live = json.loads((CAPTURE / "check-live.json").read_text())
    res = CliRunner().invoke(cli, ["check", "--from", str(CAPTURE / "snapshot.json"), "--json"])
    replayed = json.loads(res.output)
    assert res.exit_code == live["verdict"]["exit_code"] == 0
    # Families added after the capture (sxid, fabric, leftover, dcgm) find this PCIe H200
    # healthy too (no NVSwitch, no SXid line, no GPU process, DCGM not asked); the others
    # judge it exactly as it was judged live.
    known = {f["family"] for f in live["findings"]}
    assert _key({"findings": [f for f in replayed["findings"] if f["family"] in known]}) \
        == _key(live)
    assert all(f["status"] == "ok" for f in replayed["findings"] if f["family"] not in known)
    # The snapshot predates the telemetry block: a sample of what it had, nothing to warn.
    tele = [f for f in replayed["findings"] if f["family"] == "telemetry"]
    assert [(f["status"], f["component"]) for f in tele] == [("ok", "node")]
    # It did look: the one GPU, its ECC and remapping, its PCIe link were judged.
    assert {"gpu", "ecc", "remap", "pcie", "xid"} <= {f["family"] for f in replayed["findings"]}


def test_real_nvml_answers_parse_with_not_supported_fields_as_absent_not_faults():
    doc = json.loads((CAPTURE / "snapshot.json").read_text())["nvml"]
    report = parse_answers(doc)
    assert report.error is None and report.driver_version == "580.159.04"
    [gpu] = report.gpus
    assert gpu.error is None and gpu.name == "NVIDIA H200"
    # A Hopper GPU has no page retirement and this one no NVLink peers: NVML says NOT_SUPPORTED,
    # which is "absent" (no checker error, no fault), while the answer itself is kept.
    assert gpu.field_errors == {}
    assert gpu.answers["retired_pages"]["pending"] == {"error": "NVML_ERROR_NOT_SUPPORTED"}
    assert gpu.answers["nvlink"] == []


def test_the_real_h200_qualification_runs_judge_a_5_percent_slower_gpu_a_fail():
    """The product's own qualification suite on the real H200 (qualify/): six gpu-burn runs,
    none inconclusive for want of a tool, judged against each other; the same judge fails a GPU
    5% slower than them and passes each of them against the other five."""
    from rsc_health.qualify import Metric
    from rsc_health.qualify.judge import FAIL, PASS, Rules, judge

    runs = [json.loads(p.read_text())
            for p in sorted((CAPTURE / "qualify").glob("qualify-*-h200-*.json"))]
    full = [r for r in runs if r["tier"] == "full"]
    assert all(r["verdict"] == "inconclusive" for r in full)  # no dcgmi, one NCCL rank
    assert all("tool not found" in r["reason"] and "one rank" in r["reason"] for r in full)
    values = [x["value"] for r in runs for x in r["results"]
              if x["metric"] == "gpu-burn/fp32_tc_flops"]
    assert len(values) == 6
    rules = Rules(min_peers=5)
    for i, v in enumerate(values):
        others = values[:i] + values[i + 1:]
        assert judge(Metric("gpu-burn/fp32_tc_flops", v, "GFLOP/s"), others,
                     rules=rules).status == PASS
    slow = min(values) * 0.95
    assert judge(Metric("gpu-burn/fp32_tc_flops", slow, "GFLOP/s"), values,
                 rules=rules).status == FAIL
