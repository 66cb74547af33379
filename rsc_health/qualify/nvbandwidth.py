"""nvbandwidth: copy-engine and SM bandwidth between host and each GPU, and between GPUs.
Each testcase prints a matrix (rows and columns are devices) and a `SUM <testcase> <GB/s>` line;
a testcase it cannot run on this topology prints `Waived: ` instead, without its name (never a
failure; nvbandwidth.cpp runTestcase, output.cpp addTestcase), and one that errors `Error: msg`.
Either leaves that testcase's metrics out: a node whose P2P is lost waives every
device-to-device testcase its peers measure, and is judged by the metrics it lacks
(verdict.judge_run's expected set), never by what it happened to print.
Metrics: one per testcase and per GPU (the column), so one slow GPU stands out from its peers.

Every copy is checked against the pattern written (memcpy.cpp memcmpPattern, unless run with
--skipVerification): a mismatch is `ASSERT(h_errorFlag == 0)`, its message on stderr and exit 1.
That is the hardware's fault (data copied wrong), read by fault() from stderr, and from stdout
where the verifying kernel prints `Invalid value when checking the pattern` first (and where a
launcher that merges the streams puts the ASSERT); any other ASSERT or CUDA error proves
nothing. A testcase's matrix not followed by its `SUM <testcase>` line was cut: inconclusive.

Real output: ../shared/data/qualify/tool-outputs/nvbandwidth_results.log (nvbandwidth v0.6, GH200).
"""

from __future__ import annotations

import re

from rsc_health.qualify.outcome import Metric, Outcome, number

NAME = "nvbandwidth"
TOOL = "nvbandwidth"

_RUNNING = re.compile(r"^Running (\w+)\.\s*$")
_DEVICE = re.compile(r"^Device (\d+): ", re.M)
_MISMATCH = re.compile(r"ASSERT in expression h_errorFlag == 0\b")
# The verifying kernel's own words for a byte that came back wrong, printed on stdout before
# the ASSERT (NVIDIA/nvbandwidth#34, v0.7 on A100): `Invalid value when checking the pattern
# at 0x...`, `Current offset : N`. A launcher that merges stderr into stdout (srun, a wrapper's
# 2>&1) brings the ASSERT there too.
_BAD_COPY = re.compile(r"Invalid value when checking the pattern\b|"
                       r"ASSERT in expression h_errorFlag == 0\b")


def fault(stderr: str) -> str | None:
    """The copy verification's failure, when nvbandwidth stopped at one."""
    if _MISMATCH.search(stderr):
        return "copy verification: data copied did not match the pattern written"
    return None


def parse(text: str, tool: str | None = None) -> Outcome:
    if _BAD_COPY.search(text):
        return Outcome(NAME, failed="copy verification: data copied did not match the "
                       "pattern written")
    metrics: list[Metric] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _RUNNING.match(lines[i].strip())
        i += 1
        if not m:
            continue
        case = m.group(1)
        # Skip to the column header (device numbers), then read rows until a blank line.
        while i < len(lines) and not re.fullmatch(r"\s*(\d+\s*)+", lines[i]):
            if _RUNNING.match(lines[i].strip()):
                break
            i += 1
        if i >= len(lines) or _RUNNING.match(lines[i].strip()):
            continue
        unit = re.search(r"\((\w+/?\w*)\)\s*$", lines[i - 1])
        unit = unit.group(1) if unit else "GB/s"
        columns = lines[i].split()
        i += 1
        per_column: dict[str, list[float]] = {c: [] for c in columns}
        measured = 0
        while i < len(lines) and lines[i].strip():
            cells = lines[i].split()[1:]
            for col, cell in zip(columns, cells, strict=False):
                if cell != "N/A":
                    per_column[col].append(number(cell))
                    measured += 1
            i += 1
        # Every testcase ends with `SUM <testcase> <value>` (v0.2 on): a matrix without it
        # was cut (a crash, a byte limit), its last row perhaps a part of a row.
        j = i
        while j < len(lines) and not _RUNNING.match(lines[j].strip()) \
                and not lines[j].startswith(f"SUM {case} "):
            j += 1
        if j == len(lines) or not lines[j].startswith(f"SUM {case} "):
            return Outcome(NAME, inconclusive=f"{case}: no SUM line after its matrix "
                           "(cut short?)")
        # The cells measured: a pair whose P2P is lost prints N/A (inline_common.h), and the
        # column's slowest path hides it; peers that measured the pair say it is owed.
        metrics.append(Metric(f"nvbandwidth/{case}_cells", float(measured), "cells",
                              exact=True))
        for col, values in per_column.items():
            if values:
                lower = unit == "ns"  # a latency: the worst is the highest
                metrics.append(Metric(f"nvbandwidth/{case}", max(values) if lower else
                                      min(values), unit, "gpu", col, higher_is_better=not lower))
    if not metrics:
        return Outcome(NAME, inconclusive="no testcase ran (all waived?)")
    # `Device N: <name> (<PCI>)`, one per GPU CUDA enumerates (output.cpp printGPUs).
    devices = {d for d in _DEVICE.findall(text)}
    return Outcome(NAME, metrics=metrics, devices=len(devices) if devices else None)
