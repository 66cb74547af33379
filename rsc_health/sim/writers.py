"""The simulator's output files, in the formats the real tools print (see common.md)."""

from __future__ import annotations

import csv
import functools
import json
import re
from pathlib import Path

import numpy as np

from rsc_health.hostlist import compress
from rsc_health.model import Finding, Severity, Status
from rsc_health.policy import format_reason
from rsc_health.sim.failures import CheckRow, Failure
from rsc_health.sim.jobs import EXIT_CODES, JOB_NAMES, STATES, Instances, Jobs

SACCT_FIELDS = (
    "JobIDRaw", "JobID", "JobName", "User", "Partition", "State", "ExitCode", "Submit",
    "Eligible", "Start", "End", "NNodes", "NodeList", "AllocTRES",
)
SACCT_FORMAT = ",".join(SACCT_FIELDS)
# `sacctmgr -P show event format=NodeName,Start,End,State,Reason,User` names the columns so.
EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "Reason", "User")
CPUS_PER_GPU = 12
MEM_GB_PER_GPU = 125
UID_BASE = 10000


@functools.lru_cache(maxsize=1)
def _clock() -> np.ndarray:
    """"HH:MM:SS" for every second of a day (formatting 4M timestamps one by one is slow)."""
    tod = np.arange(86400)
    return np.asarray(
        [f"T{h:02d}:{m:02d}:{s:02d}" for h, m, s in zip(tod // 3600, tod // 60 % 60, tod % 60,
                                                        strict=True)],
        dtype=object,
    )


def slurm_times(epoch: np.datetime64, seconds: np.ndarray) -> np.ndarray:
    """Slurm's `2026-01-02T03:04:05` (object array); negative seconds mean `Unknown`."""
    seconds = np.asarray(seconds, dtype=np.int64)
    out = np.full(len(seconds), "Unknown", dtype=object)
    known = seconds >= 0
    if not known.any():
        return out
    s = seconds[known]
    day0 = epoch.astype("datetime64[D]")
    offset = int((epoch - day0.astype("datetime64[s]")).astype(np.int64))
    s = s + offset
    days = s // 86400
    first, last = int(days.min()), int(days.max())
    dates = np.datetime_as_string(day0 + np.arange(first, last + 1), unit="D").astype(object)
    out[known] = dates[days - first] + _clock()[s % 86400]
    return out


def user_name(idx: int) -> str:
    return f"user{idx:03d}"


def _mem(gb: int) -> str:
    # sacct prints exact unit conversions: 1024G is shown as 1T.
    return f"{gb // 1024}T" if gb % 1024 == 0 else f"{gb}G"


def _tres(gpus: int, nnodes: int) -> str:
    return (
        f"billing={gpus},cpu={gpus * CPUS_PER_GPU},gres/gpu={gpus},"
        f"mem={_mem(gpus * MEM_GB_PER_GPU)},node={nnodes}"
    )


def _node_ranges(names: list[str]):
    """A function from sorted node indices to their hostlist, as compress() writes it: ranges
    found with numpy when every name is one prefix and a number of one width, else compress()."""
    m = re.match(r"^(.*?)(\d+)$", names[0]) if names else None
    prefix, width = (m.group(1), len(m.group(2))) if m else ("", 0)
    nums = [n[len(prefix):] for n in names]
    if not m or any(not n.startswith(prefix) or len(u) != width or not u.isdigit()
                    for n, u in zip(names, nums, strict=True)):
        return lambda idx: compress([names[k] for k in idx])

    def text(idx: np.ndarray) -> str:
        if len(idx) == 1:
            return names[int(idx[0])]
        cut = np.flatnonzero(np.diff(idx) != 1)
        lo = np.concatenate([[0], cut + 1]).tolist()
        hi = np.concatenate([cut, [len(idx) - 1]]).tolist()
        a = idx.tolist()
        return prefix + "[" + ",".join(nums[a[s]] if s == e else f"{nums[a[s]]}-{nums[a[e]]}"
                                       for s, e in zip(lo, hi, strict=True)) + "]"

    return text


