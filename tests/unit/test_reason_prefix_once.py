"""The reason prefix is written once (model.REASON_PREFIX): every reason rsc-health gives Slurm,
reads back, matches in SQL or leaves alone as not its own is built from it, so a second copy
cannot drift from the one the node path writes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rsc_health.model import REASON_PREFIX
from rsc_health.policy import LEMON_MODE, parse_reason

ROOT = Path(__file__).resolve().parents[2] / "rsc_health"
# The prefix, not the log lines' "rsc_health: message" (the syslog ident's words).
SPELLED = re.compile(re.escape(REASON_PREFIX) + r"(?! )")


def prefix_literals(source: str) -> list[int]:
    """Lines of string constants (f-string parts included) spelling the prefix, docstrings
    aside."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return sorted({node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)
                   and id(node) not in docstrings and SPELLED.search(node.value)})


def test_the_reason_prefix_is_spelled_only_in_model():
    spelled = [f"rsc_health/{path.relative_to(ROOT).as_posix()}:{line}"
               for path in sorted(ROOT.rglob("*.py")) if path.name != "model.py"
               or path.parent != ROOT
               for line in prefix_literals(path.read_text())]
    assert not spelled, "spell it model.REASON_PREFIX:\n" + "\n".join(spelled)


@pytest.mark.parametrize("source, lines", [
    ('P = "rsc_health:"', [1]),
    ('x = reason.like("rsc_health:lemon:%")', [1]),
    ('R = re.compile(r"^rsc_health:(?P<mode>[a-z]+):")', [1]),
    ('s = f"rsc_health:{mode}:{code}"', [1]),
    ('print(f"rsc_health: {msg}")', []),  # the log ident, not a reason
    ('def f():\n    """`rsc_health:now:xid79:...`"""', []),
])
def test_the_scan_sees_the_prefix_spelled_out(source, lines):
    assert prefix_literals(source) == lines


def test_reasons_built_from_the_prefix_read_back_as_ours():
    from rsc_health.historian.lemons.features import LEMON_REASON_PREFIX

    assert LEMON_REASON_PREFIX == f"{REASON_PREFIX}{LEMON_MODE}:"
    assert parse_reason(f"{LEMON_REASON_PREFIX}xid_cnt:xid_cnt 6 (min 5)")["mode"] == LEMON_MODE
    assert parse_reason("rsc_healthXnow:xid79:gpu3") is None  # the prefix is matched literally
