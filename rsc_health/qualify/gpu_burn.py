"""gpu-burn (wilicc/gpu-burn): a GEMM stress run that compares every result against the first;
`GPU N: FAULTY` means a GPU computed wrong results (the hardware's fault). Its last progress line
gives each GPU's Gflop/s (`proc'd: N (G Gflop/s) - ...`), the throughput judged against peers.

A GPU whose burn process died (its init or a CUDA call failed: gpu-burn prints its count as -1
and `(DIED!)` by its errors) keeps the Gflop/s of its last report, and gpu-burn still calls it
`OK` at the end (only wrong results make it FAULTY; gpu_burn-drv.cpp): it was not stressed for
the rest of the run, so its figures prove nothing (inconclusive, never a pass).

Real output: ../shared/data/qualify/tool-outputs/gpu_burn.log (8x A100, doubles + tensor cores)
and tests/fixtures/real/h200-vm-2026-11-26/gpu_burn-h200-20s.log (one H200, doubles).
"""

from __future__ import annotations

import re

from rsc_health.qualify.outcome import Metric, Outcome, number

NAME = "gpu_burn"
TOOL = "gpu_burn"

_PROGRESS = re.compile(r"(\d+(?:\.\d+)?)%\s+proc'd:\s*(.*?)\s+errors:\s*(.*?)\s+temps:")
_GFLOPS = re.compile(r"(-?\d+)\s*\((\-?[\d.]+)\s*Gflop/s\)")
_VERDICT = re.compile(r"^\s*GPU\s+(\d+):\s*(OK|FAULTY)\b", re.M)


def _precision(text: str) -> str:
    doubles = "using DOUBLES" in text
    tensor = "using Tensor Cores" in text
    return ("fp64" if doubles else "fp32") + ("_tc" if tensor else "")


def parse(text: str, tool: str | None = None) -> Outcome:
    verdicts = _VERDICT.findall(text)
    faulty = [gpu for gpu, state in verdicts if state == "FAULTY"]
    if faulty:
        return Outcome(NAME, failed=f"GPU {', '.join(faulty)} computed wrong results")
    if not verdicts:
        return Outcome(NAME, inconclusive="no per-GPU verdict (run cut short or never started)")
    last = None
    for m in _PROGRESS.finditer(text):
        last = m
    if last is None:
        return Outcome(NAME, inconclusive="no progress line with throughput")
    done = _GFLOPS.findall(last.group(2))
    errors = [int(e) for e in re.findall(r"\d+", last.group(3))]
    if any(errors):
        return Outcome(NAME, failed=f"errors per GPU {errors}")
    died = [str(i) for i, (calcs, _g) in enumerate(done) if int(calcs) < 0]
    if died or "DIED" in last.group(3):
        return Outcome(NAME, inconclusive=f"GPU {', '.join(died) or '?'}: its burn process died "
                       "(DIED!): not stressed to the end, its figures are from before")
    flops = [number(g) for _calcs, g in done]
    if len(flops) != len(verdicts) or not all(flops):
        return Outcome(NAME, inconclusive=f"{len(verdicts)} GPUs tested, throughput for "
                       f"{sum(1 for f in flops if f)}")
    name = f"gpu-burn/{_precision(text)}_flops"
    # Its own list (`Tested N GPUs:`, a verdict each) is the GPUs CUDA gave it: a GPU NVML
    # lists but CUDA cannot use is missing from it, and from the metrics.
    return Outcome(NAME, metrics=[Metric(name, f, "GFLOP/s", "gpu", str(i))
                                  for i, f in enumerate(flops)], devices=len(verdicts))