def write_sacct(
    path: Path, epoch: np.datetime64, names: list[str], partitions: list[str], jobs: Jobs,
    inst: Instances, chunk: int = 250_000, nodesets: list[np.ndarray] | None = None,
) -> int:
    """Rows sorted by JobID, a requeued job's instances in order; written in chunks so the
    paper's 4M rows never sit in memory as Python strings at once."""
    order = np.lexsort((inst.submit, jobs.job_id[inst.job]))
    node_names = np.asarray(names, dtype=object)
    state_names = np.asarray(STATES, dtype=object)
    exit_codes = np.asarray(EXIT_CODES, dtype=object)
    users = np.asarray([user_name(i) for i in range(int(jobs.user.max()) + 1)], dtype=object)
    job_names = JOB_NAMES.astype(object)
    parts = np.asarray(partitions, dtype=object)
    cancelled = STATES.index("CANCELLED")
    blocks: dict[tuple[int, int], str] = {}
    hosts = _node_ranges(names)
    tres: dict[tuple[int, int], str] = {}
    with path.open("w", encoding="utf-8") as fh:
        fh.write("|".join(SACCT_FIELDS) + "\n")
        for lo in range(0, len(order), chunk):
            part = inst.take(order[lo : lo + chunk])
            j = part.job
            gpus = jobs.gpus[j].tolist()
            nnodes = part.nnodes.tolist()
            states = state_names[part.state]
            sel = part.state == cancelled
            uid = (UID_BASE + jobs.user[j][sel]).astype(str).astype(object)
            states[sel] = "CANCELLED by " + uid
            nodelist = node_names[part.first]
            for i in np.flatnonzero(part.nnodes > 1).tolist():
                key = (int(part.first[i]), nnodes[i])
                if key not in blocks:
                    blocks[key] = compress(names[key[0] : key[0] + key[1]])
                nodelist[i] = blocks[key]
            for i in np.flatnonzero(part.nodeset >= 0).tolist():
                nodelist[i] = hosts(nodesets[int(part.nodeset[i])])
            alloc = []
            for g, n in zip(gpus, nnodes, strict=True):
                key = (g, n)
                if key not in tres:
                    tres[key] = _tres(g, n)
                alloc.append(tres[key])
            cols = (
                jobs.job_id[j].tolist(), job_names[jobs.name[j]].tolist(),
                users[jobs.user[j]].tolist(), parts[jobs.partition[j]].tolist(), states.tolist(),
                exit_codes[part.exit_code].tolist(),
                *(slurm_times(epoch, a).tolist()
                  for a in (part.submit, part.eligible, part.start, part.end)),
                nnodes, nodelist.tolist(), alloc,
            )
            fh.writelines(
                f"{a}|{a}|{b}|{c}|{d}|{e}|{f}|{g}|{h}|{i}|{k}|{m}|{n}|{o}\n"
                for a, b, c, d, e, f, g, h, i, k, m, n, o in zip(*cols, strict=True)
            )
    return len(order)


def _finding(row: CheckRow) -> Finding:
    return Finding(row.check, row.component, Status(row.status), Severity.DRAIN_NOW, row.detail,
                   code=row.code)


def event_rows(failures: list[Failure], horizon: int, rng: np.random.Generator) -> list[tuple]:
    """One out-of-service period per failure: rsc-health drains (as root) with its reason
    string; a node that stops answering is set DOWN by slurmctld itself."""
    rows = []
    for f in failures:
        if f.rows:
            start = f.time + int(rng.integers(5, 90))
            rows.append((f.node, start, f.repair_end, "DRAIN",
                         format_reason("now", [_finding(r) for r in f.rows]), "root(0)"))
        else:
            start = f.time + int(rng.integers(60, 300))
            rows.append((f.node, start, f.repair_end, "DOWN", "Not responding", "slurm(64030)"))
    rows = [r for r in rows if r[1] < horizon]
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows


def write_events(path: Path, epoch, names, rows: list[tuple], horizon: int) -> None:
    starts = slurm_times(epoch, np.asarray([r[1] for r in rows], dtype=np.int64))
    ends = slurm_times(
        epoch, np.asarray([r[2] if r[2] < horizon else -1 for r in rows], dtype=np.int64)
    )
    with path.open("w", encoding="utf-8") as fh:
        fh.write("|".join(EVENT_FIELDS) + "\n")
        for r, s, e in zip(rows, starts, ends, strict=True):
            fh.write(f"{names[r[0]]}|{s}|{e}|{r[3]}|{r[4]}|{r[5]}\n")


