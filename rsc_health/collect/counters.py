"""Error counters compared with the previous sweep.

The state file keeps the last sweep's counters and the boot id. A counter that went down, or a
changed boot id, means the counter was reset (reboot, driver reload, link retrain): the errors
since the reset are then the current value. With no previous sweep there is no delta: a node
is not drained for errors it collected before rsc-health first looked.
"""

from __future__ import annotations

import json
from pathlib import Path

from rsc_health.collect.kmsg import save_json


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def deltas(previous: dict, counters: dict[str, int], boot_id: str) -> dict[str, int]:
    """counter key -> increase since the previous sweep (only keys with a baseline)."""
    if not previous:
        return {}
    before = previous.get("counters") or {}
    rebooted = bool(boot_id) and previous.get("boot_id") not in (None, boot_id)
    out = {}
    for key, now in counters.items():
        if rebooted:
            out[key] = now
        elif key in before:
            then = before[key]
            out[key] = now if now < then else now - then
    return out


def save(path: Path, counters: dict[str, int], boot_id: str) -> None:
    save_json(path, {"boot_id": boot_id, "counters": counters})
