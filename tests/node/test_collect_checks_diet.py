"""Issue 25's diet, for the collectors and the check families: every prolog imports them, so none
may import a heavy standard-library module at module level (pathlib, json, re, enum, datetime,
threading, importlib, typing...); a rare path imports one inside the function that needs it.
test_node_imports.py holds the prolog as a whole; this names the module and line at fault.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The diet's list (issue 25), plus struct (dcgm's /proc/net/tcp only).
HEAVY = {"pathlib", "json", "re", "enum", "datetime", "contextlib", "collections", "functools",
         "fnmatch", "urllib", "ipaddress", "ntpath", "warnings", "typing", "dataclasses",
         "threading", "importlib", "operator", "keyword", "reprlib", "copy", "weakref", "types",
         "struct"}
# Imported only where they are the point: procs runs programs (subprocess), for a family that
# has one to run; nvmlc is the NVML child's ctypes binding.
NOT_ON_THE_PROLOG = {"rsc_health/collect/procs.py", "rsc_health/collect/nvmlc.py"}


def _module_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import a module runs when it is imported: its top-level
    statements, into try/except and if blocks, but not `if TYPE_CHECKING:` (the type
    checker's) nor function or class bodies (run when called)."""
    found: list[tuple[int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((node.lineno, a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((node.lineno, node.module))
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody,
                             *(h.body for h in node.handlers)):
                    visit(part)

    visit(tree.body)
    return found


def test_a_collector_or_check_family_imports_no_heavy_module_at_module_level():
    offenders = []
    for package in ("rsc_health/collect", "rsc_health/checks"):
        for name in sorted(os.listdir(os.path.join(REPO, package))):
            rel = f"{package}/{name}"
            if not name.endswith(".py") or rel in NOT_ON_THE_PROLOG:
                continue
            with open(os.path.join(REPO, rel), encoding="utf-8") as f:
                tree = ast.parse(f.read(), rel)
            offenders += [f"{rel}:{line} imports {mod}" for line, mod in
                          _module_level_imports(tree) if mod.split(".")[0] in HEAVY]
    assert not offenders, offenders


ASKER = textwrap.dedent("""
    import sys, time
    from rsc_health.collect import mounts

    def slow_statvfs(path):
        time.sleep(0.3 if path.endswith("slow") else 0.0)
        if path.endswith("gone"):
            raise FileNotFoundError(2, "No such file or directory")

    mounts.statvfs = slow_statvfs
    said = []
    mounts._asker(["/m/slow", "/m/fast", "/m/gone"])(said.append)
    print(sorted((r["i"], r["error"]) for r in said))
    print("threading" in sys.modules)
""")


def test_the_statvfs_child_waits_for_every_mount_it_asks_without_threading():
    """The child asks each mount in a thread of its own and answers only once every thread
    has (a slow mount's answer is not lost to the join), with no threading module: the
    child's import is paid by every prolog (it forks before NVML is asked)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = REPO
    out = subprocess.run([sys.executable, "-c", ASKER], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert out == ["[(0, None), (1, None), (2, 'No such file or directory')]", "False"]


def test_a_path_named_or_keyed_off_pathlib_is_the_text_pathlib_made_of_it():
    """sysfs.pure stands in for str(Path(...)) wherever a path is a key (the IB reader's
    answers) or is named (refusals, replay errors, statvfs's target): the same text for
    roots and config values written any way an operator writes them. hangs._parents stands
    in for Path.parents (the runtime dir is made only below a directory root's alone)."""
    from pathlib import PurePosixPath

    from rsc_health.collect.hangs import _parents
    from rsc_health.collect.sysfs import pure

    for text in ("", ".", "./", "/", "//", "///", "//a/b", "///a", "a//b/", "./a/./b/..",
                 "/x/../y/.", "/.", "/run/rsc-health", "rel//z/", "/a b/\u00e9/\n"):
        assert pure(text) == str(PurePosixPath(text)), text
        assert pure(PurePosixPath(text)) == str(PurePosixPath(text)), text
        assert _parents(pure(text)) == [str(p) for p in PurePosixPath(text).parents], text
