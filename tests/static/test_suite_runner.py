"""scripts/test runs the suite in parallel, and its exit status still says what happened: with
its own pytest options, a failing test exits 1 and a run where no test ran exits 5 (never 0)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# pytest from the checkout's venv (scripts/install makes it), never the machine's python3.
EXEC = 'exec "$venv/bin/python" -m pytest '


def pytest_options() -> list[str]:
    """The options scripts/test gives pytest (its exec line, before "$@")."""
    for line in (REPO / "scripts" / "test").read_text().splitlines():
        if line.startswith(EXEC):
            words = shlex.split(line.removeprefix(EXEC))
            return [w for w in words if w != "$@"]
    raise AssertionError(f"scripts/test has no `{EXEC}` line")


def run(tmp_path: Path, *args: str) -> int:
    # Two workers, not scripts/test's four: the probe checks the exit status of a parallel run,
    # and it runs beside the whole suite on a 2-core machine, where starting four more
    # interpreters took over 120 s once (CI, stop 28). The timeout is a hang guard, not a budget.
    return subprocess.run([sys.executable, "-m", "pytest", *pytest_options(), "-n", "2", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600).returncode


def test_scripts_test_runs_the_suite_in_parallel_by_groups():
    options = pytest_options()
    assert "-n" in options and "--dist" in options
    assert options[options.index("--dist") + 1] == "loadgroup"


def test_a_failing_test_fails_the_parallel_run_and_an_empty_run_is_not_a_pass(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "def test_passes():\n    assert True\n\n\ndef test_fails():\n    assert 1 == 2\n")
    assert run(tmp_path, "test_probe.py") == 1
    assert run(tmp_path, "test_probe.py", "-k", "test_passes") == 0
    assert run(tmp_path, "test_probe.py", "-k", "no_test_has_this_name") == 5
