"""The simulator's output files, in the formats the real tools print (see common.md)."""

from __future__ import annotations

import csv
import json
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


def slurm_times(epoch: np.datetime64, seconds: np.ndarray) -> np.ndarray:
    """Slurm's `2026-01-02T03:04:05`; negative seconds mean `Unknown`."""
    text = np.datetime_as_string(epoch + seconds.astype("timedelta64[s]"), unit="s")
    return np.where(seconds < 0, "Unknown", text)


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


def write_sacct(
    path: Path, epoch: np.datetime64, names: list[str], partitions: list[str], jobs: Jobs,
    inst: Instances,
) -> int:
    order = np.lexsort((inst.submit, jobs.job_id[inst.job]))
    inst = inst.take(order)
    j = inst.job
    job_ids = jobs.job_id[j].astype(str)
    gpus = jobs.gpus[j]
    submit, eligible, start, end = (
        slurm_times(epoch, a) for a in (inst.submit, inst.eligible, inst.start, inst.end)
    )
    state_names = np.asarray(STATES, dtype=object)[inst.state]
    cancelled = inst.state == STATES.index("CANCELLED")
    uid = (UID_BASE + jobs.user[j]).astype(str)
    state_names[cancelled] = "CANCELLED by " + uid[cancelled].astype(object)
    exit_codes = np.asarray(EXIT_CODES, dtype=object)[inst.exit_code]
    users = np.asarray([user_name(i) for i in range(int(jobs.user.max()) + 1)], dtype=object)[
        jobs.user[j]
    ]
    job_names = JOB_NAMES.astype(object)[jobs.name[j]]
    parts = np.asarray(partitions, dtype=object)[jobs.partition[j]]
    node_names = np.asarray(names, dtype=object)
    nodelist = node_names[inst.first]
    multi = np.flatnonzero(inst.nnodes > 1)
    blocks: dict[tuple[int, int], str] = {}
    for i in multi.tolist():
        key = (int(inst.first[i]), int(inst.nnodes[i]))
        if key not in blocks:
            blocks[key] = compress(names[key[0] : key[0] + key[1]])
        nodelist[i] = blocks[key]
    tres_cache: dict[tuple[int, int], str] = {}
    for key in set(zip(gpus.tolist(), inst.nnodes.tolist(), strict=True)):
        tres_cache[key] = _tres(*key)
    keys = gpus * 100_000 + inst.nnodes
    uniq, inv = np.unique(keys, return_inverse=True)
    tres = np.asarray([tres_cache[(int(k) // 100_000, int(k) % 100_000)] for k in uniq],
                      dtype=object)[inv]
    nn = inst.nnodes.astype(str)
    with path.open("w", encoding="utf-8") as fh:
        fh.write("|".join(SACCT_FIELDS) + "\n")
        fh.writelines(
            f"{a}|{a}|{b}|{c}|{d}|{e}|{f}|{g}|{h}|{i}|{k}|{m}|{n}|{o}\n"
            for a, b, c, d, e, f, g, h, i, k, m, n, o in zip(
                job_ids, job_names, users, parts, state_names, exit_codes, submit, eligible,
                start, end, nn, nodelist, tres, strict=True,
            )
        )
    return len(inst)


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


def write_checks(path: Path, epoch, names, rows: list[CheckRow]) -> None:
    times = slurm_times(epoch, np.asarray([r.time for r in rows], dtype=np.int64))
    with path.open("w", encoding="utf-8") as fh:
        for r, t in zip(rows, times, strict=True):
            fh.write(json.dumps({
                "time": str(t), "node": names[r.node], "check": r.check, "status": r.status,
                "severity": r.severity, "component": r.component, "detail": r.detail,
                "code": r.code,
            }) + "\n")


def write_tickets(path: Path, epoch, names, failures: list[Failure], horizon: int) -> int:
    rows = sorted((f.ticket[0], f) for f in failures if f.ticket and f.ticket[0] < horizon)
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
