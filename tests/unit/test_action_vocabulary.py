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
                  | {lv.label for lv in Level} | {lv.severity_word for lv in Level})
# (file, word): the same letters meaning something else.
NOT_VOCABULARY = {
    ("collect/kmsg.py", "none"),  # XID 154's recovery action as the driver prints it: "(None)"
    ("qualify/dcgm_diag.py", "fail"),  # `dcgmi diag -j`'s own result statuses
    ("qualify/dcgm_diag.py", "warn"),
    ("qualify/nccl_tests.py", "error"),  # nccl-tests' own column name before 2.13
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
        elif isinstance(node, ast.Dict) and len(node.keys) > 1:
            # {"drain_now": 0, "warn": 2, ...}: a private copy of the order or the words
            keys = [k for k in node.keys if k is not None]
            found_keys = [w for k in keys for w in _words(k)]
            words = found_keys if len(found_keys) == len(node.keys) else []
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
                           'd = ("ok", "sqlite")\n'
                           'order = {"drain_now": 0, "none": 3}\nrow = {"ok": 1, "x": 2}\n')
    assert [key for key, _ in hits] == [
        (1, "drain_now"), (2, "error"), (2, "fail"), (3, "warn"), (4, "ok"), (4, "warn"),
        (9, "drain_now"), (9, "none")]


# ---- one severity scale: a level is ranked as a Level, and leaves as its exit code or word ----
def bare_level_numbers(source: str) -> list[tuple[int, str]]:
    """(line, code) where a level or severity is taken as a number: compared with a bare int
    (`verdict.level == 4`, `f.severity >= 2`), made one (`int(verdict.level)`), or one made
    from a number (`Level(4)`). The rank is not the exit code: `Level.X` to compare,
    `.exit_code` / `Level.from_exit_code` at the edges."""
    found = []

    def levelish(node: ast.AST) -> bool:
        return ((isinstance(node, ast.Attribute) and node.attr in ("level", "severity"))
                or (isinstance(node, ast.Name) and node.id in ("level", "severity")))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(levelish(x) for x in sides) and any(
                    isinstance(x, ast.Constant) and type(x.value) is int for x in sides):
                found.append((node.lineno, ast.unparse(node)[:80]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "int" and node.args and levelish(node.args[0]):
                found.append((node.lineno, ast.unparse(node)[:80]))
            if node.func.id in ("Level", "Severity") and node.args and not (
                    isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value,
                                                                          str)):
                found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_the_product_takes_no_level_as_a_bare_number():
    found = [f"rsc_health/{path.relative_to(ROOT).as_posix()}:{line}: {code}"
             for path in sorted(ROOT.rglob("*.py"))
             for line, code in bare_level_numbers(path.read_text())]
    assert found == [], "\n".join(found)


def test_the_level_scan_sees_each_form():
    hits = bare_level_numbers("a = verdict.level == 4\nb = int(v.level)\nc = Level(data['x'])\n"
                              "d = f.severity >= 2\ne = v.level is Level.OK\n"
                              "g = Level.from_exit_code(3)\nh = x.count == 4\n")
    assert [line for line, _ in hits] == [1, 2, 3, 4]


def test_one_scale_status_exit_code_and_words_are_derived_from_it():
    """The one type: Severity is Level; its rank orders could-not-look above a warning and
    below any drain; status, exit code and the stored words come from it and round-trip."""
    assert Severity is Level
    assert Level.OK < Level.WARN < Level.UNKNOWN < Level.DRAIN_AFTER_JOB < Level.DRAIN_NOW
    assert Level.UNKNOWN is Level.CHECKER_ERROR and Severity.NONE is Level.OK
    assert [lv.exit_code for lv in Level] == [0, 1, 4, 2, 3]  # README "Exit codes"
    assert all(Level.from_exit_code(lv.exit_code) is lv for lv in Level)
    assert [lv.status for lv in Level] == [Status.OK, Status.WARN, Status.ERROR, Status.FAIL,
                                           Status.FAIL]
    assert [lv.label for lv in Level] == ["ok", "warn", "checker_error", "drain_after_job",
                                          "drain_now"]
    words = ["none", "warn", "drain_after_job", "drain_now"]
    assert [Level.parse(w).severity_word for w in words] == words
    for bad in ("ok", "checker_error", "unknown", "", "drain"):
        try:
            Level.parse(bad)
        except KeyError:
            continue
        raise AssertionError(f"{bad!r} parsed as a finding severity")


def mismatched_findings(source: str) -> list[tuple[int, str]]:
    """(line, code) for a Finding(...) whose literal status is not the one its literal
    severity derives (Level.status), a checker error (status ERROR, severity NONE) aside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "Finding"):
            continue
        given = {k.arg: k.value for k in node.keywords}
        status = node.args[2] if len(node.args) > 2 else given.get("status")
        severity = node.args[3] if len(node.args) > 3 else given.get("severity")
        if not (isinstance(status, ast.Attribute) and isinstance(status.value, ast.Name)
                and status.value.id == "Status" and isinstance(severity, ast.Attribute)
                and isinstance(severity.value, ast.Name)
                and severity.value.id in ("Severity", "Level")):
            continue
        st, sev = Status[status.attr], Level[severity.attr]
        if st is not (Status.ERROR if st is Status.ERROR and sev is Level.NONE else sev.status):
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_every_finding_the_product_makes_says_the_status_its_level_derives():
    found = [f"rsc_health/{path.relative_to(ROOT).as_posix()}:{line}: {code}"
             for path in sorted(ROOT.rglob("*.py")) if "sim" not in path.parts
             for line, code in mismatched_findings(path.read_text())]
    assert found == [], "\n".join(found)
    assert mismatched_findings('Finding("x", "c", Status.FAIL, Severity.WARN, "r")\n'
                               'Finding("x", "c", Status.ERROR, Severity.NONE, "r")\n'
                               'Finding("x", "c", Status.OK, Level.DRAIN_NOW, "r")\n'
                               'Finding(family="x", component="c", status=Status.WARN,\n'
                               '        severity=Severity.DRAIN_NOW, reason="r")\n') == [
        (1, "Finding('x', 'c', Status.FAIL, Severity.WARN, 'r')"),
        (3, "Finding('x', 'c', Status.OK, Level.DRAIN_NOW, 'r')"),
        (4, "Finding(family='x', component='c', status=Status.WARN, severity=Severity.DRAIN_N")]


def test_the_finding_helpers_derive_the_status_and_refuse_a_fail_that_only_warns():
    import pytest

    from rsc_health.checks import _finding as mk

    made = [mk.ok("f", "c"), mk.warn("f", "c", "w", "r"),
            mk.fail("f", "c", Severity.DRAIN_NOW, "d", "r", repair=False),
            mk.fail("f", "c", Severity.DRAIN_AFTER_JOB, "d", "r", repair=True),
            mk.checker_error("f", "c", "r")]
    assert [f.status for f in made] == [Status.OK, Status.WARN, Status.FAIL, Status.FAIL,
                                        Status.ERROR]
    assert all(f.level.status is f.status for f in made)
    with pytest.raises(ValueError):
        mk.fail("f", "c", Severity.WARN, "w", "r", repair=False)
