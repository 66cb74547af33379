"""The shipped Prolog=/Epilog= scripts: any non-zero exit of a prolog or epilog makes slurmd
drain the node, so only the prolog's drain verdict may leave them non-zero. A Python that is
missing, or an rsc_health that cannot be imported (a broken rollout), lets the job run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.nodes.node_copy import copy_node

REPO = Path(__file__).resolve().parents[2]
PROLOG = REPO / "prolog" / "rsc-health-prolog"
EPILOG = REPO / "epilog" / "rsc-health-epilog"
XID79 = "4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"


@pytest.fixture
def env(tmp_path):
    root = copy_node(tmp_path / "node")
    defaults = tmp_path / "defaults"
    defaults.write_text("")  # no /etc/default/rsc-health on the test machine
    empty_bin = tmp_path / "bin"  # no scontrol: a drain verdict stays pending, the code shows
    empty_bin.mkdir()
    return {
        "PATH": f"{empty_bin}:/usr/bin:/bin", "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO), "RSC_HEALTH_DEFAULTS": str(defaults),
        "RSC_HEALTH_ROOT": str(root), "RSC_HEALTH_CONFIG": str(root / "config.toml"),
        "SLURMD_NODENAME": "node01", "SLURM_JOB_ID": "77",
        # The Python running the tests (scripts/test: the checkout's venv), not a bare
        # `python3` on PATH, which is the machine's and need not have click.
        "RSC_HEALTH_PYTHON": os.environ.get("RSC_HEALTH_TEST_PYTHON", sys.executable),
    }


def _broken_python(tmp_path: Path) -> str:
    fake = tmp_path / "python-broken"
    fake.write_text("#!/bin/sh\necho '/usr/bin/python3: No module named rsc_health' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    return str(fake)


def _run(script: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)


def test_a_healthy_node_prolog_exits_0(env):
    assert _run(PROLOG, env).returncode == 0


def test_a_drain_verdict_still_fails_the_prolog(env):
    with open(Path(env["RSC_HEALTH_ROOT"]) / "dev/kmsg", "a") as fh:
        fh.write(XID79)
    out = _run(PROLOG, env)
    assert out.returncode == 1, out.stderr
    assert "DRAIN_NOW" in out.stderr


@pytest.mark.parametrize("script", [PROLOG, EPILOG], ids=["prolog", "epilog"])
def test_an_rsc_health_that_cannot_import_lets_the_job_run(script, env, tmp_path):
    env["RSC_HEALTH_PYTHON"] = _broken_python(tmp_path)
    out = _run(script, env)
    assert out.returncode == 0
    assert "could not run (exit 1" in out.stderr


@pytest.mark.parametrize("script", [PROLOG, EPILOG], ids=["prolog", "epilog"])
def test_a_missing_python_lets_the_job_run(script, env, tmp_path):
    env["RSC_HEALTH_PYTHON"] = str(tmp_path / "no-such-python")
    out = _run(script, env)
    assert out.returncode == 0
    assert "could not run (exit 127" in out.stderr


@pytest.mark.parametrize("script,stage", [(PROLOG, "prolog"), (EPILOG, "epilog"),
                                          (REPO / "checks" / "rsc-health-sweep", "sweep")])
def test_each_script_starts_python_without_runpy(script, stage):
    # `python -m` imports runpy and its dependencies on every job start (7.8 ms of a 17.9 ms
    # bare start); the scripts run the one entry the benchmark times.
    from rsc_health.node.start import JOB_START_CODE

    text = script.read_text()
    assert f"-c '{JOB_START_CODE}' {stage}" in text
    assert "-m rsc_health.nodepath" not in text


def test_the_script_entry_and_python_m_give_the_same_exit(env, tmp_path):
    from rsc_health.node.start import JOB_START_CODE

    with open(Path(env["RSC_HEALTH_ROOT"]) / "dev/kmsg", "a") as fh:
        fh.write(XID79)
    env = dict(env, RSC_HEALTH_DRAIN_EXIT="75")
    python = env["RSC_HEALTH_PYTHON"]
    by_c = subprocess.run([python, "-c", JOB_START_CODE, "prolog"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert by_c.returncode == 75, by_c.stderr  # the XID 79 verdict, through the -c entry
    usage = subprocess.run([python, "-c", JOB_START_CODE, "nonsense"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage:" in usage.stderr


@pytest.mark.parametrize("script", [PROLOG, EPILOG, REPO / "checks" / "rsc-health-sweep"],
                         ids=["prolog", "epilog", "sweep"])
@pytest.mark.parametrize("planted", ["json.py", "rsc_health/__init__.py"])
def test_a_module_planted_in_the_working_directory_is_never_imported(script, planted, env,
                                                                     tmp_path):
    """`python -c` puts the working directory first on sys.path, ahead of the standard
    library and rsc_health. slurmd runs its prologs in its own working directory, /var/tmp
    when its log and spool directories are not writable (slurmd's _set_work_dir), and an
    operator may start a script from /tmp: any user could plant json.py (or an rsc_health
    package) there and have root run it."""
    cwd = tmp_path / "vartmp"
    cwd.mkdir()
    cwd.chmod(0o1777)  # /var/tmp, /tmp: anyone may add a name
    marker = tmp_path / "ran-as-root"
    module = cwd / planted
    module.parent.mkdir(exist_ok=True)
    module.write_text(f"open({str(marker)!r}, 'w').write('owned')\n")
    out = subprocess.run([str(script)], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=120)
    assert not marker.exists()
    assert out.returncode == 0, out.stderr
