"""Qualification plug-ins against real outputs from other sites, versions and GPUs
(tests/fixtures/qualify/captures, each file's source in SOURCE.txt): a Fail stays a Fail, a run
that stopped or was cut short is inconclusive, never a pass."""

from __future__ import annotations

from pathlib import Path

from rsc_health.qualify import parse

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qualify" / "captures"


def _read(name: str) -> str:
    return (CAPTURES / name).read_text()


def test_every_capture_is_named_with_its_source():
    listed = (CAPTURES / "SOURCE.txt").read_text()
    files = sorted(p.name for p in CAPTURES.iterdir() if p.name != "SOURCE.txt")
    assert files and all(f"\n{name}\n" in listed for name in files)
    assert listed.count("https://github.com/") >= len(files)


def test_a_healthy_two_host_nccl_run_passes_with_its_largest_size_and_ranks_per_host():
    out = parse("nccl_tests", _read("nccl_all_reduce_perf-16rank-2node-h100.log"))
    assert out.failed is None and out.inconclusive is None
    assert [(m.name, m.value) for m in out.metrics] == [
        ("nccl-bw/allreduce_8589934592_busbw", 337.35)]
    assert out.devices == 8  # 16 ranks, 8 on each host


def test_an_nccl_run_whose_ranks_stopped_with_test_nccl_failure_is_inconclusive():
    """nccl-tests#322: the rows up to 16 GiB, then `Test NCCL failure ... unhandled cuda
    error` on every host: the largest row read (16 GiB, 367 GB/s) was taken as the result and
    the run passed."""
    text = _read("nccl_all_reduce_perf-17G-test-nccl-failure.log")
    out = parse("nccl_tests", text)
    assert out.metrics == [] and out.failed is None
    assert out.inconclusive.startswith("the run stopped: Test NCCL failure common.cu:1204")


def test_an_nccl_run_cut_before_its_summary_line_is_inconclusive():
    """The same run with the failure lines gone (a log cut there, a rank killed): its last
    row is not the run's last size, and no `Out of bounds values` line says it checked."""
    text = _read("nccl_all_reduce_perf-17G-test-nccl-failure.log")
    rows = text[:text.index("HCA-128:")]
    out = parse("nccl_tests", rows)
    assert out.metrics == [] and out.failed is None and "never reached" in out.inconclusive
    whole = _read("nccl_all_reduce_perf-16rank-2node-h100.log")
    cut = whole[:whole.index("# Out of bounds")]
    assert parse("nccl_tests", cut).inconclusive and not parse("nccl_tests", cut).metrics


def test_gpu_burn_faulty_gpus_with_warnings_fail():
    out = parse("gpu_burn", _read("gpu_burn-16gpu-faulty.log"))
    assert out.failed == ("GPU " + ", ".join(str(i) for i in range(16))
                          + " computed wrong results")
    assert out.metrics == []


def test_gpu_burn_ok_with_no_progress_line_is_inconclusive():
    out = parse("gpu_burn", _read("gpu_burn-a2000-no-progress-ok.log"))
    assert "GPU 0: OK" in _read("gpu_burn-a2000-no-progress-ok.log")
    assert out.metrics == [] and out.failed is None and out.inconclusive


def test_gpu_burn_with_no_clients_alive_is_inconclusive():
    out = parse("gpu_burn", _read("gpu_burn-k80-no-clients-alive.log"))
    assert out.metrics == [] and out.failed is None and out.inconclusive


