"""perftest (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`), loopback or against a known-good peer:
the `BW average[MB/sec]` of the largest message (perftest's MB is 2^20 bytes... except with
--report_gbits; we read the column header's unit). Metric per HCA as SuperBench names it.

Real output: ../shared/data/qualify/tool-outputs/ib_loopback_*.log (perftest, ConnectX-6 HDR) and
tests/fixtures/qualify/captures/ib_write_bw-* (a table cut mid-way, a completion error).
"""

from __future__ import annotations

import re

from rsc_health.qualify.outcome import Metric, Outcome, number

NAME = "perftest"
TOOL = "ib_write_bw"

_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(\w+)/sec\]\s+BW average\[(\w+)/sec\]")
# The title line names the test: `RDMA_Write BW Test`, `RDMA_Read BW Test`, `Send BW Test`
# (ib_send_bw: no RDMA_, perftest#82), `RDMA_Write Post List BW Test` (-l, perftest#273),
# `RDMA_Write Bidirectional BW Test` (-b: both directions at once, about twice the figure).
_TEST = re.compile(r"^\s*(?:RDMA_)?(Write|Read|Send|Atomic)\b(.*?)\bBW Test\s*$", re.M | re.I)
_TOOL = re.compile(r"ib_(write|read|send|atomic)_bw$")
_DEVICE = re.compile(r"Device\s*:\s*(\S+)")
# Per perftest's README: MB/sec is 10^6 bytes/s... perftest prints with its own MB = 2^20 unless
# run with --report_gbits. SuperBench divides the column by 1000 to get GB/s; so do we, so an
# imported SuperBench baseline lines up.
_TO_GBPS = {"MB": 1 / 1000.0, "Gb": 1 / 8.0, "MiB": 1.048576 / 1000.0}
# A work request that completed in error, or a run loop that gave up (perftest_resources.c:
# `Completion with error at client`, `Failed status 12: wr_id 0 syndrom 0x81`, `Failed to
# complete run_iter_bw function successfully`): the rows before it are not the run's result.
_ERROR = re.compile(r"^\s*(?:Completion with error.*|Failed status .*|Failed to complete .*)$",
                    re.M)


def parse(text: str, tool: str | None = None) -> Outcome:
    header = _HEADER.search(text)
    if not header:
        return Outcome(NAME, inconclusive="no result table (peer never connected?)")
    unit = header.group(2)
    if unit not in _TO_GBPS:
        return Outcome(NAME, inconclusive=f"unknown bandwidth unit {unit[:10]!r}")
    error = _ERROR.search(text, header.end())
    if error:
        return Outcome(NAME, inconclusive=f"the run stopped: {error.group(0).strip()[:120]}")
    rows = []
    closed = False
    for line in text[header.end():].splitlines():
        tokens = line.split()
        if len(tokens) >= 4 and tokens[0].isdigit() and tokens[1].isdigit():
            rows.append((int(tokens[0]), number(tokens[3])))
        elif rows and line.strip().startswith("-"):
            closed = True
            break
    if not rows:
        return Outcome(NAME, inconclusive="result table empty")
    if not closed:
        # perftest closes its table with a rule after the last size (-a: 2 B .. 8 MiB): an
        # open table is a run stopped or cut mid-way, its largest row not the run's largest.
        return Outcome(NAME, inconclusive=f"result table never closed: cut short after "
                       f"{rows[-1][0]} B?")
    size, bw = max(rows)
    title = _TEST.search(text)
    named = _TOOL.search((tool or "").rsplit("/", 1)[-1])
    if title:
        op = title.group(1).lower() + ("_bidir" if "bidirectional" in title.group(2).lower()
                                        else "")
    elif named:
        op = named.group(1)
    else:  # a metric named for the wrong test is judged against the wrong peers
        return Outcome(NAME, inconclusive="no test title (RDMA_Write BW Test ...): which "
                       "perftest test ran is not known")
    dev = _DEVICE.search(text)
    hca = dev.group(1) if dev else "ib0"
    return Outcome(NAME, metrics=[Metric(f"ib-loopback/ib_{op}_{size}_{hca}_bw",
                                         bw * _TO_GBPS[unit], "GB/s", "hca", hca)])
