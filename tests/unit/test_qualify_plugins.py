"""Qualification plug-ins read their tools' real output (tests/fixtures/qualify: SuperBench's
copies; tests/fixtures/real: an H200 capture) and the lab's stand-ins alike, and hostile output
is inconclusive, never a pass and never a crash."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rsc_health.qualify import PLUGINS, parse
from rsc_health.qualify.baseline import Baseline
from rsc_health.sim import qualify_tools as standin

FIX = Path(__file__).resolve().parents[1] / "fixtures"
TOOLS = FIX / "qualify" / "tool-outputs"
H200 = FIX / "real" / "h200-vm-2026-11-26"


def test_nccl_tests_reads_the_largest_size_bus_bandwidth_of_real_runs():
    text = (TOOLS / "nccl_allreduce.log").read_text()
    out = parse("nccl_tests", text, "all_reduce_perf")
    last = [line.split() for line in text.splitlines() if line.strip().startswith("8589934592")]
    assert [m.name for m in out.metrics] == ["nccl-bw/allreduce_8589934592_busbw"]
    assert out.metrics[0].value == min(float(last[0][6]), float(last[0][10]))  # the worse half
    # Older nccl-tests never name their test: the program run names it.
    assert parse("nccl_tests", (TOOLS / "nccl_alltoall.log").read_text(),
                 "/opt/nccl-tests/alltoall_perf").metrics[0].name.startswith("nccl-bw/alltoall_")


def test_nccl_tests_on_one_rank_is_inconclusive_not_a_zero_bandwidth_fail():
    out = parse("nccl_tests", (H200 / "nccl_all_reduce_perf-1gpu.log").read_text())
    assert out.metrics == [] and out.failed is None
    assert "one rank" in out.inconclusive


def test_nccl_wrong_results_are_the_hardwares_fault():
    out = parse("nccl_tests", standin.nccl(230.0, wrong=12))
    assert out.failed and "12 wrong" in out.failed


def _checked_before_2_13(text: str, deltas: dict[int, float], oob: str = "0 OK") -> str:
    """The real pre-2.13 run (SuperBench's copy: an `error` column, validation off) as the
    same nccl-tests prints it with validation on: the column is the largest difference from
    the expected result, `%5.0le` (cbe7f65 .. 51af557^ src/common.cu), non-zero for a healthy
    float sum, judged by the tool against its tolerance into `Out of bounds values`."""
    out = []
    for line in text.replace("validation: 0", "validation: 1").splitlines():
        tokens = line.split()
        if tokens and tokens[0].isdigit() and "N/A" in tokens:
            d = f"{deltas.get(int(tokens[0]), 0.0):5.0e}"
            line = line.replace("   N/A", f" {d}")
        out.append(line.replace("Out of bounds values : 0 OK", f"Out of bounds values : {oob}"))
    return "\n".join(out) + "\n"


def test_nccl_tests_before_2_13_print_differences_not_counts_and_a_healthy_run_passes():
    """Before 2.13 the check column is `error`, the largest difference (0e+00, 2e-07): every
    such value was read as wrong results, and a healthy node failed at every qualification.
    The tool's own verdict is its `Out of bounds values` line."""
    real = (TOOLS / "nccl_allreduce.log").read_text()
    healthy = _checked_before_2_13(real, {8589934592: 2.4e-07, 4294967296: 1.2e-07})
    assert " 2e-07" in healthy and " 0e+00" in healthy and "N/A" not in healthy
    out = parse("nccl_tests", healthy, "all_reduce_perf")
    assert out.failed is None and out.inconclusive is None
    assert [(m.name, m.value) for m in out.metrics] == [
        ("nccl-bw/allreduce_8589934592_busbw", 235.03)]
    bad = parse("nccl_tests", _checked_before_2_13(real, {8589934592: 3e-01}, "4 FAILED"))
    assert bad.failed == "out of bounds values: 4 FAILED"
    cut = healthy[:healthy.index("# Out of bounds")]  # the verdict never came
    assert parse("nccl_tests", cut).inconclusive and not parse("nccl_tests", cut).metrics


@pytest.mark.parametrize("per_iter,timestamps", [(True, False), (False, True), (True, True)],
                         ids=["-I1", "-S1", "-I1-S1"])
def test_nccl_tests_2_19_per_iteration_and_timestamp_columns_are_read_by_the_header(
        per_iter, timestamps):
    """nccl-tests 2.19's -I 1 adds i_min, i_max, i_p99 and i_cv% to each half of a row, -S 1 a
    date and time at its end: the eight last columns are no longer time, algbw, busbw and
    #wrong, and a healthy run failed (an i_cv% or a clock time read as wrong results)."""
    text = standin.nccl(231.0, per_iter=per_iter, timestamps=timestamps)
    out = parse("nccl_tests", text)
    assert out.failed is None and out.inconclusive is None
    assert [(m.name, m.value) for m in out.metrics] == [
        ("nccl-bw/allreduce_8589934592_busbw", 231.0)]
    wrong = parse("nccl_tests", standin.nccl(231.0, wrong=5, per_iter=per_iter,
                                              timestamps=timestamps))
    assert wrong.failed == "8589934592 B: 5 wrong results"


def test_gpu_burn_reads_each_gpus_throughput_and_faulty_gpus_fail():
    real = parse("gpu_burn", (TOOLS / "gpu_burn.log").read_text())
    assert [m.index for m in real.metrics] == [str(i) for i in range(8)]
    assert {m.name for m in real.metrics} == {"gpu-burn/fp64_tc_flops"}
    last = [line for line in (TOOLS / "gpu_burn.log").read_text().splitlines()
            if line.startswith("100.0%")][-1]
    expected = [float(g) for g in re.findall(r"\(([\d.]+) Gflop/s\)", last)]
    assert [m.value for m in real.metrics] == expected
    h200 = parse("gpu_burn", (H200 / "gpu_burn-h200-20s.log").read_text())
    assert h200.metrics[0].name == "gpu-burn/fp64_flops" and h200.metrics[0].value > 50_000
    assert parse("gpu_burn", standin.gpu_burn([17000, 16900, 17010], faulty=[2])).failed == \
        "GPU 2 computed wrong results"


def _died(text: str, gpu: int) -> str:
    """gpu-burn's output once GPU `gpu`'s burn process died at 100%: its count printed as -1
    with the Gflop/s of its last report kept, `(DIED!)` by its errors (gpu_burn-drv.cpp:
    `processed = -1` on a short read, `note += " (DIED!)"`), and still `GPU N: OK` at the end."""
    def one(m: re.Match) -> str:
        done = m.group(2).split(" - ")
        done[gpu] = re.sub(r"^\d+", "-1", done[gpu])
        errors = m.group(3).split(" - ")
        errors[gpu] = "0  (DIED!)"
        return f"{m.group(1)}proc'd: {' - '.join(done)}   errors: {' - '.join(errors)}   temps:"
    return re.sub(r"(100\.0%  )proc'd: (.*?)   errors: (.*?)   temps:", one, text)


def test_a_gpu_whose_burn_process_died_is_inconclusive_though_gpu_burn_calls_it_ok():
    """gpu-burn keeps a dead GPU's last Gflop/s and ends with `GPU 3: OK`: its figures were
    judged as a full burn's and the node passed with a GPU that stopped computing."""
    text = _died((TOOLS / "gpu_burn.log").read_text(), 3)
    assert "GPU 3: OK" in text and "-1 (16926 Gflop/s)" in text and "(DIED!)" in text
    out = parse("gpu_burn", text)
    assert out.metrics == [] and out.failed is None
    assert out.inconclusive.startswith("GPU 3: its burn process died")


def test_perftest_bandwidth_lines_up_with_the_superbench_fleet_baseline():
    out = parse("perftest", (TOOLS / "ib_loopback_8M_size.log").read_text())
    [metric] = out.metrics
    assert metric.name == "ib-loopback/ib_write_8388608_ib0_bw" and metric.scope == "hca"
    base = Baseline.load(FIX / "qualify" / "fleet-baseline" / "ndv4-a100-baseline.json")
    # The same unit as SuperBench's fleet: within 3% of 1,939 nodes' mean for that HCA.
    assert abs(metric.value / base.get(metric) - 1) < 0.03
    # An HCA name the baseline lacks gets the mean over the HCAs it has.
    renamed = parse("perftest", standin.perftest(23.7, device="mlx5_4")).metrics[0]
    assert 23 < base.get(renamed) < 24.5


@pytest.mark.parametrize("text", ["[" * 50_000, '{"a": 1', "[1, 2]"],
                         ids=["nested-too-deep", "cut-short", "not-an-object"])
def test_a_baseline_that_cannot_be_read_is_the_valueerror_qualify_names(tmp_path, text):
    """`healthctl qualify` turns a ValueError into one line naming [qualify] baseline; one
    nested too deep raised RecursionError past it (healthctl: error: RecursionError)."""
    path = tmp_path / "baseline.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        Baseline.load(path)


def test_nvbandwidth_keeps_each_gpu_column_and_latency_is_lower_is_better():
    out = parse("nvbandwidth", (TOOLS / "nvbandwidth_results.log").read_text())
    h2d = {m.index: m.value for m in out.metrics
           if m.name == "nvbandwidth/host_to_device_memcpy_ce"}
    assert h2d == {"0": 323.36, "1": 269.33, "2": 312.11}  # each GPU's slowest path
    [lat] = [m for m in out.metrics if "latency" in m.name and not m.exact]
    assert lat.unit == "ns" and lat.higher_is_better is False


def test_bandwidth_test_takes_the_largest_transfer_and_needs_a_pass_line():
    out = parse("bandwidth_test", (TOOLS / "cuda_memory_d2d_bw.log").read_text())
    assert [(m.name, m.value) for m in out.metrics] == [("mem-bw/d2d_bw", 762.8)]
    cut = "\n".join((TOOLS / "cuda_memory_h2d_bw.log").read_text().splitlines()[:20])
    assert parse("bandwidth_test", cut).inconclusive
    assert parse("bandwidth_test", standin.bandwidth_test("H2D", 55.0, passed=False)).failed


def test_dcgm_diag_fail_fails_and_an_allocation_error_is_never_a_pass():
    fail = parse("dcgm_diag", standin.dcgm_diag({"Memory": ["Pass", "Fail"]},
                                                warnings={"Memory": "DBE detected"}))
    assert fail.failed == "Memory GPU1: DBE detected"
    alloc = parse("dcgm_diag", standin.dcgm_diag(
        {"Memory": ["Pass", "Pass"]}, warnings={"Memory": "Unable to allocate 80 GB on GPU 0"}))
    assert alloc.failed is None and alloc.metrics == [] and "allocate" in alloc.inconclusive
    busy = parse("dcgm_diag", standin.dcgm_diag({"Targeted Stress": ["Fail"]}, warnings={
        "Targeted Stress": "The GPU is being used by another process"}))
    assert busy.failed is None and busy.inconclusive
    assert parse("dcgm_diag", standin.dcgm_diag({"Memory": ["Skip", "Skip"]})).inconclusive
    assert parse("dcgm_diag", standin.dcgm_diag({}, runtime_error="host engine not running")
                 ).inconclusive.startswith("runtime error")


@pytest.mark.parametrize("test", sorted(PLUGINS))
@pytest.mark.parametrize("text", [
    "", "\x00\xff" * 100, "garbage\n" * 1000, "9" * 100_000, "[" * 50_000,
    "       8    2   float   sum   -1   5.0   nan   -1.0   0   5.0   1.0   inf   0\n",
    "100.0%  proc'd: 1 (-5 Gflop/s)   errors: 0   temps: 1 C\n\tGPU 0: OK\n",
    '{"DCGM Diagnostic": {"test_categories": "x"}}', "[]", "null",
])
def test_hostile_output_is_inconclusive_never_a_pass_or_a_crash(test, text):
    out = parse(test, text)
    assert out.metrics == [] and out.inconclusive and out.failed is None


def test_every_plugin_names_its_tool_and_parses_a_stand_in():
    made = {"nccl_tests": standin.nccl(231.0), "gpu_burn": standin.gpu_burn([16950.0]),
            "perftest": standin.perftest(24.0), "nvbandwidth": (TOOLS / "nvbandwidth_results.log"
                                                                ).read_text(),
            "bandwidth_test": standin.bandwidth_test("D2H", 55.0),
            "dcgm_diag": standin.dcgm_diag({"Memory": ["Pass"]})}
    assert set(made) == set(PLUGINS), "a new plug-in needs a stand-in here"
    for name, plugin in PLUGINS.items():
        assert plugin.NAME == name and plugin.TOOL
        out = parse(name, made[name])
        assert out.metrics and not out.failed and not out.inconclusive, name
        json.dumps([m.__dict__ for m in out.metrics])


def test_nvbandwidth_data_that_came_back_wrong_fails_the_node(tmp_path):
    """nvbandwidth checks every copy against the pattern written (memcpy.cpp memcmpPattern);
    a mismatch is `ASSERT(h_errorFlag == 0)`: the message on stderr, exit 1. The exit code
    made it inconclusive, so a node whose copies corrupt data was retried for ever, never
    failed nor sent to repair. Another ASSERT or a CUDA error stays inconclusive."""
    import sys

    from rsc_health.qualify.runner import TestSpec, run_test

    real = (TOOLS / "nvbandwidth_results.log").read_text()
    head = real[:real.index("Running device_to_host_memcpy_ce.")] + \
        "Running device_to_host_memcpy_ce.\n"

    def tool(name, err):
        (tmp_path / f"{name}.out").write_text(head)
        script = tmp_path / name
        script.write_text(f"#!{sys.executable}\nimport sys\n"
                          f"sys.stdout.write(open({str(tmp_path / (name + '.out'))!r}).read())\n"
                          f"sys.stdout.flush()\nsys.stderr.write({err!r})\nsys.exit(1)\n")
        script.chmod(0o755)
        return TestSpec(name, "nvbandwidth", (str(script),), 30.0)

    corrupt = run_test(tool("nvb_corrupt", "ASSERT in expression h_errorFlag == 0 in void "
                            "memcmpPatternHelper(CUstream, CUdeviceptr, unsigned long long, "
                            "unsigned int, CompareKernelFunc, std::shared_ptr<NodeHelper>)() : "
                            "/src/nvbandwidth/memcpy.cpp:165\n"))
    assert corrupt.failed and "did not match" in corrupt.failed and not corrupt.metrics
    cuda = run_test(tool("nvb_cuda", "[CUDA_ERROR_OUT_OF_MEMORY] out of memory in expression "
                         "cuMemAlloc(&d_pattern, sizeof(char) * _2MiB) in void "
                         "memcmpPatternHelper(...)() : /src/nvbandwidth/memcpy.cpp:149\n"))
    assert cuda.failed is None and cuda.inconclusive.startswith("exit 1")
