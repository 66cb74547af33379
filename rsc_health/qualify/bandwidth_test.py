"""CUDA samples' bandwidthTest (`--csv` shmoo or one size): host<->device and device<->device
copy bandwidth. The largest transfer's line gives the metric; `Result = FAIL` is the tool's own
failure verdict (a wrong copy), anything short of `Result = PASS` proves nothing.

Real output: ../shared/data/qualify/tool-outputs/cuda_memory_{h2d,d2h,d2d}_bw.log (V100).
"""

from __future__ import annotations

import re

from rsc_health.qualify.outcome import Metric, Outcome, number

NAME = "bandwidth_test"
TOOL = "bandwidthTest"

_LINE = re.compile(r"bandwidthTest-(H2D|D2H|D2D)(?:-(\w+))?, Bandwidth = ([\d.]+) GB/s, "
                   r"Time = [\d.]+ s, Size = (\d+) bytes")
_NAMES = {"H2D": "mem-bw/h2d_bw", "D2H": "mem-bw/d2h_bw", "D2D": "mem-bw/d2d_bw"}


def parse(text: str, tool: str | None = None) -> Outcome:
    if "Result = FAIL" in text:
        return Outcome(NAME, failed="bandwidthTest: Result = FAIL")
    if "Result = PASS" not in text:
        return Outcome(NAME, inconclusive="no Result = PASS line (cut short?)")
    best: dict[str, tuple[int, float]] = {}
    for kind, _mem, bw, size in _LINE.findall(text):
        if int(size) >= best.get(kind, (-1, 0.0))[0]:
            best[kind] = (int(size), number(bw))
    return Outcome(NAME, metrics=[Metric(_NAMES[k], bw, "GB/s") for k, (_s, bw) in best.items()])
