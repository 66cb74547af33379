"""tests/cpu_account.py, the suite's CPU by test and by file, on a real nested pytest run: a
test's own CPU and its waited children's are told apart, and nothing is written without the
option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cpu_account import main, rows, summarize

REPO = Path(__file__).resolve().parents[2]
PROBE = '''
import subprocess, sys, time

def _burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_burns_in_its_own_process():
    _burn(0.4)

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c",
                    "import time\\nend = time.process_time() + 0.4\\n"
                    "while time.process_time() < end: pass"], check=True)
'''


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Not this worker's name (under xdist): the probe run is a run of its own, "main".
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "0", "-p", "tests.cpu_account", *args, "test_probe.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_own_and_children_cpu_are_told_apart_and_summed_by_file(tmp_path, capsys):
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "cpu"
    proc = _pytest(tmp_path, f"--cpu-account={out}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [p.name for p in out.iterdir()] == ["main.tsv"]
    by_test = {nodeid: figures for nodeid, *figures in rows(out)}
    own = by_test["test_probe.py::test_burns_in_its_own_process"]
    child = by_test["test_probe.py::test_burns_in_a_child"]
    assert own[0] >= 0.35 and own[1] < 0.1, own
    assert child[1] >= 0.35 and child[0] < 0.35, child
    [(name, own_s, kids_s, wall_s, tests)] = summarize(out)
    assert name == "test_probe.py" and tests == 2
    assert own_s >= 0.35 and kids_s >= 0.35 and wall_s >= 0.7
    assert main([str(out)]) == 0
    assert "test_probe.py" in capsys.readouterr().out


def test_without_the_option_nothing_is_written(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()
                  if p.name != "__pycache__") == ["test_probe.py"]
