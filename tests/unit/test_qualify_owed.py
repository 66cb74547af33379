"""A node is judged by the evidence it owes, not by what it printed: a test that ran on fewer
GPUs than [gpu] count, or lacks a metric its peers measure in the same test (nvbandwidth's
waived testcases when P2P is lost), is inconclusive, never a pass (verdict.missing)."""

from __future__ import annotations

from pathlib import Path

from rsc_health.qualify import parse
from rsc_health.qualify.baseline import Baseline
from rsc_health.qualify.judge import Rules
from rsc_health.qualify.verdict import judge_run
from rsc_health.sim import qualify_tools as standin

TOOLS = Path(__file__).resolve().parents[1] / "fixtures" / "qualify" / "tool-outputs"
REAL_NVB = (TOOLS / "nvbandwidth_results.log").read_text()


def _nvb_lost_p2p() -> str:
    """The real GH200 output as a node of the same group prints it with one more testcase
    waived: nvbandwidth prints `Waived: ` (no name) where it would have printed the testcase
    (nvbandwidth.cpp runTestcase: filterHasAccessiblePeerPairs false)."""
    block = REAL_NVB.index("Running host_device_latency_sm.")
    end = REAL_NVB.index("SUM host_device_latency_sm")
    end = REAL_NVB.index("\n", end) + 2
    return REAL_NVB[:block] + "Waived: \n" + REAL_NVB[end:]


def _judge(outcome, *, gpus=0, expected=None, baseline=None):
    outcome.test = "nvb"
    peers = [100.0] * 8 if baseline is None else []
    return judge_run([outcome], peers_of=lambda m, _t: [m.value] * len(peers),
                     baseline=baseline, rules=Rules(), gpus=gpus,
                     expected_of=(lambda test: expected) if expected is not None else None)


def test_a_testcase_nvbandwidth_waived_that_its_peers_measured_is_never_a_pass():
    full, lost = parse("nvbandwidth", REAL_NVB), parse("nvbandwidth", _nvb_lost_p2p())
    owed = {(m.name, m.index) for m in full.metrics}
    assert not lost.inconclusive and len(lost.metrics) == len(full.metrics) - 2
    assert _judge(full, expected=owed).verdict == "pass"
    judged = _judge(lost, expected=owed)
    assert judged.verdict == "inconclusive"
    assert "no result for nvbandwidth/host_device_latency_sm:0" in judged.reason


def test_a_tool_that_ran_on_fewer_gpus_than_gpu_count_is_never_a_pass_even_on_a_baseline():
    """A young fleet (no peers) judged against an imported baseline: gpu-burn tested 7 GPUs
    (its own list), each at the baseline's figure."""
    base = Baseline({"gpu-burn/fp64_tc_flops": 16950.0})
    seven = parse("gpu_burn", standin.gpu_burn([16950.0] * 7))
    assert seven.devices == 7
    assert _judge(seven, baseline=base).verdict == "pass"  # [gpu] count not said
    judged = _judge(parse("gpu_burn", standin.gpu_burn([16950.0] * 7)), gpus=8, baseline=base)
    assert judged.verdict == "inconclusive" and "ran on 7 of 8 GPUs" in judged.reason
    eight = parse("gpu_burn", standin.gpu_burn([16950.0] * 8))
    assert _judge(eight, gpus=8, baseline=base).verdict == "pass"


def test_nccl_tests_counts_the_ranks_each_host_gave_it():
    assert parse("nccl_tests", (TOOLS / "nccl_allreduce.log").read_text()).devices == 8
    # One GPU per rank (srun --gpus-per-task=1): every rank says `device 0`; ranks count.
    text = standin.nccl(231.0).replace("device  1", "device  0")
    assert parse("nccl_tests", text).devices == 8
    # A pairwise run over two hosts: the host that gave it fewest decides.
    two = standin.nccl(231.0, ranks=15, hosts=("node01", "node02"))
    assert parse("nccl_tests", two).devices == 7
    assert _judge(parse("nccl_tests", two), gpus=8).verdict == "inconclusive"


def test_a_pair_nvbandwidth_could_not_measure_is_never_hidden_by_its_columns_slowest_path():
    """A GPU pair whose P2P is lost prints N/A in its cell (inline_common.h) while the testcase
    still runs: each column's metric is its slowest measured path, so the lost cell vanished.
    The cells measured are a count the node owes as its peers measured them."""
    text = REAL_NVB.replace(" 1    323.36    299.33    312.11", " 1    323.36       N/A    312.11")
    full, lost = parse("nvbandwidth", REAL_NVB), parse("nvbandwidth", text)
    assert {m.key for m in full.metrics} == {m.key for m in lost.metrics}
    owed = {(m.name, m.index) for m in full.metrics}
    peers = {m.key: [m.value] * 8 for m in full.metrics}
    judged = judge_run([lost], peers_of=lambda m, _t: peers[m.key], baseline=None,
                       rules=Rules(), expected_of=lambda _t: owed)
    assert judged.verdict == "inconclusive", judged.reason
    assert "nvbandwidth/host_to_device_memcpy_ce_cells measured 5 cells where its peers " \
        "measured 6" in judged.reason
    assert judge_run([full], peers_of=lambda m, _t: peers[m.key], baseline=None,
                     rules=Rules(), expected_of=lambda _t: owed).verdict == "pass"


def test_dcgm_results_fewer_than_the_same_tests_peers_are_never_a_pass():
    """39 of 40 DCGM results (one GPU's test skipped) passed within the 2.5% margin; 15 of 16
    failed (a drain for a skip). A count is owed exactly: inconclusive either way."""
    for n in (5, 2):
        peers = [float(n * 8)] * 8
        skipped = parse("dcgm_diag", standin.dcgm_diag(
            {f"T{k}": ["Pass"] * 8 for k in range(n - 1)} | {"Last": ["Pass"] * 7 + ["Skip"]}))
        judged = judge_run([skipped], peers_of=lambda _m, _t, p=peers: p, baseline=None,
                           rules=Rules())
        assert judged.verdict == "inconclusive", (n, judged.reason)
