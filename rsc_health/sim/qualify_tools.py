"""Stand-ins for the tools a qualification tier runs, for the lab (tests, benchmarks, the
simulator): each prints its tool's real output format (as in ../shared/data/qualify/tool-outputs
and tests/fixtures/real/) with the values it is given, so the product's parsers read them exactly
as they read the real tools. Never imported by the product.

    python3 -m rsc_health.sim.qualify_tools nccl --busbw 231.5 --ranks 8
    python3 -m rsc_health.sim.qualify_tools gpu_burn --gflops 16950 16890 --faulty 1
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def nccl(busbw: float, *, ranks: int = 8, op: str = "all_reduce_perf", wrong: int = 0,
         max_bytes: int = 8589934592, hosts: Sequence[str] = ("node01",),
         per_iter: bool = False, timestamps: bool = False) -> str:
    """nccl-tests 2.19 layout (root column, #wrong), sizes 8 B .. max_bytes by 2x; bus bandwidth
    ramps to `busbw` at the largest size as the real curve does. The ranks are spread over
    `hosts` in blocks, as mpirun places them. `per_iter` (-I 1): each half also prints i_min,
    i_max, i_p99 and i_cv%; `timestamps` (-S 1): each row ends with the time it was printed
    (util.cu's writeResultHeader, writePerIterReport, writeTimestamp)."""
    lines = ["# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809",
             f"# Collective test starting: {op}",
             f"# nThread 1 nGpus {ranks} minBytes 8 maxBytes {max_bytes} step: 2(factor) "
             "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0", "#"]
    if per_iter:
        lines.append("# Per-Iteration Report: CUDA event timing; i_* uses max over process rows")
    lines.append("# Using devices")
    lines += [f"#  Rank {r:2d} Group  0 Pid   1000 on {hosts[r * len(hosts) // ranks]:>10s} device "
              f"{r % max(1, ranks // len(hosts)):2d} [0000:{r:02x}:00] NVIDIA H100 80GB HBM3"
              for r in range(ranks)]
    half = ["time", "algbw", "busbw", "#wrong"] + (["i_min", "i_max", "i_p99", "i_cv%"]
                                                   if per_iter else [])
    widths = [7, 6, 6, 6] + ([7, 7, 7, 7] if per_iter else [])
    head = f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}"
    head += "".join(f"  {n:>{w}s}" for n, w in zip(half + half, widths + widths, strict=True))
    lines += ["#", head + (f" {'timestamp':>19s}" if timestamps else "")]
    factor = 2 * (ranks - 1) / ranks if ranks > 1 else 0.0
    size = 8
    while size <= max_bytes:
        share = size / max_bytes
        bus = busbw * min(1.0, share ** 0.08) if ranks > 1 else 0.0
        alg = bus / factor if factor else size / 5e-6 / 1e9
        t = size / (alg * 1e3) if alg else 5.0
        bad = wrong if size == max_bytes else 0
        row = f"{size:>12d}  {size // 4:>12d}  {'float':>8s}  {'sum':>6s}  {-1:>6d}"
        for _ in range(2):
            row += f"  {t:>7.2f}  {alg:>6.2f}  {bus:>6.2f}  {bad:>6g}"
            if per_iter:
                row += f"  {t * 0.97:>7.2f}  {t * 1.2:>7.2f}  {t * 1.1:>7.2f}  {1.8:>7.2f}"
        lines.append(row + (f"{'2026-11-26 13:24:51':>21s}" if timestamps else ""))
        size *= 2
    lines += [f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}",
              f"# Avg bus bandwidth    : {busbw / 3:.4f}", "#",
              f"# Collective test concluded: {op}", "#"]
    return "\n".join(lines) + "\n"


def gpu_burn(gflops: Sequence[float], *, faulty: Sequence[int] = (), tensor: bool = True) -> str:
    n = len(gflops)
    progress = " - ".join(f"4522 ({g:.0f} Gflop/s)" for g in gflops)
    errors = " - ".join("7" if i in faulty else "0" for i in range(n))
    temps = " - ".join("59 C" for _ in range(n))
    lines = [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-{i:012d})"
             for i in range(n)]
    lines += [f"100.0%  proc'd: {progress}   errors: {errors}   temps: {temps} ",
              "\tSummary at:   Thu Mar 10 19:21:22 UTC 2022", "", "Killing processes.."]
    mode = "using DOUBLES" + (", using Tensor Cores" if tensor else "")
    for i in range(n):
        lines += [f"Initialized device {i} with 81251 MB of memory (80493 MB available, using "
                  f"72443 MB of it), {mode}", "Results are 33554432 bytes each, thus performing "
                  "2261 iterations", f"Freed memory for dev {i}", "Uninitted cublas"]
    lines += ["done", "", f"Tested {n} GPUs:"]
    lines += [f"\tGPU {i}: {'FAULTY' if i in faulty else 'OK'}" for i in range(n)]
    return "\n".join(lines) + "\n"


