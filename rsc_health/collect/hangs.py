"""Probes that keep hanging: which one (statvfs of a mount, NVML), since when, for how many
sweeps in a row.

One run says its own hang (`mount_hung`, `nvml_hung`). What one run cannot say is that the
probe has hung on every run for an hour: a wedged driver answers no NVML call until the GPU is
reset, and a checker error for ever lets jobs start on it. The node state keeps, per probe
still hanging, when it first hung and how many sweeps in a row found it hung:
{"boot_id": ..., "probes": {"nvml": {"since": ISO time, "sweeps": 3}}}. A probe that answers
is dropped; a new boot starts afresh (a reboot is the cure for both).

Standard library only: the prolog uses this on every job start.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rsc_health.collect.kmsg import save_json
from rsc_health.durable import load_state_json

NVML = "nvml"
STATVFS = "statvfs"


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
        str(name): {"since": p["since"], "sweeps": p["sweeps"]}
        for name, p in probes.items()
        if isinstance(p, dict) and isinstance(p.get("since"), str)
        and type(p.get("sweeps")) is int and p["sweeps"] >= 0
    }
    boot = data.get("boot_id")
    return {"boot_id": boot if isinstance(boot, str) else None, "probes": clean}


def update(previous: dict, boot_id: str, asked: set[str], hung: set[str], now: datetime, *,
           sweep: bool) -> dict[str, dict]:
    """The probes hanging after this run. `asked`: the probe kinds this run ran (a kind it did
    not run keeps its record); `hung`: the probes that did not answer. A sweep that found a
    probe hung counts one more sweep."""
    same_boot = previous.get("boot_id") in (None, boot_id)
    before = (previous.get("probes") or {}) if same_boot else {}
    out = {name: p for name, p in before.items() if kind(name) not in asked}
    for name in sorted(hung):
        was = before.get(name) or {"since": now.isoformat(), "sweeps": 0}
        out[name] = {"since": was["since"], "sweeps": was["sweeps"] + (1 if sweep else 0)}
    return out


def save(path: Path, probes: dict[str, dict], boot_id: str, *, sync_dir: bool = True) -> None:
    save_json(path, {"boot_id": boot_id, "probes": probes}, sync_dir=sync_dir)