def test_a_gpu_whose_burn_process_died_at_init_is_inconclusive_though_gpu_burn_says_faulty():
    """gpu-burn#52: GPU 0's process died at init ("load module"); gpu-burn adds the error
    count it never read from the dead pipe (1641686072, -1903218736 ...) and marks the GPU
    FAULTY (gpu_burn-drv.cpp: `clientErrors.at(i) += errors` after a failed read, any count
    sets clientFaulty). The issue's quote stops before the end; the end is what gpu-burn
    prints for that run (GPU 0 FAULTY, the others OK), and the parser failed the node as if
    GPU 0 had computed wrong results."""
    text = _read("gpu_burn-k80-load-module-died.log")
    assert parse("gpu_burn", text).inconclusive  # as quoted: no verdict
    ended = text + ("\n100.0%  proc'd: -1 (0 Gflop/s) - 0 (0 Gflop/s) - 0 (0 Gflop/s) - 0 "
                    "(0 Gflop/s)   errors: 797249520  (DIED!)- 0 - 0 - 0   temps: 33 C - 29 C "
                    "- 37 C - 31 C \nKilling processes.. done\n\nTested 4 GPUs:\n"
                    "\tGPU 0: FAULTY\n\tGPU 1: OK\n\tGPU 2: OK\n\tGPU 3: OK\n")
    out = parse("gpu_burn", ended)
    assert out.failed is None and out.metrics == []
    assert out.inconclusive.startswith("GPU 0: its burn process died")
    # A GPU that showed wrong results while alive still fails, died or not later.
    warned = ended.replace("errors: 1641686072  (DIED!)", "errors: 12  (WARNING!)", 1)
    assert parse("gpu_burn", warned).failed == "GPU 0 computed wrong results"


def test_perftest_table_cut_mid_way_is_inconclusive_not_its_last_row():
    """perftest#132's `-a --report_gbits` table, ending in the 16 B row: the 8 B row was
    taken as the result (0.02 GB/s, `ib_write_8_..._bw`), a pass when nothing was judged."""
    out = parse("perftest", _read("ib_write_bw-all-gbits-cut-mid-table.log"))
    assert out.metrics == [] and out.failed is None
    assert out.inconclusive.startswith("result table never closed")


def test_perftest_completion_error_after_rows_is_inconclusive():
    """perftest#173's completion error (`Failed status 4 ... syndrom 0x51`, `Failed to
    complete run_iter_bw function successfully`) after the rows of a -a run: the rows before
    it passed as the run's result."""
    table = _read("ib_write_bw-all-gbits-cut-mid-table.log").splitlines(keepends=True)[:-1]
    text = "".join(table) + _read("ib_write_bw-completion-error-a100-gdr.txt")
    out = parse("perftest", text)
    assert out.metrics == [] and out.failed is None
    assert out.inconclusive == "the run stopped: Completion with error at client"


GB10 = "dcgm_diag-r1-dcgm4.2.3-gb10-persistence-mode.json"


def test_a_dcgm_fail_for_persistence_mode_off_is_a_node_setting_not_the_hardware():
    """`dcgmi diag -r 1 -j` on a healthy GB10 (DCGM 4.2.3): `software` Fail, its one finding
    error_id 29 (DCGM_FR_PERSISTENCE_MODE, `nvidia-smi -pm 1` fixes it). It was the
    hardware's fault: a node sent to repair for a setting."""
    out = parse("dcgm_diag", _read(GB10))
    assert out.failed is None and out.metrics == []
    assert out.inconclusive.startswith("software GPU0: a node setting, not the hardware: "
                                       "Persistence Mode: Persistence mode for GPU 0 is disabled")


def test_a_hardware_dcgm_fail_is_never_hidden_by_a_result_that_proved_nothing_before_it():
    """The GB10 document with a second GPU's memory test failing on a double-bit error (a
    result added here in DCGM 4's shape): the first result read, a setting or an allocation
    error, made the whole run inconclusive and the DBE was never said."""
    import json

    doc = json.loads(_read(GB10))
    tests = doc["DCGM Diagnostic"]["test_categories"][0]["tests"]
    tests.append({"name": "memory", "results": [
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Fail",
         "warnings": [{"error_category": 1, "error_id": 4, "error_severity": 2,
                       "warning": "Detected 1 volatile double-bit ECC error(s) in GPU 1."}]}],
        "test_summary": {"status": "Fail"}})
    out = parse("dcgm_diag", json.dumps(doc))
    assert out.failed == "memory GPU1: Detected 1 volatile double-bit ECC error(s) in GPU 1."
    first = tests[0]["results"][0]["warnings"][0]
    first.update(error_id=1, warning="Unable to allocate 80 GB on GPU 0")
    assert parse("dcgm_diag", json.dumps(doc)).failed.startswith("memory GPU1: Detected 1")
    # An error_id that is not a setting's is the hardware's, whatever its words.
    first.update(error_id=4, warning="Persistence mode for GPU 0 is disabled.")
    assert parse("dcgm_diag", json.dumps(doc)).failed.startswith("software GPU0: ")


