"""The README's two commands leave the machine's Python alone (issue 26): scripts/install puts
the packages into the checkout's .venv/, scripts/demo and scripts/test run from it, and what a
test spawns (`python3`, `healthctl`, sys.executable) is that venv's, not the machine's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def _code(path: Path) -> str:
    return "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#"))


def test_install_uses_a_venv_and_never_the_system_pip():
    code = _code(SCRIPTS / "install")
    assert "--break-system-packages" not in code
    assert 'python3 -m venv "$venv"' in code
    pips = re.findall(r"^.*-m pip install.*$", code, re.M)
    assert pips and all(p.strip().startswith('"$venv/bin/python" -m pip') for p in pips), pips
    assert (REPO / ".gitignore").read_text().count("/.venv/") == 1


def test_demo_and_test_run_the_venvs_programs():
    demo, test = _code(SCRIPTS / "demo"), _code(SCRIPTS / "test")
    assert 'exec "$venv/bin/healthctl" demo' in demo
    assert 'exec "$venv/bin/python" -m pytest' in test
    assert 'PATH="$venv/bin:$PATH"' in test
    for code in (demo, test):
        assert not re.search(r"^\s*(exec\s+)?(python3|healthctl|pip3?)\b", code, re.M), code
    assert "exec scripts/test" in _code(REPO / ".ci" / "run")


# subprocess calls naming a bare program: the machine's python3, or whatever healthctl is
# first on a PATH the test may have replaced.
_BARE = re.compile(r"(?:run|Popen|check_output|check_call|call)\(\s*\[\s*"
                   r"""["'](python3|python|healthctl)["']""")


def test_no_test_spawns_a_bare_python3_or_healthctl():
    offenders = [f"{p.relative_to(REPO)}: {m.group(0)}"
                 for base in (REPO / "tests", REPO / "benchmarks")
                 for p in base.rglob("*.py") for m in _BARE.finditer(p.read_text())]
    assert not offenders, offenders


@pytest.mark.skipif(not os.environ.get("VIRTUAL_ENV"), reason="not run by scripts/test")
def test_under_scripts_test_every_python_and_healthctl_is_the_venvs():
    venv = Path(os.environ["VIRTUAL_ENV"]).resolve()
    assert Path(sys.prefix).resolve() == venv and sys.prefix != sys.base_prefix
    for program in ("python3", "healthctl", "ruff"):
        found = shutil.which(program)
        assert found and Path(found).parent.resolve() == venv / "bin", (program, found)


def test_install_never_removes_a_path_that_is_not_a_venv(tmp_path):
    keep = tmp_path / "not-a-venv"
    keep.mkdir()
    (keep / "precious").write_text("x")
    for target in (keep, tmp_path / "not-a-venv" / "precious"):
        out = subprocess.run([str(SCRIPTS / "install")], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, RSC_HEALTH_VENV=str(target)))
        assert out.returncode == 1 and "is not a virtual environment" in out.stderr
    assert (keep / "precious").read_text() == "x"


@pytest.mark.skipif(not os.environ.get("VIRTUAL_ENV"), reason="not run by scripts/test")
def test_a_second_install_into_the_same_venv_does_not_run_pip(tmp_path):
    """scripts/demo and scripts/test call scripts/install every time: with nothing changed it
    must not spend pip's seconds (the stamp), nor touch the venv."""
    venv = Path(os.environ["VIRTUAL_ENV"])
    before = (venv / ".rsc-health-installed").stat().st_mtime_ns
    start = time.monotonic()
    out = subprocess.run([str(SCRIPTS / "install")], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, RSC_HEALTH_VENV=str(venv)))
    assert out.returncode == 0, out.stderr
    assert (venv / ".rsc-health-installed").stat().st_mtime_ns == before
    print(f"scripts/install with nothing to do: {time.monotonic() - start:.2f} s")


def test_scripts_started_by_the_machines_python_go_on_in_the_venv(tmp_path):
    """scripts/typecheck and benchmarks/run (python shebangs) re-exec under the checkout's
    venv when the machine's Python starts them, with their arguments."""
    if sys.prefix != sys.base_prefix:
        pytest.skip("already in a venv: the scripts rightly stay in it")
    fake = tmp_path / "venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "in the venv: $*"\n')
    fake.chmod(0o755)
    for script in (SCRIPTS / "typecheck", REPO / "benchmarks" / "run"):
        out = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True,
                             text=True, timeout=60,
                             env=dict(os.environ, RSC_HEALTH_VENV=str(fake.parent.parent)))
        assert out.stdout.strip() == f"in the venv: {script} --quick", (script, out)
