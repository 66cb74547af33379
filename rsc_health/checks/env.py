"""What a family's collector is given (`CollectEnv`), in a module of its own so a family
file can name it without importing the registry that imports the family
(tests/unit/test_import_graph.py)."""

from __future__ import annotations

import os

from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


@dataclass(frozen=True)
class CollectEnv:
    """What a collector may need beyond the root: the config; the time.monotonic() by which
    it must have returned (None: no stage budget, e.g. `healthctl check`); and for the run's
    own bookkeeping the state being filled (errors, probes asked and hung), the kernel-log
    cursors by family (xid, sxid), the probes on record as hanging and the statvfs timeout."""

    cfg: Any
    deadline: float | None = None
    state: Any = None
    cursors: dict = field(default_factory=dict)
    hangs_before: dict = field(default_factory=dict)
    probe_timeout_s: float | None = None
    # What several families read from one source, read once a run and shared (the InfiniBand
    # ports: rsc_health.collect.ibports).
    shared: dict = field(default_factory=dict)
    # The node path's stage ("prolog", "epilog", "sweep"), None for `healthctl check`.
    stage: str | None = None

    def guard(self, family: str, source: str, fn: Callable[[], Any]) -> Any:
        """fn(), or None with a checker finding naming `source` when it raises."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a collector bug is a checker finding
            self.state.errors.append((family, source, f"{type(exc).__name__}: {exc}"))
            return None


def replayed(root, cfg, section: str, what: str) -> dict | None:
    """The record `[section] replay_file` names under the root (what a snapshot carried for a
    family with `replays=True`), or None when the key is empty and the live node is read. A
    record that is not a JSON object raises, naming `what` it should have been: the family's
    collect turns that into a checker finding."""
    from rsc_health.collect.sysfs import pure, read_bounded
    from rsc_health.compat import json_loads

    replay = str(cfg.get(f"{section}.replay_file") or "")
    if not replay:
        return None
    doc = json_loads(read_bounded(pure(os.path.join(root, replay.lstrip("/")))))
    if not isinstance(doc, dict):
        raise ValueError(f"{replay}: not a record of {what}")
    return doc