def perftest(bw_gbps: float, *, device: str = "mlx5_0", size: int = 8388608) -> str:
    mb = bw_gbps * 1000.0
    rule = "-" * 87
    return "\n".join([
        rule, "                    RDMA_Write BW Test",
        f" Dual-port       : OFF\t\tDevice         : {device}",
        " Number of qps   : 1\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " Mtu             : 4096[B]", " Link type       : IB", rule,
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]",
        f" {size:<10d} 20000          {mb * 1.0001:.2f}            {mb:.2f}\t\t   0.003007",
        rule, ""])


def bandwidth_test(kind: str, gbps: float, *, passed: bool = True) -> str:
    mem = "" if kind == "D2D" else "-Pinned"
    lines = ["[CUDA Bandwidth Test] - Starting...", "Running on...", "",
             " Device 0: NVIDIA H100 80GB HBM3", " Shmoo Mode", "", "." * 81]
    for size in (1_000_000, 16_000_000, 64_000_000):
        lines.append(f"bandwidthTest-{kind}{mem}, Bandwidth = {gbps:.1f} GB/s, Time = "
                     f"{size / gbps / 1e9:.5f} s, Size = {size} bytes, NumDevsUsed = 1")
    lines.append(f"Result = {'PASS' if passed else 'FAIL'}")
    return "\n".join(lines) + "\n"


def dcgm_diag(statuses: dict[str, Sequence[str]], *,
              warnings: dict[str, str | Sequence[tuple[int, str]]] | None = None,
              runtime_error: str = "") -> str:
    """`dcgmi diag -j` to DCGM's schema: {test name: per-GPU status}, warnings by test: a
    text (error_id 1, DCGM_FR_UNKNOWN: the stand-in names no DCGM error) or a list of
    (dcgm_errors.h error_id, text)."""
    warnings = warnings or {}
    tests = []
    for name, per_gpu in statuses.items():
        results = []
        for gpu, status in enumerate(per_gpu):
            r = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": status}
            if name in warnings:
                said = warnings[name]
                listed = [(1, said)] if isinstance(said, str) else list(said)
                r["warnings"] = [{"error_category": 0, "error_id": error_id,
                                  "error_severity": 3, "warning": text}
                                 for error_id, text in listed]
            results.append(r)
        summary = "Fail" if "Fail" in per_gpu else ("Skip" if set(per_gpu) == {"Skip"} else "Pass")
        tests.append({"name": name, "results": results, "test_summary": {"status": summary}})
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]},
           "metadata": {"version": "4.2.3", "Driver Version Detected": "570.124.06"}}
    if runtime_error:
        doc["DCGM Diagnostic"]["runtime_error"] = runtime_error
    return json.dumps(doc, indent=2) + "\n"


