"""Probes that keep hanging: which one (statvfs of a mount, NVML, the InfiniBand ports' sysfs
read), since when, for how many sweeps in a row.

One run says its own hang (`mount_hung`, `nvml_hung`, `ib_hung`). What one run cannot say is
that the probe has hung on every run for an hour: a wedged driver answers no NVML call until the
GPU is reset, and a checker error for ever lets jobs start on it. The node state keeps, per probe
still hanging, when it first hung and how many sweeps in a row found it hung:
{"boot_id": ..., "probes": {"nvml": {"since": ISO time, "sweeps": 3, "pid": 4242, "start":
123456}}}. A probe that answers is dropped; a new boot starts afresh (a reboot is the cure).

pid and start (its start time, /proc/PID/stat) name the child the run abandoned. While that
child is still in the kernel the probe is not asked again: the child itself is the answer (it
returns the moment the mount or the driver does), and asking again would only leave one more
process stuck behind it: one per run, hundreds in a day-long storage outage, each holding the
memory of the run it was forked from.

Standard library only: the prolog uses this on every job start.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rsc_health.collect.kmsg import save_json
from rsc_health.durable import load_state_json

NVML = "nvml"
STATVFS = "statvfs"
IB = "ib"  # the InfiniBand ports' sysfs read (collect.ibports)


def statvfs(path: str) -> str:
    """The probe name of one mount's statvfs: `statvfs /home`."""
    return f"{STATVFS} {path}"


def kind(probe: str) -> str:
    return probe.split(" ", 1)[0]


def load(path: Path) -> dict:
    """{"boot_id", "probes"}; anything malformed or unreadable is no hang on record (the count
    starts again: a wedged driver is then found N sweeps later, never wrongly)."""
    data = load_state_json(path)
    probes = data.get("probes") if isinstance(data.get("probes"), dict) else {}
    clean = {
        str(name): {k: v for k, v in p.items() if k in ("since", "sweeps", "pid", "start")
                    and (k == "since" or type(v) is int)
                    or k == "after_health" and v is True}
        for name, p in probes.items()
        if isinstance(p, dict) and isinstance(p.get("since"), str)
        and type(p.get("sweeps")) is int and p["sweeps"] >= 0
    }
    boot = data.get("boot_id")
    return {"boot_id": boot if isinstance(boot, str) else None, "probes": clean}


def current(previous: dict, boot_id: str) -> dict[str, dict]:
    """The probes on record as hanging in this boot."""
    return (previous.get("probes") or {}) if previous.get("boot_id") in (None, boot_id) else {}


def update(previous: dict, boot_id: str, asked: set[str], hung: dict[str, int | None],
           now: datetime, *, sweep: bool, after_health: frozenset[str] | set[str] = frozenset(),
           ) -> dict[str, dict]:
    """The probes hanging after this run. `asked`: the probe kinds this run ran (a kind it did
    not run keeps its record); `hung`: the probes that did not answer, each with the pid of the
    child this run abandoned (None: none, the one on record is still waiting). A sweep that
    found a probe hung counts one more sweep. `after_health`: the hung probes whose child
    waits only past the health answers (after_health: true on the record, kept while that
    child is the one on record)."""
    before = current(previous, boot_id)
    out = {name: p for name, p in before.items() if kind(name) not in asked}
    for name in sorted(hung):
        was = before.get(name) or {"since": now.isoformat(), "sweeps": 0}
        rec = {**was, "sweeps": was["sweeps"] + (1 if sweep else 0)}
        if hung[name] is not None:
            rec.pop("pid", None), rec.pop("start", None), rec.pop("after_health", None)
            start = _start_time(hung[name])
            if start is not None:
                rec.update(pid=hung[name], start=start)
                if name in after_health:
                    rec["after_health"] = True
        out[name] = rec
    return out


def still_waiting(record: dict | None) -> bool:
    """The child a run abandoned on this probe is still in the kernel (alive, not a zombie,
    and the same process: its start time matches, so a reused pid is not mistaken for it)."""
    if not record or type(record.get("pid")) is not int or type(record.get("start")) is not int:
        return False
    return _start_time(record["pid"]) == record["start"]


def wedged(state, probe: str, limit: int) -> dict | None:
    """The probe's record when it hung on this run and on `limit` sweeps in a row (the
    driver behind it is wedged: the node's fault, a drain for repair, not a checker error for
    ever); None otherwise, and always with limit <= 0. getattr: a state built by hand (a test,
    a replay tool) need not carry the hang fields."""
    if probe not in getattr(state, "hung_probes", {}):
        return None
    hang = getattr(state, "hangs", {}).get(probe)
    if hang is None or limit <= 0 or hang["sweeps"] < limit:
        return None
    return hang


def waited_s(record: dict, now: datetime) -> float:
    """Seconds since the probe first hung."""
    try:
        return max(0.0, (now - datetime.fromisoformat(record["since"])).total_seconds())
    except (KeyError, TypeError, ValueError):
        return 0.0


def _start_time(pid: int) -> int | None:
    """A live process's start time (clock ticks since boot, /proc/PID/stat field 22); None when
    it is gone or a zombie. /proc is this machine's, whatever root the checks read.

    Live means any of its threads: the mount prober's child asks each mount in a thread, and
    once killed its main thread is a zombie while the thread stuck in statvfs is still in the
    kernel (state D): the process is still waiting on that mount."""
    try:
        state, start = _stat(Path(f"/proc/{pid}/stat"))
        if state in _GONE:
            tasks = Path(f"/proc/{pid}/task")
            if not any(_stat(t / "stat")[0] not in _GONE for t in tasks.iterdir()):
                return None
        return start
    except (OSError, ValueError, IndexError):
        return None


_GONE = ("Z", "X", "x")


def _stat(path: Path) -> tuple[str, int]:
    """(state, start time) from a /proc stat file."""
    stat = path.read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def save(path: Path, probes: dict[str, dict], boot_id: str, *, sync_dir: bool = True) -> None:
    save_json(path, {"boot_id": boot_id, "probes": probes}, sync_dir=sync_dir)
