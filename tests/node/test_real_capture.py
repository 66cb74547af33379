"""The node path on a real GPU node's capture (tests/fixtures/real/h200-vm-2026-11-26: one H200,
driver 580.159.04, NVLink answering NOT_SUPPORTED): replayed anywhere it judges as it did live."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


# tests/fixtures/real/h200-fc-2026-11-29 (session 37, capture_live.sh, capture_live2.sh and
# prolog_profile.py): another machine of the same kind, Firecracker, with today's node path.
LIVE = CAPTURE.parent / "h200-fc-2026-11-29"


@pytest.mark.parametrize(("snapshot", "live"), [
    ("snapshot.json", "check-live-own.json"),
    ("system-python/snapshot.json", "system-python/check-live.json"),
])
def test_a_real_nodes_snapshot_with_proc_mounts_a_link_to_a_file_replays_to_its_live_verdict(
        snapshot, live):
    """A real Linux /proc/mounts is a link to self/mounts, a file: the replay made every link's
    target a directory, and `check --from` any snapshot of a real node ended in FileExistsError
    (found on this capture). Replayed, it judges every family as the node did live."""
    doc = json.loads((LIVE / snapshot).read_text())
    assert doc["links"]["proc/mounts"].endswith("/mounts") and \
        doc["links"]["proc/mounts"] in doc["files"]
    res = CliRunner().invoke(cli, ["check", "--from", str(LIVE / snapshot), "--json"])
    assert res.exit_code == 0, res.output
    assert _key(json.loads(res.output)) == _key(json.loads((LIVE / live).read_text()))


def _diffs(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _diffs(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _diffs(x, y, f"{path}/{i}")]
    return [] if a == b else [path]


def test_the_own_nvml_binding_answers_as_pynvml_does_on_the_real_driver():
    """The prolog's own ctypes binding against NVIDIA's pynvml on driver 580.159.04, five
    alternating reads with a process holding 1.6 GiB on the GPU (the process list's v3 struct,
    the fabric struct, PCI info v3): the same answers document each time."""
    doc = json.loads((LIVE / "bindings-busy.json").read_text())
    own = [r["doc"] for r in doc["reads"] if r["binding"] == "own"]
    ours = [r["doc"] for r in doc["reads"] if r["binding"] == "pynvml"]
    assert len(own) == len(ours) == 5
    for a, b in zip(own, ours, strict=True):
        assert _diffs(a, b) == []
        [gpu] = a["devices"]
        assert gpu["processes"] and gpu["processes"][0]["used_memory"] > 1 << 30
        assert parse_answers(a).gpus[0].field_errors == {}


def test_a_healthy_h200_under_gpu_burn_holds_sw_power_cap_and_the_telemetry_family_only_samples():
    """Sweeps every 5 s across an idle GPU, the PyTorch probe and four gpu-burn runs: under the
    burn the GPU sat in SW power cap for the whole interval with its SM clock at 0.77-0.93 of
    its maximum: a healthy GPU, which the telemetry family never warned about. Re-judged here
    with today's thresholds: no sample is past a warning line but SW power cap's rollup line."""
    from rsc_health.config import load_config

    recs = [json.loads(line) for line in (LIVE / "sweep-spool.jsonl").read_text().splitlines()]
    tele = [r for r in recs if r["kind"] == "telemetry"]
    checks = [r for r in recs if r["kind"] == "check" and r["check"] == "telemetry"]
    assert len(tele) >= 30 and checks and all(c["status"] == "ok" for c in checks)
    busy = [r["metrics"] for r in tele if r["metrics"].get("power_ratio", {}).get("value", 0) > 0.9]
    assert len(busy) >= 8
    assert max(m["throttle_power_frac"]["value"] for m in busy) >= 0.99
    assert 0.7 < min(m["sm_clock_ratio"]["value"] for m in busy) < 0.95
    cfg = load_config(None).section("telemetry")
    past = set()
    for m in (r["metrics"] for r in tele):
        for name, line in cfg["warn_above"].items():
            if name in m and m[name]["value"] > line:
                past.add(name)
        for name, line in cfg["warn_below"].items():
            if name in m and m[name]["value"] < line:
                past.add(name)
    assert past == {"throttle_power_frac"}


def test_gpu_burn_on_a_second_h200_passes_against_the_firsts_runs_and_a_5_percent_slower_fails():
    """Two machines of the same kind, three days apart, each qualified by rsc-health's own
    suite: the second's gpu-burn runs (352,369-353,696 GFLOP/s) sit 1.2% above the first's
    (346,002-349,706). The peer judge's margin takes that machine-to-machine spread of a healthy
    part. Judged against both machines' runs (a wider spread: the line widens to its 5% bound,
    -4.9% of the median) a GPU 6% slower than the slowest still fails."""
    from rsc_health.qualify import Metric
    from rsc_health.qualify.judge import FAIL, PASS, Rules, judge

    def burn(paths):
        return [x["value"] for p in paths for x in json.loads(p.read_text())["results"]
                if x["metric"] == "gpu-burn/fp32_tc_flops"]

    first = burn(sorted((CAPTURE / "qualify").glob("qualify-*-h200-*.json")))
    second = burn(sorted(LIVE.glob("qualify-[lf]*-?.json")))
    assert len(first) == 6 and len(second) == 4
    assert min(second) > max(first)  # a machine apart, not noise
    rules = Rules(min_peers=5)
    for v in second:
        assert judge(Metric("gpu-burn/fp32_tc_flops", v, "GFLOP/s"), first,
                     rules=rules).status == PASS
    slow = min(first) * 0.94
    assert judge(Metric("gpu-burn/fp32_tc_flops", slow, "GFLOP/s"), first + second,
                 rules=rules).status == FAIL
