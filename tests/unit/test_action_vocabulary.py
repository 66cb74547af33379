"""One vocabulary: every action word the report reads is one some producer writes, so the
report can never say "guard not triggered, 0 drains" above a table of drains and guard trips."""

from __future__ import annotations

import ast
from pathlib import Path

from rsc_health.model import DRAIN_KINDS, ActionKind
from rsc_health.report import gather

ROOT = Path(__file__).resolve().parents[2] / "rsc_health"
LEGACY = {"drain"}  # lemon drains written before ActionKind, still in old historians


def _kinds_used_by_producers() -> set[str]:
    used = set()
    for path in ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "ActionKind"):
                used.add(ActionKind[node.attr].value)
    return used


def test_every_action_the_report_reads_is_written_by_some_producer():
    produced = _kinds_used_by_producers()
    for word in (*gather.GUARD_ACTIONS, *gather.DRAIN_ACTIONS):
        assert word in produced or word in LEGACY, word


def test_the_report_counts_the_drains_and_guard_trips_the_node_path_writes():
    import pandas as pd

    actions = pd.DataFrame({"action": ["drain_now", "drain_after_job", "guard_tripped",
                                       "lemon_drain", "requeue"],
                            "node": ["a", "b", "c", "d", "a"]})
    state = gather.guard_state(actions, 24)
    assert state["state"] == "triggered" and state["held"] == 1
    quiet = gather.guard_state(actions[actions["action"] != "guard_tripped"], 24)
    assert quiet["detail"].startswith("3 drain(s)")
    assert {k.value for k in DRAIN_KINDS} <= set(gather.DRAIN_ACTIONS)