# DCGM_FR_VOLATILE_DBE_DETECTED (4) and the allocation the broken GPU then failed,
# DCGM_FR_MEMORY_ALLOC (56): each error_id's message as dcgm_errors.h words it.
DBE = (4, "Detected 2 volatile double-bit ECC error(s) in GPU 1.")
ALLOC = (56, "Couldn't allocate at least 80.0% of GPU memory on GPU 1")


def _gb10_with_memory_result(status: str, warnings) -> str:
    """The GB10 capture (DCGM 4.2.3) with its persistence-mode warning taken away and a second
    GPU's memory test added, in the document's own shape."""
    import json

    doc = json.loads(_read(GB10))
    tests = doc["DCGM Diagnostic"]["test_categories"][0]["tests"]
    tests[0]["results"][0].update(status="Pass", warnings=[])
    tests[0]["test_summary"]["status"] = "Pass"
    tests.append({"name": "memory", "results": [
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": status,
         "warnings": [{"error_category": 10, "error_id": i, "error_severity": 6,
                       "warning": w} for i, w in warnings]}],
        "test_summary": {"status": status}})
    return json.dumps(doc)


def _dcgm2_memory_failed_with(*warnings: str) -> str:
    """The real DCGM 2.x `dcgmi diag -r 2 -j` (tests/fixtures/dcgm) with its GPU Memory result
    failed on warnings as 2.x prints them: a text, no error_id."""
    import json

    doc = json.loads((CAPTURES.parents[1] / "dcgm" / "diag-r2-dcgm2.json").read_text())
    memory = doc["DCGM GPU Diagnostic"]["test_categories"][2]["tests"][0]["results"][0]
    memory.update(status="Fail", warnings=[{"warning": w} for w in warnings])
    return json.dumps(doc)


def test_a_dcgm_double_bit_error_fails_qualification_though_an_allocation_failed_beside_it():
    """helper-112: one warning that read as "could not run" (the allocation the broken GPU
    failed) made the whole result untested, so the run was inconclusive and the GPU with a
    double-bit ECC error was retried, never sent to repair. The Fail stands, whichever warning
    DCGM lists first, in DCGM 4's shape (error_ids) and 2.x's (texts alone)."""
    for warnings in ([DBE, ALLOC], [ALLOC, DBE]):
        out = parse("dcgm_diag", _gb10_with_memory_result("Fail", warnings))
        assert out.failed == f"memory GPU1: {DBE[1]}", (warnings, out)
    out = parse("dcgm_diag", _dcgm2_memory_failed_with(ALLOC[1], DBE[1]))
    assert out.failed == f"GPU Memory GPU0: {DBE[1]}"
    # An XID (DCGM_FR_XID_ERROR, 101) is the hardware's even when its words say "timed out".
    xid = (101, "Detected XID 79 for GPU 1: the GPU fell off the bus and timed out")
    assert parse("dcgm_diag", _gb10_with_memory_result("Fail", [xid])).failed
    # Only what could not run, nothing else said: still inconclusive, never a pass or a fail.
    timeout = (44, "There was an internal error during the test: 'timed out waiting'")
    out = parse("dcgm_diag", _gb10_with_memory_result("Fail", [ALLOC, timeout]))
    assert out.failed is None and out.inconclusive.startswith("memory GPU1: Couldn't allocate")
    out = parse("dcgm_diag", _dcgm2_memory_failed_with(ALLOC[1]))
    assert out.failed is None and "allocate" in out.inconclusive
    # A Pass that says it could not allocate proved nothing, whatever else it says.
    out = parse("dcgm_diag", _gb10_with_memory_result("Pass", [DBE, ALLOC]))
    assert out.failed is None and out.inconclusive and out.metrics == []


