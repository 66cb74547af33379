"""Sweep-line checks over a simulated history: GPUs allocated per node at every instant, and
job starts inside a node's repair window."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from rsc_health.hostlist import expand


def _gpus(tres: str) -> int:
    return int(tres.split("gres/gpu=")[1].split(",")[0])


def intervals(rows: list[dict], truth: dict) -> dict[str, list[tuple[float, float, int]]]:
    """node -> (start, end, GPUs on that node) of every job instance that ran there; a job
    still running at the end of the window runs to it."""
    t_end = (datetime.fromisoformat(truth["start"]).timestamp() + truth["days"] * 86400)
    by_node: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for row in rows:
        if row["Start"] in ("Unknown", "None"):
            continue
        start = datetime.fromisoformat(row["Start"]).timestamp()
        end = t_end if row["End"] == "Unknown" else datetime.fromisoformat(row["End"]).timestamp()
        nodes = expand(row["NodeList"])
        per_node = _gpus(row["AllocTRES"]) // len(nodes) if len(nodes) > 1 else _gpus(
            row["AllocTRES"])
        for node in nodes:
            by_node[node].append((start, end, per_node))
    return by_node


def max_gpus_per_node(by_node: dict[str, list[tuple[float, float, int]]]) -> int:
    """The most GPUs allocated on one node at one instant (an end frees before a start at the
    same second)."""
    worst = 0
    for spans in by_node.values():
        events = sorted([(s, 1, g) for s, _e, g in spans] + [(e, 0, -g) for _s, e, g in spans])
        level = 0
        for _t, _kind, g in events:
            level += g
            worst = max(worst, level)
    return worst


def starts_during_repair(rows: list[dict], truth: dict) -> list[tuple[str, str]]:
    """(JobIDRaw, node) of instances that started on a node while it was out for repair."""
    outs = defaultdict(list)
    for f in truth["failures"]:
        end = f["repair_end"]
        outs[f["node"]].append((datetime.fromisoformat(f["time"]).timestamp(),
                                float("inf") if end == "Unknown"
                                else datetime.fromisoformat(end).timestamp()))
    bad = []
    for row in rows:
        if row["Start"] in ("Unknown", "None"):
            continue
        start = datetime.fromisoformat(row["Start"]).timestamp()
        for node in expand(row["NodeList"]):
            if any(a < start < b for a, b in outs.get(node, ())):
                bad.append((row["JobIDRaw"], node))
    return bad


def load(out: Path) -> tuple[list[dict], dict]:
    with (out / "sacct.txt").open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="|", quoting=csv.QUOTE_NONE))
    return rows, json.loads((out / "truth.json").read_text())