def dcgm_health(incidents: list[tuple[str, int, str, str, str]] | None = None) -> str:
    """`dcgmi health -c -j` as DCGM writes it (dcgmi/Health.cpp through DcgmiOutputJson):
    incidents are (entity group "GPU"/"Switch", id, system "Memory system", health
    "Warning"/"Failure", message)."""
    rank = {"Healthy": 0, "Warning": 1, "Failure": 2}
    body: dict = {"Overall Health": {"value": "Healthy"}}
    overall = "Healthy"
    for group, ident, system, health, message in incidents or []:
        entity = body.setdefault(group, {"children": {}})["children"].setdefault(
            str(ident), {"children": {"Errors": {"children": {}}}, "value": "Healthy"})
        entity["children"]["Errors"]["children"][system] = {"value": health,
                                                            "overflow": [message]}
        if rank[health] > rank[entity["value"]]:
            entity["value"] = health
        if rank[health] > rank[overall]:
            overall = health
    body["Overall Health"]["value"] = overall
    return json.dumps({"body": body, "header": ["Health Monitor Report"]}, indent=3) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="qualify_tools")
    sub = ap.add_subparsers(dest="tool", required=True)
    p = sub.add_parser("nccl")
    p.add_argument("--busbw", type=float, required=True)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--wrong", type=int, default=0)
    p = sub.add_parser("gpu_burn")
    p.add_argument("--gflops", type=float, nargs="+", required=True)
    p.add_argument("--faulty", type=int, nargs="*", default=[])
    p = sub.add_parser("perftest")
    p.add_argument("--bw", type=float, required=True)
    p.add_argument("--device", default="mlx5_0")
    args = ap.parse_args(argv)
    if args.tool == "nccl":
        sys.stdout.write(nccl(args.busbw, ranks=args.ranks, wrong=args.wrong))
    elif args.tool == "gpu_burn":
        sys.stdout.write(gpu_burn(args.gflops, faulty=args.faulty))
    else:
        sys.stdout.write(perftest(args.bw, device=args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --- a fleet of healthy and degraded nodes with real spreads (bench_qualify, tests) ----------

def real_spreads(fixtures) -> dict[str, list[float]]:
    """Healthy relative deviations from the median, per metric source, read from real outputs
    (tests/fixtures/qualify: SuperBench's; tests/fixtures/real: the H200 capture) through the
    product's own parsers. Each list is what one real population of healthy devices or runs
    looked like."""
    import statistics

    from rsc_health.qualify import parse

    def rel(values):
        values = sorted(values)
        med = values[len(values) // 2] if len(values) % 2 else sum(
            values[len(values) // 2 - 1:len(values) // 2 + 1]) / 2
        return [v / med - 1 for v in values]

    tools = fixtures / "qualify" / "tool-outputs"
    out = {}
    burn = parse("gpu_burn", (tools / "gpu_burn.log").read_text())
    out["gpu-burn per GPU (8x A100)"] = rel([m.value for m in burn.metrics])
    baseline = json.loads((fixtures / "qualify" / "fleet-baseline" /
                           "ndv4-a100-baseline.json").read_text())
    out["ib_write 8 MiB per HCA (NDv4 fleet)"] = rel(
        [v for k, v in baseline.items() if k.startswith("ib-loopback/ib_write_8388608_ib")])
    probe = json.loads((fixtures / "real" / "h200-vm-2026-11-26" / "qual-probe-torch.json")
                       .read_text())
    out["HBM copy per run (H200)"] = rel(probe["hbm_d2d_copy_gbps_read_plus_write"])
    out["H2D pinned per run (H200)"] = rel(probe["h2d_pinned_gbps"])
    gemm = probe["gemm_bf16_8192_tflops"]
    out["bf16 GEMM per run (H200)"] = rel(gemm)
    # The first runs are a cool GPU boosting (767 TFLOP/s) before the power cap holds it
    # (670): a GEMM judged after a warm-up sees only the steady state.
    out["bf16 GEMM after warm-up (H200)"] = rel(gemm[len(gemm) // 8:])
    # What a judge sees when a run's figure is its median after the warm-up: 8 fresh runs.
    runs = [json.loads(line) for line in (fixtures / "real" / "h200-vm-2026-11-26" /
                                          "qual-probe-torch-x8.jsonl").read_text().splitlines()]
    for key, label in (("gemm_bf16_8192_tflops", "bf16 GEMM"), ("hbm_d2d_copy_gbps_read_plus_write",
                                                                "HBM copy")):
        out[f"{label} run median x8 (H200)"] = rel(
            [statistics.median(r[key][len(r[key]) // 8:]) for r in runs])
    return out


def simulate(deviations: Sequence[float], *, nodes: int, degrade: float, seed: int,
             peers: int = 64, rules=None) -> tuple[float, float]:
    """(false-fail rate of healthy nodes, share of nodes degraded by `degrade` that fail).
    A healthy value is a real deviation drawn at random plus Gaussian jitter of half the real
    robust spread, so the population is no tighter than the real one (outliers included, as
    drawn); peers are other healthy passes."""
    import random

    from rsc_health.qualify import Metric
    from rsc_health.qualify.judge import FAIL, Rules, judge, robust_spread

    rules = rules or Rules()
    rng = random.Random(seed)
    sigma = robust_spread(deviations)

    def healthy() -> float:
        return 100.0 * (1 + rng.choice(deviations) + rng.gauss(0, sigma / 2))

    pool = [healthy() for _ in range(max(peers * 4, 256))]
    false_fail = caught = 0
    for _ in range(nodes):
        group = rng.sample(pool, peers)
        ok = judge(Metric("m", healthy(), "u"), group, rules=rules)
        bad = judge(Metric("m", healthy() * (1 - degrade), "u"), group, rules=rules)
        false_fail += ok.status == FAIL
        caught += bad.status == FAIL
    return false_fail / nodes, caught / nodes
