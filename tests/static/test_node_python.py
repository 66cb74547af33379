"""The node side holds to Python 3.9 (RHEL 9's Python; RHEL 8 and Ubuntu 22.04 carry a 3.9 or
newer too): the modules pyproject.toml names as node-side ([tool.ruff.per-file-target-version],
py39) are checked statically with vermin (pinned in the test extra) and by a small AST rule for
what vermin leaves out (`X | Y` evaluated at run time), and both checks are shown to catch a
3.10+ construct planted in a module. tests/node/test_node_zipapp.py runs them on a real 3.9."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.nodepyz import REPO, build_node, find_python39

BUILTIN_TYPES = {"int", "float", "str", "bytes", "bool", "list", "dict", "tuple", "set",
                 "frozenset", "type", "object", "complex", "bytearray"}


def node_side() -> list[Path]:
    return [REPO / rel for rel in build_node().node_side_files(REPO)]


def vermin(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    code = "import sys; from vermin import main; sys.exit(main())"  # it has no __main__
    return subprocess.run([sys.executable, "-c", code, "--no-tips", "--violations",
                           "-t=3.9-", "-vvv", *map(str, paths)],
                          capture_output=True, text=True, timeout=300)


def _typish(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, ast.Name):
        return node.id in BUILTIN_TYPES
    if isinstance(node, ast.Subscript):
        return _typish(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _typish(node.left) or _typish(node.right)
    return False


def runtime_unions(source: str) -> list[int]:
    """Lines where `X | Y` of types is evaluated when the module runs (3.10+): anywhere but in
    an annotation of a module with `from __future__ import annotations`."""
    tree = ast.parse(source)
    lazy = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
               and any(a.name == "annotations" for a in n.names) for n in tree.body)
    skip: set[int] = set()
    if lazy:
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None:
                skip.add(id(node.annotation))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
                skip.add(id(node.returns))
            elif isinstance(node, ast.AnnAssign):
                skip.add(id(node.annotation))
    lines: list[int] = []

    def visit(node: ast.AST) -> None:
        if id(node) in skip:
            return
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
                and (_typish(node.left) or _typish(node.right))):
            lines.append(node.lineno)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return lines


def test_the_node_side_is_the_node_path_and_its_commands():
    names = {p.relative_to(REPO).as_posix() for p in node_side()}
    for module in ("rsc_health/nodepath.py", "rsc_health/engine.py", "rsc_health/compat.py",
                   "rsc_health/cli.py", "rsc_health/commands/node.py",
                   "rsc_health/historian/ingest/delivery.py", "rsc_health/checks/xid.py"):
        assert module in names or module.replace(".py", "/__init__.py") in names, module
    assert not any(n.startswith(("rsc_health/sim/", "rsc_health/report/")) for n in names)


def test_the_node_side_modules_hold_to_python_3_9():
    proc = vermin(node_side())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Minimum required versions: 3." in proc.stdout


def test_no_node_side_module_evaluates_a_type_union_at_run_time():
    found = {p.relative_to(REPO).as_posix(): runtime_unions(p.read_text()) for p in node_side()}
    assert not {k: v for k, v in found.items() if v}


def test_the_job_side_nvrx_writer_holds_to_python_3_9_outside_the_node_side():
    """rsc_health/nvrx_lines.py runs in training jobs (their own Python, 3.9 or newer), not on
    the node path: checked like the node side, and not shipped in the node zipapp."""
    module = REPO / "rsc_health" / "nvrx_lines.py"
    assert module not in node_side()
    proc = vermin([module])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert runtime_unions(module.read_text()) == []
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(module.read_text()))
                if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(module.read_text()))
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


PLANTED = {
    "match": "def f(x):\n    match x:\n        case 1:\n            return 1\n",
    "zip_strict": "def f(a, b):\n    return list(zip(a, b, strict=True))\n",
    "utc": "from datetime import UTC\n",
    "tomllib": "import tomllib\n",
    "strenum": "import enum\n\nclass S(enum.StrEnum):\n    A = 'a'\n",
    "slots": "from dataclasses import dataclass\n\n@dataclass(slots=True)\nclass C:\n    x: int\n",
}


@pytest.mark.parametrize("construct", sorted(PLANTED))
def test_vermin_fails_a_planted_3_10_construct(construct, tmp_path):
    module = tmp_path / "mod.py"
    module.write_text("from __future__ import annotations\n\n" + PLANTED[construct])
    proc = vermin([module])
    assert proc.returncode != 0, proc.stdout
    assert "Target versions not met" in proc.stdout


def test_the_union_rule_fails_a_run_time_union_and_spares_a_lazy_annotation():
    assert runtime_unions("x = 1\nok = isinstance(x, int | str)\n") == [2]
    assert runtime_unions("Alias = dict[str, int] | None\n") == [1]
    assert runtime_unions("def f(a: int | None = None) -> str | None: ...\n") == [1, 1]
    lazy = "from __future__ import annotations\n\ndef f(a: int | None) -> str | None: ...\n"
    assert runtime_unions(lazy) == []
    assert runtime_unions("flags = 1 | 2\n") == []  # bitwise or of values is not a union


def test_every_node_side_module_compiles_on_python_3_9():
    python = find_python39()
    if python is None:
        pytest.skip("no CPython 3.9 on this machine (scripts/install-python39, or set "
                    "RSC_HEALTH_TEST_PYTHON39); the "
                    "static checks above still hold the node side to 3.9")
    sources = [str(p) for p in node_side()]
    code = ("import sys\nfor f in sys.argv[1:]:\n"
            "    compile(open(f, encoding='utf-8').read(), f, 'exec')\n")
    proc = subprocess.run([python, "-c", code, *sources], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
