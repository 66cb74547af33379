"""nccl-tests (`all_reduce_perf`, `all_gather_perf`, `alltoall_perf`, ...): the result table's
largest message size gives the bus bandwidth that says what the fabric can do; a wrong result
(`#wrong` column, or `Out of bounds values : N FAILED`) is the hardware's fault.

The column header above the rows names each column, and a row's tokens line up with its names:
what comes before time/algbw/busbw varies (2.19 added `root`, alltoall has no redop), and so
does what comes after (2.19's `-I 1` adds i_min, i_max, i_p99 and i_cv% to each half, `-S 1` a
timestamp, two tokens, at the end). The check column is `#wrong` (nccl-tests 2.13 on: wrong
elements, a count) or `error` (before 2.13: the largest difference from the expected result,
`%5.0le`, non-zero for a healthy float sum; the tool judges it against its own tolerance and
counts the values past it in `Out of bounds values`, the verdict read here). Output without a
header is read as the eight last columns (time, algbw, busbw, #wrong, out of place then in
place), every version's layout without those options.
Real output: ../shared/data/qualify/tool-outputs/nccl_*.log (8x A100) and
tests/fixtures/real/h200-vm-2026-11-26/nccl_all_reduce_perf-1gpu.log (one H200, nccl-tests 2.19.6),
tests/fixtures/qualify/captures/nccl_* (16 ranks on two H100 hosts; ranks stopped mid-run).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rsc_health.qualify.outcome import Metric, Outcome, number

NAME = "nccl_tests"
TOOL = "all_reduce_perf"

_BENCH = re.compile(r"Collective test (?:starting|concluded):\s*(\w+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(\w+)")
# What a rank prints as it gives up (common.cu's NCCLCHECK/CUDACHECK/TESTCHECK):
# `host: Test NCCL failure common.cu:1204 'unhandled cuda error ...'`, then
# ` .. host pid N: Test failure common.cu:915`. The rows before it are not the run's result.
_ABORT = re.compile(r"\bTest (?:NCCL |CUDA )?failure\b.*$", re.M)
_RANK_NUMBER = re.compile(r"^#\s+Rank\s+(\d+)", re.M)
# `#  Rank  0 Group  0 Pid  916 on  vm device  0 [0000:00:06] NVIDIA H200` (2.19) or
# `#   Rank  0 Pid 112424 on localhost device  0 [0x00] A100-SXM4-40GB` (older).
# Ranks, not device numbers, are counted: a rank given one GPU by CUDA_VISIBLE_DEVICES (srun
# --gpus-per-task=1) says `device 0` on every rank.
_RANK_HOST = re.compile(r"^#\s+Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+\d+", re.M)
# What a launcher puts before each line a rank prints: `mpirun --tag-output`
# ("[1,0]<stdout>:"), MPICH's -prepend-rank ("[0] "), `srun --label` ("0: ").
_TAG = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\[\d+\] |\s*\d+: )", re.M)


def untagged(text: str) -> str:
    """The output as the tool printed it, without a launcher's per-line tag."""
    return _TAG.sub("", text)


class _Columns(NamedTuple):
    busbw: list[int]  # indexes from a row's end
    checks: list[int]
    counts: bool  # the checks count wrong elements (else: pre-2.13 differences)
    tokens: range  # how many tokens a whole row of this header has


# Output with no header: the eight last columns, every version's layout without -I or -S.
_LAST_EIGHT = _Columns([-6, -2], [-5, -1], True, range(11, 1 << 16))


def _header(line: str) -> _Columns | None:
    """The columns a header line names, or None when the line is not one. Indexes are from
    a row's end: a row's leading columns may print empty (older alltoall's redop), its
    measured ones never do; the timestamp column is two tokens in a row (date and time). A
    row has at least size and count before them, at most every leading column."""
    stripped = line.lstrip()
    if not stripped.startswith("#"):
        return None
    names = stripped[1:].split()
    if "size" not in names or "busbw" not in names:
        return None
    first = next((i for i, n in enumerate(names) if n in ("time", "cputime")), None)
    if first is None:
        return None
    tail: list[str] = []
    for n in names[first:]:
        tail += [n, n] if n == "timestamp" else [n]
    busbw = [i - len(tail) for i, n in enumerate(tail) if n == "busbw"]
    checks = [i - len(tail) for i, n in enumerate(tail) if n in ("#wrong", "wrong", "error")]
    return _Columns(busbw, checks, "error" not in tail,
                    range(len(tail) + 2, len(tail) + first + 1))