def test_dcgm_3_gpu_id_results_name_their_gpu():
    """NVIDIA/DCGM#139 (DCGM 3.x, `dcgmi diag -r 3 -j`): each result names its GPU as
    "gpu_id" (not 2.x's "gpu_ids"); every test skipped. The quoted document's first category
    is elided by its author (`{"..."}`), left out here."""
    from rsc_health.qualify.dcgm_diag import results

    doc = {"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Integration", "tests": [
            {"name": "PCIe", "results": [{"gpu_id": "0", "status": "Skip"}]}]},
        {"category": "Hardware", "tests": [
            {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Skip"}]},
            {"name": "Diagnostic", "results": [{"gpu_id": "0", "status": "Skip"}]},
            {"name": "EUD Test", "results": [{"gpu_id": "0", "status": "Skip"}]}]}]}}
    assert {r.entity for r in results(doc)} == {"GPU0"}
    import json

    out = parse("dcgm_diag", json.dumps(doc))
    assert out.inconclusive == "every test skipped or none listed" and not out.failed


def test_nvbandwidth_pattern_mismatch_on_its_stdout_fails_the_node():
    """NVIDIA/nvbandwidth#34 (v0.7, 8x A100): the verifying kernel prints `Invalid value when
    checking the pattern` on stdout, and the ASSERT came with it (one stream, as srun or a
    wrapper's 2>&1 gives). Read only from stderr, it was `no testcase ran`: a node whose
    copies corrupt data retried for ever."""
    text = _read("nvbandwidth-v0.7-a100-pattern-mismatch.log")
    out = parse("nvbandwidth", text)
    assert out.failed == "copy verification: data copied did not match the pattern written"
    assert out.metrics == []
    stdout_only = text[:text.index("ASSERT in")]  # the kernel's own words suffice
    assert parse("nvbandwidth", stdout_only).failed == out.failed
    from rsc_health.qualify.nvbandwidth import fault

    assert fault(text[text.index("ASSERT in"):]) == out.failed  # stderr alone, as before


def test_nvbandwidth_output_cut_inside_a_matrix_is_inconclusive():
    """NVIDIA/nvbandwidth#15 (v0.2, 8x RTX 4090, a core dump): the output stops inside the
    bidirectional matrix (`0  11.24  14.42  16.`): three cells of eight were kept as that
    testcase's per-GPU metrics and the run passed."""
    out = parse("nvbandwidth", _read("nvbandwidth-v0.2-rtx4090-cut.log"))
    assert out.metrics == [] and out.failed is None
    assert out.inconclusive == ("host_to_device_bidirectional_memcpy_ce: no SUM line after "
                                "its matrix (cut short?)")


def test_nvbandwidth_v0_2_waiving_its_only_testcase_is_inconclusive():
    """NVIDIA/nvbandwidth#13 (v0.2, 2x RTX 2080 Ti): `Waiving <testcase>.` (v0.6 prints
    `Waived:` without the name), nothing measured."""
    out = parse("nvbandwidth", _read("nvbandwidth-v0.2-rtx2080ti-waived.log"))
    assert out.metrics == [] and out.failed is None and out.inconclusive


