"""One vocabulary: every action word the report reads is one some producer writes, so the
report can never say "guard not triggered, 0 drains" above a table of drains and guard trips."""

from __future__ import annotations

import ast
from pathlib import Path

from rsc_health.model import DRAIN_KINDS, ActionKind, Level, Severity, Status
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


# ---- the whole product: no action, status, severity or level word compared as a bare string ----
# The words, from the enums and nowhere else.
WORDS = frozenset({k.value for k in ActionKind} | {s.value for s in Status}
                  | {s.label for s in Severity} | {lv.label for lv in Level})
# (file, word): the same letters meaning something else.
NOT_VOCABULARY = {
    ("collect/kmsg.py", "none"),  # XID 154's recovery action as the driver prints it: "(None)"
    ("qualify/dcgm_diag.py", "fail"),  # `dcgmi diag -j`'s own result statuses
    ("qualify/dcgm_diag.py", "warn"),
}
SET_CALLS = ("in_", "notin_", "not_in", "isin")


def _words(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and e.value in WORDS]


def bare_vocabulary(source: str) -> list[tuple[tuple[int, str], str]]:
    """((line, word), code) for every vocabulary word the code compares as a bare string:
    `x == "drain_now"`, `x in ("fail", "error")`, `col.in_(("warn", "fail"))`, and literal
    copies of the vocabulary (`("ok", "warn", "fail", "error")`) kept to compare against."""
    found = []
    for node in ast.walk(ast.parse(source)):
        words: list[str] = []
        if isinstance(node, ast.Compare):
            for op, left, right in zip(node.ops, [node.left, *node.comparators[:-1]],
                                       node.comparators, strict=True):
                if isinstance(op, (ast.Eq, ast.NotEq)):
                    words += _words(left) if isinstance(left, ast.Constant) else []
                    words += _words(right) if isinstance(right, ast.Constant) else []
                elif isinstance(op, (ast.In, ast.NotIn)) and not isinstance(right, ast.Constant):
                    words += _words(right) if isinstance(right, (ast.Tuple, ast.List,
                                                                 ast.Set)) else []
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in SET_CALLS):
            words = [w for arg in node.args for w in _words(arg)]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1:
            words = _words(node) if len(_words(node)) == len(node.elts) else []
        found += [(node.lineno, w, ast.unparse(node)[:80]) for w in words]
    return sorted({(line, w): code for line, w, code in found}.items())


def test_the_product_compares_no_action_status_or_severity_word_as_a_bare_string():
    """Issue 21: `lemon_repairs` matched "drain" after lemon drains became "lemon_drain", and
    nothing noticed; a word compared bare drifts from the enum silently. Use the enums."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += [f"rsc_health/{rel}:{line}: {word!r} in {code}"
                  for (line, word), code in bare_vocabulary(path.read_text())
                  if (rel, word) not in NOT_VOCABULARY]
    assert found == [], "\n".join(found)


def test_the_scan_sees_each_form_and_leaves_other_words_alone():
    hits = bare_vocabulary('a == "drain_now"\nif s in ("fail", "error"): pass\n'
                           'q = c.status.in_(("warn", "x"))\nLEVELS = ("ok", "warn")\n'
                           '"error" in answer\nb == "drain"\nc == Status.OK\n'
                           'd = ("ok", "sqlite")\n')
    assert [key for key, _ in hits] == [
        (1, "drain_now"), (2, "error"), (2, "fail"), (3, "warn"), (4, "ok"), (4, "warn")]