def _wrong(cell: str) -> bool:
    """A count of wrong elements that is not zero (or not a count: never taken as none)."""
    if cell == "N/A":
        return False
    try:
        return float(cell) != 0
    except ValueError:
        return True


def parse(text: str, tool: str | None = None) -> Outcome:
    """`tool`: the program that printed `text` (older nccl-tests never name their test)."""
    text = untagged(text)
    rows = []
    columns = _LAST_EIGHT
    deltas = False  # a pre-2.13 `error` column was read: the summary line is the verdict
    for line in text.splitlines():
        header = _header(line)
        if header is not None:
            columns = header
            continue
        tokens = line.split()
        if len(tokens) < 11 or not (tokens[0].isdigit() and tokens[1].isdigit()):
            continue
        if len(tokens) not in columns.tokens:
            continue  # a row cut short, or not of this header
        if columns.counts:
            wrong = [tokens[c] for c in columns.checks if _wrong(tokens[c])]
            if wrong:
                return Outcome(NAME, failed=f"{tokens[0]} B: {wrong[0]} wrong results")
        else:
            deltas = True
        # the worse of out-of-place and in-place: a node is as good as its slower half (and
        # SuperBench's baseline figure is the out-of-place one, never above it)
        rows.append((int(tokens[0]), min(number(tokens[b]) for b in columns.busbw)))
    # Every summary, not the first: output holding two runs (a wrapper's retry, a log
    # appended to) fails on any of them that found wrong values
    summaries = list(_OOB.finditer(text))
    oob = summaries[-1] if summaries else None
    bad = next((m for m in summaries if m.group(2) != "OK" or m.group(1) != "0"), None)
    if bad is not None:
        return Outcome(NAME, failed=f"out of bounds values: {bad.group(1)} {bad.group(2)}")
    abort = _ABORT.search(text)
    if abort:
        return Outcome(NAME, inconclusive=f"the run stopped: {abort.group(0).strip()[:120]}")
    if not rows:
        return Outcome(NAME, inconclusive="no result rows (setup failed before the first size?)")
    if deltas and not oob:
        return Outcome(NAME, inconclusive="no 'Out of bounds values' line: this nccl-tests "
                       "prints its check as a difference, and its verdict never came")
    if not oob:
        # Every nccl-tests prints it after its last size: without it the sizes after the
        # last row read (and their checks) are missing, the largest read is not the run's.
        return Outcome(NAME, inconclusive="no 'Out of bounds values' line: the run never "
                       "reached its summary (cut short?)")
    ranks = _RANK_NUMBER.findall(text)
    if len(set(ranks)) == 1:
        # `Rank 0` on every host (NVIDIA/nccl-tests#107): nccl-tests built without MPI=1 and
        # started by mpirun/srun, each process a one-rank run of its own.
        return Outcome(NAME, inconclusive="one rank" + (
            f" in each of {len(ranks)} separate runs (nccl-tests built without MPI?)"
            if len(ranks) > 1 else "") + ": its bus bandwidth is 0 by definition")
    bench = _BENCH.search(text)
    program = bench.group(1) if bench else (tool or TOOL).rsplit("/", 1)[-1]
    op = program.removesuffix("_perf").replace("_", "")
    # The largest size; printed again by each of `-N` cycles: the worst cycle's figure (a
    # node that slowed in its second cycle is as slow as that)
    size = max(r[0] for r in rows)
    busbw = min(b for n, b in rows if n == size)
    # The GPUs it ran on (a rank each), per host: the fewest any host gave it (a pairwise
    # run's peer has its own). A GPU CUDA cannot use on this node is no rank of it.
    per_host: dict[str, set[str]] = {}
    for rank, host in _RANK_HOST.findall(text):
        per_host.setdefault(host, set()).add(rank)
    devices = min(len(d) for d in per_host.values()) if per_host else None
    return Outcome(NAME, metrics=[Metric(f"nccl-bw/{op}_{size}_busbw", busbw, "GB/s")],
                   devices=devices)