def test_nccl_runs_where_every_process_is_rank_0_are_one_rank_runs_not_a_zero_bandwidth():
    """nccl-tests#107: nccl-tests built without MPI=1 and started by mpirun on two hosts: two
    runs of one rank each, both `Rank 0`, printed into one output. Two rank lines were read as
    two ranks, and a one-rank run's busbw (0 by definition) as the node's bandwidth. The
    issue's quote ends before its rows; the rows here are the one-rank H200 capture's, printed
    by each process as the two hosts' runs would be."""
    head = _read("nccl_all_reduce_perf-two-rank0-no-mpi-head.log")
    assert parse("nccl_tests", head).inconclusive and not parse("nccl_tests", head).metrics
    one = (CAPTURES.parents[1] / "real" / "h200-vm-2026-11-26"
           / "nccl_all_reduce_perf-1gpu.log").read_text()
    lines = [line for line in head.splitlines() if "Rank  0" in line]
    two = "".join(one.replace(one.splitlines()[5], rank) for rank in lines)
    assert two.count("#   Rank  0 ") == 2
    out = parse("nccl_tests", two)
    assert out.metrics == [] and out.failed is None
    assert out.inconclusive.startswith("one rank in each of 2 separate runs")


PERFTEST_RULE = "-" * 87 + "\n"


def test_perftest_post_list_write_run_is_read_as_a_write():
    out = parse("perftest", _read("ib_write_bw-post-list-gbits-roce.log"))
    assert [(m.name, m.value, m.index) for m in out.metrics] == [
        ("ib-loopback/ib_write_8_ib0_bw", 0.48 / 8, "ib0")]


def test_ib_send_bw_is_named_a_send_not_a_write():
    """perftest#82: ib_send_bw's title is `Send BW Test`, without the RDMA_ the parser looked
    for: every send run was named `ib_write_...` and judged against write peers and the
    write baseline. The quote ends before the table; the table here is perftest#273's."""
    head = _read("ib_send_bw-head-roce-bond.log")
    table = _read("ib_write_bw-post-list-gbits-roce.log").split(PERFTEST_RULE, 1)[1]
    out = parse("perftest", head + table)
    assert [m.name for m in out.metrics] == ["ib-loopback/ib_send_8_mlx5_bond_0_bw"]
    # -b measures both directions at once (about twice one's figure): a name of its own.
    bidir = head.replace("Send BW Test", "Send Bidirectional BW Test")
    assert [m.name for m in parse("perftest", bidir + table).metrics] == [
        "ib-loopback/ib_send_bidir_8_mlx5_bond_0_bw"]
    # No title: the program run names the test, else it is not known (never a write).
    assert parse("perftest", table, "/usr/bin/ib_read_bw").metrics[0].name.startswith(
        "ib-loopback/ib_read_8_")
    untitled = parse("perftest", table)
    assert untitled.metrics == [] and "not known" in untitled.inconclusive


def test_gpu_burn_ok_with_every_gpu_at_zero_gflops_is_inconclusive():
    """gpu-burn#123: CUDA_ERROR_UNKNOWN at init, 0 Gflop/s on all 8 V100s, `OK` on each: it
    computed nothing, so nothing is proved. (The quote ends after four verdicts; with all
    eight the zero throughput alone says so.)"""
    text = _read("gpu_burn-v100x8-cuda-unknown-zero-flops.log")
    assert parse("gpu_burn", text).inconclusive and not parse("gpu_burn", text).metrics
    whole = text + "".join(f"        GPU {i}: OK\n" for i in range(4, 8))
    out = parse("gpu_burn", whole)
    assert out.metrics == [] and out.failed is None
    assert out.inconclusive == "8 GPUs tested, throughput for 0"


def _summary_fail_only() -> str:
    """The GB10 document with its one result passing (no warning) while the test's own
    summary still says Fail: a failure no result places on a part."""
    import json

    doc = json.loads(_read(GB10))
    result = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]
    result.update(status="Pass", warnings=[])
    assert doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["test_summary"][
        "status"] == "Fail"
    return json.dumps(doc)


def test_a_dcgm_test_whose_summary_fails_with_no_failing_result_is_inconclusive():
    """DCGM 4 writes a per-test summary beside the per-entity results. A summary Fail that
    no result places was read past: the run passed on its passing results."""
    out = parse("dcgm_diag", _summary_fail_only())
    assert out.failed is None and out.metrics == []
    assert out.inconclusive == ("software: its summary says Fail and no result names the "
                                "part")