def write_checks(path: Path, epoch, names, rows: list[CheckRow],
                 all_clear: list[tuple[int, int, int, str]] = ()) -> None:
    """Failure rows (points), then the sweeps' all-clear intervals (sim.stream)."""
    times = slurm_times(epoch, np.asarray([r.time for r in rows], dtype=np.int64))
    with path.open("w", encoding="utf-8") as fh:
        for r, t in zip(rows, times, strict=True):
            fh.write(json.dumps({
                "time": str(t), "node": names[r.node], "check": r.check, "status": r.status,
                "severity": r.severity, "component": r.component, "detail": r.detail,
                "code": r.code,
            }) + "\n")
        if not all_clear:
            return
        firsts = slurm_times(epoch, np.asarray([a[1] for a in all_clear], dtype=np.int64))
        lasts = slurm_times(epoch, np.asarray([a[2] for a in all_clear], dtype=np.int64))
        for (node, _, _, fam), first, last in zip(all_clear, firsts, lasts, strict=True):
            fh.write(json.dumps({
                "time": str(first), "last_seen": str(last), "node": names[node],
                "check": fam, "status": "ok", "severity": "none", "component": "*",
                "source": "sweep", "detail": "all clear",
            }) + "\n")


def write_heartbeats(path: Path, epoch, names, all_clear: list[tuple[int, int, int, str]],
                     horizon: int, cadence: int, hours: float = 2.0) -> int:
    """The node path's heartbeats of the last `hours`, in the spool's own format (what `spool
    flush` delivers): one per sweep of every node that was up and checking then, so the
    historian knows each node's last run and a node still down at the end has stopped
    checking. The whole period's runs would be 288 lines per node-day for no more insight."""
    first = max(0, horizon - int(hours * 3600)) // cadence * cadence
    times = list(range(first, horizon, cadence))
    up: dict[int, list[tuple[int, int]]] = {}
    for node, lo, hi, fam in all_clear:
        if fam == "gpu" and hi >= first:
            up.setdefault(node, []).append((lo, hi))
    stamps = slurm_times(epoch, np.asarray(times, dtype=np.int64))
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for node in sorted(up):
            for t, stamp in zip(times, stamps, strict=True):
                if any(lo <= t <= hi for lo, hi in up[node]):
                    fh.write(json.dumps({
                        "kind": "heartbeat", "id": f"sim-hb-{names[node]}-{t}",
                        "time": f"{stamp}+00:00", "node": names[node], "source": "sweep",
                        "level": "ok", "checker_errors": 0, "duration_s": 0.4,
                        "families": {}, "version": "sim"}, separators=(",", ":")) + "\n")
                    n += 1
    return n


def write_tickets(path: Path, epoch, names, failures: list[Failure], horizon: int) -> int:
    # Sort on (open time, node) only: two tickets can open in the same second, and Failure
    # objects do not order.
    rows = sorted(((f.ticket[0], f) for f in failures if f.ticket and f.ticket[0] < horizon),
                  key=lambda pair: (pair[0], pair[1].node))
    with path.open("w", encoding="utf-8", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["node", "opened", "closed", "reason"])
        for opened, f in rows:
            closed = f.ticket[1]
            codes = ",".join(dict.fromkeys(r.code for r in f.rows)) or "node_down"
            out.writerow([
                names[f.node],
                str(slurm_times(epoch, np.asarray([opened]))[0]),
                "" if closed >= horizon else str(slurm_times(epoch, np.asarray([closed]))[0]),
                f"{f.mode}: {codes}",
            ])
    return len(rows)


def write_exclusions(path: Path, epoch, names, rows: list[tuple[int, int, int]]) -> None:
    times = slurm_times(epoch, np.asarray([r[2] for r in rows], dtype=np.int64))
    with path.open("w", encoding="utf-8") as fh:
        for (job_id, node, _), t in zip(rows, times, strict=True):
            fh.write(json.dumps({"job_id": str(job_id), "node": names[node], "time": str(t)})
                     + "\n")
