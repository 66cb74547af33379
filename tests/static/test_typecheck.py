"""mypy on the product against scripts/mypy-baseline.txt (scripts/typecheck), and the baseline's
rule tried on a real mypy run over a small module: a new error fails, a fixed one fails until
the baseline shrinks, and --update never makes it larger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "typecheck"


def typecheck(*args: str | Path, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("RSC_HEALTH_MYPY_CACHE", None)
    if cache is not None:
        env["RSC_HEALTH_MYPY_CACHE"] = str(cache)
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)


def test_the_product_has_no_mypy_error_outside_the_baseline():
    proc = typecheck()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all in mypy-baseline.txt" in proc.stdout


def test_a_new_error_fails_a_fixed_one_must_leave_the_baseline_and_update_never_adds(tmp_path):
    module, baseline = tmp_path / "mod.py", tmp_path / "baseline.txt"
    cache = tmp_path / "mypy-cache"  # one kept across these runs: the stubs are read once
    module.write_text('x: int = "one"\n')
    first = typecheck("--update", "--baseline", baseline, module, cache=cache)
    assert first.returncode == 0  # the first one
    assert "[assignment]" in baseline.read_text()
    assert typecheck("--baseline", baseline, module, cache=cache).returncode == 0

    # Moved down a line: still the same error, no new one.
    module.write_text('\n\nx: int = "one"\ndef f() -> str:\n    return 1\n')
    proc = typecheck("--baseline", baseline, module, cache=cache)
    assert proc.returncode == 1
    assert "1 mypy error(s) not in baseline.txt" in proc.stdout
    assert ':5: error: Incompatible return value type' in proc.stdout
    assert "Incompatible types in assignment" not in proc.stdout  # the old one is known
    before = baseline.read_text()
    assert typecheck("--update", "--baseline", baseline, module, cache=cache).returncode == 1
    assert baseline.read_text() == before  # --update refuses to add

    module.write_text("x: int = 1\n")  # fixed
    proc = typecheck("--baseline", baseline, module, cache=cache)
    assert proc.returncode == 1 and "are fixed; shrink it" in proc.stdout
    assert typecheck("--update", "--baseline", baseline, module, cache=cache).returncode == 0
    assert "[assignment]" not in baseline.read_text()
    assert typecheck("--baseline", baseline, module, cache=cache).returncode == 0


def test_a_baseline_made_by_another_mypy_version_is_refused(tmp_path):
    module, baseline = tmp_path / "mod.py", tmp_path / "baseline.txt"
    module.write_text("x: int = 1\n")
    baseline.write_text("# mypy 0.1: errors\n")
    proc = typecheck("--baseline", baseline, module)
    assert proc.returncode == 2 and "install mypy==0.1" in proc.stdout
