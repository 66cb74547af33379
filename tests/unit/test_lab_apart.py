"""The lab (rsc_health.sim: simulator, demo data, tuning) is apart from the product.

Read from the source with ast, not by importing: every import statement in every product module
(rsc_health/ outside rsc_health/sim/), at module level or inside a function, `import x`,
`from x import y` and relative forms alike, plus `importlib.import_module("...")` with a literal
name. The one exception is rsc_health/commands/lab.py, the lab commands' module, and only inside
function bodies (so `healthctl --help` loads no lab code); cli.LAB_COMMANDS is what reaches it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import rsc_health

PACKAGE = Path(rsc_health.__file__).resolve().parent
LAB = "rsc_health.sim"
LAB_COMMANDS_MODULE = "rsc_health.commands.lab"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")  # one dot: the module's package (an __init__ is its own)
    stem = base[: len(base) - node.level]
    return ".".join(stem + ([node.module] if node.module else []))


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import in `path`."""
    module = _module_name(path)
    if path.name == "__init__.py":
        module += ".__init__"  # relative imports resolve against the package
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                              | ast.Lambda)
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(module, child)
                found.append((target, child.lineno, in_function))
                found.extend((f"{target}.{a.name}", child.lineno, in_function)
                             for a in child.names)
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                  and child.func.attr == "import_module" and child.args
                  and isinstance(child.args[0], ast.Constant)
                  and isinstance(child.args[0].value, str)):
                found.append((child.args[0].value, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def _is_lab(name: str) -> bool:
    return name == LAB or name.startswith(LAB + ".")


def product_modules() -> list[Path]:
    lab_dir = PACKAGE / "sim"
    return sorted(p for p in PACKAGE.rglob("*.py") if lab_dir not in p.parents)


def test_no_product_module_imports_the_lab():
    offenders = []
    for path in product_modules():
        name = _module_name(path)
        for target, line, in_function in imports(path):
            if not _is_lab(target):
                continue
            if name == LAB_COMMANDS_MODULE and in_function:
                continue
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not offenders, "the product imports the lab:\n" + "\n".join(offenders)


def test_the_scan_sees_every_form_of_import(tmp_path, monkeypatch):
    """The scanner itself, on a module that reaches the lab each way it could."""
    pkg = tmp_path / "rsc_health" / "historian"
    pkg.mkdir(parents=True)
    mod = pkg / "bad.py"
    mod.write_text(
        "import rsc_health.sim.core\n"
        "from rsc_health import sim\n"
        "from ..sim.tune import choose\n"
        "def later():\n"
        "    from rsc_health.sim.historian import ingest_fleet\n"
        "    import importlib\n"
        "    return importlib.import_module('rsc_health.sim.demo')\n"
    )
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "rsc_health")
    got = [(t, line, f) for t, line, f in imports(mod) if _is_lab(t)]
    assert ("rsc_health.sim.core", 1, False) in got
    assert ("rsc_health.sim", 2, False) in got  # `from rsc_health import sim`
    assert ("rsc_health.sim.tune", 3, False) in got
    assert ("rsc_health.sim.historian", 5, True) in got
    assert ("rsc_health.sim.demo", 7, True) in got


def test_the_lab_commands_are_the_ones_that_load_the_lab():
    from rsc_health import cli

    assert set(cli.LAB_COMMANDS) == {"sim", "demo", "tune-lemons"}
    assert all(t.startswith("lab:") for t in cli.LAB_COMMANDS.values())
    assert not any(t.startswith("lab:") for t in cli.LAZY_COMMANDS.values())
    assert not set(cli.LAB_COMMANDS) & set(cli.LAZY_COMMANDS)
    lab_file = PACKAGE / "commands" / "lab.py"
    at_top = [t for t, _line, inside in imports(lab_file) if _is_lab(t) and not inside]
    assert not at_top, at_top


def test_a_product_command_does_not_load_the_lab(tmp_path):
    """`healthctl --help` and a product command run without the lab in sys.modules."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from rsc_health.cli import cli as main\n"
        "r = CliRunner().invoke(main, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'tune-lemons' in r.output and 'demo' in r.output\n"
        "r = CliRunner().invoke(main, ['config', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "lab = sorted(m for m in sys.modules if m == 'rsc_health.sim' "
        "or m.startswith('rsc_health.sim.'))\n"
        "assert not lab, lab\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path,
                   env=dict(os.environ))
