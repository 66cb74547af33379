"""Error counters compared with the previous sweep.

The state file keeps the last sweep's counters and the boot id (a prolog or epilog judges the
rise since them and moves none that is there: checks.state._read_counters). A counter that
went down, or a changed boot id, means the counter was reset (reboot, driver reload, link
retrain): the errors since the reset are then the current value. With no previous sweep there
is no delta: a node is not drained for errors it collected before rsc-health first looked.

That rule holds whichever stage runs first after a reboot: the file also names the families
whose counters no run of this boot has judged yet ("unjudged", checks.state.unjudged_families).
A run that does not judge one keeps none of its baselines for the new boot, and the first
run that does judges its whole value since boot, as if it had seen the boot id change.
"""

from __future__ import annotations

from rsc_health.collect.kmsg import save_json
from rsc_health.durable import load_state_json

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

# Lifetime counters (NVML's aggregate ECC counts live in the InfoROM and survive reboots):
# after a reboot their value is history, not news; only their growth within a boot counts.
LIFETIME_SUFFIXES = ("aggregate_corrected", "aggregate_uncorrected")

# The sweep a limit "per sweep" is set for (the timer's five minutes, checks/rsc-health-sweep.
# timer): a rise over a longer time since its baseline (sweeps missed) is judged against the
# limit times the sweeps it spans (checks.state.NodeState.sweeps), never less than one's.
SWEEP_S = 300


def replay_clock(root, replay: str) -> dict:
    """What a snapshot's replay (`check --from`) kept of the node's clocks when it read it
    (`replay`, a file under `root`): its wall clock ("time_ms", the rates') and its
    CLOCK_MONOTONIC ("monotonic_ms", the baselines' times); {} when it is not an object.
    Raises OSError and ValueError as the read and the parse do."""
    import os

    from rsc_health.collect.sysfs import ATTR_BYTES, pure, read_bounded
    from rsc_health.compat import json_loads

    doc = json_loads(read_bounded(pure(os.path.join(root, replay.lstrip("/"))), ATTR_BYTES))
    return doc if isinstance(doc, dict) else {}


def per_sweep(limit: float, state, family: str, key: str | None = None) -> tuple[float, str]:
    """`limit`, set per sweep, over the time the rise of `family`'s counters spans, and that
    time in words. With `key`, that counter's own where its baseline is older than its
    family's (a run could not read it: checks.state.counter_time_key)."""
    sweeps = state.sweeps.get(key) if key is not None else None
    if sweeps is None:
        sweeps = state.sweeps.get(family, 1.0)
    return limit * max(1.0, sweeps), span_words(sweeps)


def span_words(sweeps: float) -> str:
    """The time a rise over `sweeps` sweeps spans, in words."""
    return "since last sweep" if sweeps <= 1 else f"over the last {sweeps * SWEEP_S / 60:.0f} min"


# No hardware error counter holds more than 63 bits (what load() keeps): a larger value, a
# negative one or one that is not an integer was not read right and must never become a delta.
MAX_COUNT = 2**63


def plausible(value) -> bool:
    if type(value) is int:  # nearly every one: a few hundred a job start
        return 0 <= value < MAX_COUNT
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT


def load(path: StrPath) -> dict:
    """The saved baselines; anything malformed (not JSON, wrong types, negative values) is
    dropped, so a corrupt file costs one sweep without deltas, never every later sweep. A
    file that is there and cannot be read at all is {"lost": why} (no baselines either)."""
    data = load_state_json(path)
    if "lost" in data:
        return {"lost": str(data["lost"])}
    raw = data.get("counters")
    clean = {
        str(k): v for k, v in (raw.items() if isinstance(raw, dict) else ())
        if plausible(v)
    }
    boot = data.get("boot_id")
    unjudged = data.get("unjudged")
    return record(boot if isinstance(boot, str) else None, clean,
                  [f for f in unjudged if isinstance(f, str)]
                  if isinstance(unjudged, list) else ())


def record(boot_id: str | None, counters: dict[str, int], unjudged=()) -> dict:
    """The file's content as load() returns it: "unjudged" (the families whose counters this
    boot's runs have not judged yet) only where there is one, so a file written before it
    existed and one with none read alike."""
    out: dict = {"boot_id": boot_id, "counters": counters}
    if unjudged:
        out["unjudged"] = sorted(set(unjudged))
    return out


def rebooted(previous: dict, boot_id: str) -> bool:
    """Whether `previous` (load()'s) is of another boot than `boot_id`: every counter was reset
    since it was written."""
    return (bool(boot_id) and "lost" not in previous
            and previous.get("boot_id") not in (None, boot_id))


def deltas(previous: dict, counters: dict[str, int], boot_id: str,
           since_boot: tuple[str, ...] = ()) -> dict[str, int]:
    """counter key -> increase since the previous sweep (only keys with a baseline).
    `since_boot`: key prefixes of counters no run of this boot has judged yet, whose rise is
    then their whole value since boot, as after a changed boot id."""
    if not previous or "lost" in previous:
        return {}
    before = previous.get("counters") or {}
    reset = rebooted(previous, boot_id)
    out = {}
    for key, now in counters.items():
        if reset or (since_boot and key.startswith(since_boot)):
            out[key] = 0 if key.endswith(LIFETIME_SUFFIXES) else now
        elif key in before:
            then = before[key]
            out[key] = now if now < then else now - then
    return out


def save(path: StrPath, counters: dict[str, int], boot_id: str, *,
         sync_dir: bool = True, unjudged=()) -> None:
    save_json(path, record(boot_id, counters, unjudged), sync_dir=sync_dir)
