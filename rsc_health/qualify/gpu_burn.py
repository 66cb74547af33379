"""gpu-burn (wilicc/gpu-burn): a GEMM stress run that compares every result against the first;
`GPU N: FAULTY` means a GPU computed wrong results (the hardware's fault). Its last progress line
gives each GPU's Gflop/s (`proc'd: N (G Gflop/s) - ...`), the throughput judged against peers.

A GPU whose burn process died (its init or a CUDA call failed: gpu-burn prints its count as -1
and `(DIED!)` by its errors) keeps the Gflop/s of its last report, and gpu-burn still calls it
`OK` at the end (only wrong results make it FAULTY; gpu_burn-drv.cpp): it was not stressed for
the rest of the run, so its figures prove nothing (inconclusive, never a pass). Its error count
is then an int gpu-burn never read (the second `read` of a closed pipe leaves `errors` as it
was: 1641686072, -1903218736, ...), added up all the same and turned into `FAULTY` at the end:
a GPU whose burn process died and never showed an error while alive (`(WARNING!)`) is
inconclusive, not a GPU that computed wrong results (wilicc/gpu-burn#52: `Couldn't init a GPU
test: Error in "load module"` on a K80).

Real output: ../shared/data/qualify/tool-outputs/gpu_burn.log (8x A100, doubles + tensor cores)
and tests/fixtures/real/h200-vm-2026-11-26/gpu_burn-h200-20s.log (one H200, doubles).
"""

from __future__ import annotations

import re

from rsc_health.qualify.outcome import Metric, Outcome, number

NAME = "gpu_burn"
TOOL = "gpu_burn"

# Each number starts where no digit stands before it (the lookbehinds): without them a long
# run of digits (a garbled or hostile output) is retried from every one of its positions, and
# 100,000 of them took five minutes.
_PROGRESS = re.compile(
    r"(?<![\d.])(\d+(?:\.\d+)?)%\s+proc'd:\s*([^%\r\n]{0,4096}?)\s+errors:"
    r"\s*([^%\r\n]{0,4096}?)\s+temps:")
_GFLOPS = re.compile(r"(?<![\d-])(-?\d+)\s*\((\-?[\d.]+)\s*Gflop/s\)")
_VERDICT = re.compile(r"^\s*GPU\s+(\d+):\s*(OK|FAULTY)\b", re.M)
# One GPU's entry in a progress line's errors: its count and gpu-burn's note.
_ERRORS = re.compile(r"(-?\d+)\s*(\((?:DIED|WARNING)!\))?")


def _errors(segment: str) -> list[tuple[int, str]]:
    """Each GPU's (count, note) in a progress line's `errors:` segment (`0 - -524288000
    (WARNING!)- 1641686072  (DIED!)`: a count may be negative, the separator is `- `)."""
    return [(int(n), note) for n, note in _ERRORS.findall(segment)]


def _precision(text: str) -> str:
    doubles = "using DOUBLES" in text
    tensor = "using Tensor Cores" in text
    return ("fp64" if doubles else "fp32") + ("_tc" if tensor else "")


def parse(text: str, tool: str | None = None) -> Outcome:
    verdicts = _VERDICT.findall(text)
    progress = list(_PROGRESS.finditer(text))
    dead: set[int] = set()
    warned: set[int] = set()
    for m in progress:
        for i, (_count, note) in enumerate(_errors(m.group(3))):
            if note == "(DIED!)":
                dead.add(i)
            elif note == "(WARNING!)":
                warned.add(i)
    faulty = [gpu for gpu, state in verdicts if state == "FAULTY"]
    # FAULTY from errors a live process counted; a dead one's count was never read.
    wrong = [gpu for gpu in faulty if int(gpu) in warned or int(gpu) not in dead]
    if wrong:
        return Outcome(NAME, failed=f"GPU {', '.join(wrong)} computed wrong results")
    if faulty:
        return Outcome(NAME, inconclusive=f"GPU {', '.join(faulty)}: its burn process died "
                       "(DIED!) and gpu-burn calls the count it never read FAULTY")
    if not verdicts:
        return Outcome(NAME, inconclusive="no per-GPU verdict (run cut short or never started)")
    if not progress:
        return Outcome(NAME, inconclusive="no progress line with throughput")
    last = progress[-1]
    done = _GFLOPS.findall(last.group(2))
    # A dead process's count is not a count (never read): it is judged as DIED below.
    errors = [0 if note == "(DIED!)" else n for n, note in _errors(last.group(3))]
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
