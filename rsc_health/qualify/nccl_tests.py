"""nccl-tests (`all_reduce_perf`, `all_gather_perf`, `alltoall_perf`, ...): the result table's
largest message size gives the bus bandwidth that says what the fabric can do; a wrong result
(`#wrong` column, or `Out of bounds values : N FAILED`) is the hardware's fault.

Every version ends a result row with the same eight columns (time, algbw, busbw, #wrong, out of
place then in place); what comes before them varies (2.19 added `root`, alltoall has no redop).
Real output: ../shared/data/qualify/tool-outputs/nccl_*.log (8x A100) and
tests/fixtures/real/h200-vm-2026-11-26/nccl_all_reduce_perf-1gpu.log (one H200, nccl-tests 2.19.6).
"""

from __future__ import annotations

import re

from rsc_health.qualify.outcome import Metric, Outcome, number

NAME = "nccl_tests"
TOOL = "all_reduce_perf"

_BENCH = re.compile(r"Collective test (?:starting|concluded):\s*(\w+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(\w+)")
_RANK = re.compile(r"^#\s+Rank\s+\d+", re.M)


def parse(text: str, tool: str | None = None) -> Outcome:
    """`tool`: the program that printed `text` (older nccl-tests never name their test)."""
    rows = []
    for line in text.splitlines():
        tokens = line.split()
        if len(tokens) < 11 or not (tokens[0].isdigit() and tokens[1].isdigit()):
            continue
        oop, inp = tokens[-8:-4], tokens[-4:]
        wrong = [c for c in (oop[3], inp[3]) if c not in ("N/A", "0")]
        if wrong:
            return Outcome(NAME, failed=f"{tokens[0]} B: {wrong[0]} wrong results")
        rows.append((int(tokens[0]), max(number(oop[2]), number(inp[2]))))
    oob = _OOB.search(text)
    if oob and (oob.group(2) != "OK" or oob.group(1) != "0"):
        return Outcome(NAME, failed=f"out of bounds values: {oob.group(1)} {oob.group(2)}")
    if not rows:
        return Outcome(NAME, inconclusive="no result rows (setup failed before the first size?)")
    if len(_RANK.findall(text)) == 1:
        return Outcome(NAME, inconclusive="one rank: its bus bandwidth is 0 by definition")
    bench = _BENCH.search(text)
    program = bench.group(1) if bench else (tool or TOOL).rsplit("/", 1)[-1]
    op = program.removesuffix("_perf").replace("_", "")
    size, busbw = max(rows)
    return Outcome(NAME, metrics=[Metric(f"nccl-bw/{op}_{size}_busbw", busbw, "GB/s")])
