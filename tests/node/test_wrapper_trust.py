"""What the shipped Prolog=/Epilog=/sweep scripts run as root: the interpreter
(RSC_HEALTH_PYTHON, or `python3` on PATH), the node zipapp (RSC_HEALTH_PYZ) and the site's
/etc/default/rsc-health they take both from. Each must be something no one but root could have
written or swapped: the file root's and writable by no one else, and every directory on the
way to it (a symlink's own directory, then its target's) likewise or sticky -- the rule
rsc_health.durable.trust_refusal holds the site config and the site checks to. Before, the
scripts ran whatever those names pointed at: an unprivileged user who could write the file, a
directory above it, or the place a symlink led had their code run as root on every job start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.nodes.node_copy import copy_node

from .test_wrappers import EPILOG, PROLOG, REPO

SWEEP = REPO / "checks" / "rsc-health-sweep"
# slurmctld's reconfigure hook, which sources the same defaults file (docs/suspects.md)
TRIGGER = REPO / "deploy" / "slurm" / "rsc-health-suspects-trigger"
NOBODY = 65534  # an unprivileged user
SCRIPTS = [PROLOG, EPILOG, SWEEP]
IDS = ["prolog", "epilog", "sweep"]


@pytest.fixture
def env(tmp_path):
    """A healthy node as tests/node/test_wrappers.py runs the scripts on it."""
    root = copy_node(tmp_path / "node")
    defaults = tmp_path / "defaults"
    defaults.write_text("")
    empty_bin = tmp_path / "bin"  # no scontrol
    empty_bin.mkdir()
    return {
        "PATH": f"{empty_bin}:/usr/bin:/bin", "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO), "RSC_HEALTH_DEFAULTS": str(defaults),
        "RSC_HEALTH_ROOT": str(root), "RSC_HEALTH_CONFIG": str(root / "config.toml"),
        "SLURMD_NODENAME": "node01", "SLURM_JOB_ID": "77",
        "RSC_HEALTH_PYTHON": os.environ.get("RSC_HEALTH_TEST_PYTHON", sys.executable),
    }


def _python_that_marks(path: Path, marker: Path, real: str) -> Path:
    """An 'interpreter' that leaves `marker` and then runs the real one (a planted python)."""
    path.write_text(f"#!/bin/sh\ntouch '{marker}'\nexec '{real}' \"$@\"\n")
    path.chmod(0o755)
    return path


def _dir(path: Path, owner: int = 0, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, owner, 0)
    path.chmod(mode)
    return path


def _plant(how: str, tmp: Path, marker: Path, real: str) -> dict[str, str]:
    """The environment settings that point the script at something a user can change."""
    mine, theirs = _dir(tmp / "root-owned"), _dir(tmp / "theirs", NOBODY)
    if how == "python owned by a user":
        p = _python_that_marks(mine / "python3", marker, real)
        os.chown(p, NOBODY, 0)
        return {"RSC_HEALTH_PYTHON": str(p)}
    if how == "python writable by its group":
        p = _python_that_marks(mine / "python3", marker, real)
        p.chmod(0o775)
        return {"RSC_HEALTH_PYTHON": str(p)}
    if how == "python in a directory a user owns":
        return {"RSC_HEALTH_PYTHON": str(_python_that_marks(theirs / "python3", marker, real))}
    if how == "root's symlink to a user's python":
        target = _python_that_marks(theirs / "python3", marker, real)
        (mine / "python3").symlink_to(target)
        return {"RSC_HEALTH_PYTHON": str(mine / "python3")}
    if how == "root's python through a symlink in a user's directory":
        target = _python_that_marks(mine / "python3", marker, real)
        (theirs / "python3").symlink_to(target)  # they can swap this link at will
        os.lchown(theirs / "python3", 0, 0)
        return {"RSC_HEALTH_PYTHON": str(theirs / "python3")}
    if how == "python3 on PATH in a world-writable directory":
        ww = _dir(tmp / "world-writable", 0, 0o777)
        _python_that_marks(ww / "python3", marker, real)
        return {"RSC_HEALTH_PYTHON": "", "PATH_FIRST": str(ww)}
    if how == "zipapp owned by a user":
        pyz = theirs / "rsc-health-node.pyz"
        pyz.write_text(f"open({str(marker)!r}, 'w').write('owned')\n")
        return {"RSC_HEALTH_PYZ": str(pyz)}
    if how == "zipapp under a world-writable directory":
        ww = _dir(tmp / "world-writable", 0, 0o777)
        pyz = _dir(ww / "opt") / "rsc-health-node.pyz"  # ww/opt can be renamed away
        pyz.write_text(f"open({str(marker)!r}, 'w').write('owned')\n")
        return {"RSC_HEALTH_PYZ": str(pyz)}
    raise AssertionError(how)


PLANTS = ["python owned by a user", "python writable by its group",
          "python in a directory a user owns", "root's symlink to a user's python",
          "root's python through a symlink in a user's directory",
          "python3 on PATH in a world-writable directory", "zipapp owned by a user",
          "zipapp under a world-writable directory"]


def _run(script: Path, base: dict, settings: dict[str, str], defaults: Path) -> \
        subprocess.CompletedProcess:
    lines = [f"{k}={v}" for k, v in settings.items() if k != "PATH_FIRST"]
    env = dict(base)
    if "PATH_FIRST" in settings:
        env["PATH"] = f"{settings['PATH_FIRST']}:{env['PATH']}"
        env.pop("RSC_HEALTH_PYTHON")
    defaults.write_text("\n".join(lines) + "\n")
    return subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
@pytest.mark.parametrize("how", PLANTS)
def test_an_interpreter_or_zipapp_a_user_can_change_is_never_run_as_root(
        script, how, env, tmp_path):
    marker = tmp_path / "ran-as-root"
    settings = _plant(how, tmp_path / "plant", marker, env["RSC_HEALTH_PYTHON"])
    out = _run(script, env, settings, Path(env["RSC_HEALTH_DEFAULTS"]))
    assert not marker.exists(), how
    assert "refused" in out.stderr and "rsc_health:" in out.stderr, out.stderr
    # The job is not drained for a broken install; the sweep says it failed.
    assert out.returncode == (1 if script == SWEEP else 0), out.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
@pytest.mark.parametrize("tool", ["stat", "readlink", "logger"])
def test_the_rules_own_tools_are_never_taken_from_a_users_directory_on_path(script, tool, env,
                                                                            tmp_path):
    """The check runs stat and readlink (and says a refusal through logger) on every job
    start: from the system's own directories, never the first `stat` on a PATH a site set
    with a directory anyone may write (the Python found there is refused by the rule, the
    rule's own tools must not be found there either)."""
    marker = tmp_path / "ran-as-root"
    ww = _dir(tmp_path / "world-writable", 0, 0o777)
    planted = ww / tool
    planted.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 1\n")
    planted.chmod(0o755)
    venv = _dir(tmp_path / "venv" / "bin")  # a symlink on the way: readlink is asked
    (venv / "python3").symlink_to(env["RSC_HEALTH_PYTHON"])
    lines = [f"RSC_HEALTH_PYTHON={venv / 'python3'}"]
    if tool == "logger":  # said only for a refusal: make one
        lines = [f"RSC_HEALTH_PYTHON={ww / 'python3'}"]
        _python_that_marks(ww / "python3", tmp_path / "python-ran", env["RSC_HEALTH_PYTHON"])
    Path(env["RSC_HEALTH_DEFAULTS"]).write_text("\n".join(lines) + "\n")
    env = dict(env, PATH=f"{ww}:{env['PATH']}")
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists(), out.stderr
    assert not (tmp_path / "python-ran").exists()


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_a_site_defaults_file_a_user_can_write_is_never_sourced_by_root(
        script, env, tmp_path):
    marker = tmp_path / "ran-as-root"
    defaults = Path(env["RSC_HEALTH_DEFAULTS"])
    defaults.write_text(f"touch '{marker}'\n")
    os.chown(defaults, NOBODY, 0)
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists()
    assert "refused" in out.stderr and str(defaults) in out.stderr, out.stderr
    assert out.returncode == (1 if script == SWEEP else 0), out.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_roots_own_python_through_roots_own_symlinks_still_runs(
        script, env, tmp_path):
    """A venv's bin/python3 is a symlink to the system's: root's all the way, so it runs."""
    marker = tmp_path / "ran"
    mine = _dir(tmp_path / "venv" / "bin")
    real = _python_that_marks(_dir(tmp_path / "usr" / "bin") / "python3.9", marker,
                              env["RSC_HEALTH_PYTHON"])
    (mine / "python3").symlink_to(os.path.relpath(real, mine))
    out = _run(script, env, {"RSC_HEALTH_PYTHON": str(mine / "python3")},
               Path(env["RSC_HEALTH_DEFAULTS"]))
    assert marker.exists() and "refused" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr


def test_the_three_scripts_hold_one_trust_rule():
    """The rule is written out in each script (none can source a helper it has not yet
    checked); they must not drift apart."""
    def rule(path: Path) -> str:
        text = path.read_text()
        start, end = text.index("# >>> trust rule"), text.index("# <<< trust rule")
        return text[start:end]
    assert rule(PROLOG) == rule(EPILOG) == rule(SWEEP) == rule(TRIGGER)



@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
@pytest.mark.parametrize("line", [
    # valid for systemd's EnvironmentFile= (the flush unit reads the same file), not for sh
    "RSC_HEALTH_DB=postgresql+psycopg://rsc_health_node:s3cr(t@db/rsc_health",
    "RSC_HEALTH_CONFIG='/etc/rsc_health/config.toml",  # an unclosed quote
    # valid syntax, but dash ends the sourced file there: the lines after it were dropped
    "export RSC-HEALTH-DB=x",
])
def test_a_defaults_file_sh_cannot_parse_is_said_and_drains_nothing(script, line, env, tmp_path):
    """`. FILE` is a special builtin: dash ended the whole script with exit 2 at a syntax error
    in it, and slurmd drained every node a job started or ended on ("Prolog error", a reason
    rsc-health never lifts) after one push of the file (helper-113). Now the file is refused
    as a file others could write is: said, the prolog and epilog exit 0, the sweep 1."""
    marker = tmp_path / "python-ran"
    real = env["RSC_HEALTH_PYTHON"]
    python = _python_that_marks(_dir(tmp_path / "venv" / "bin") / "python3", marker, real)
    defaults = Path(env["RSC_HEALTH_DEFAULTS"])
    defaults.write_text(f"RSC_HEALTH_PYTHON={python}\n{line}\nexport RSC_HEALTH_PYTHON\n")
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == (1 if script == SWEEP else 0), out.stderr
    assert f"{defaults}: not valid sh; refused" in out.stderr, out.stderr
    assert "quote any value" in out.stderr and not marker.exists()


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_a_defaults_file_whose_last_line_returns_non_zero_is_still_the_sites(
        script, env, tmp_path):
    """Only a file sh cannot parse is refused: a valid one whose last command returns 1 (a test
    that did not hold) is sourced, and what it set is used."""
    marker = tmp_path / "python-ran"
    python = _python_that_marks(_dir(tmp_path / "venv" / "bin") / "python3", marker,
                                env["RSC_HEALTH_PYTHON"])
    defaults = Path(env["RSC_HEALTH_DEFAULTS"])
    defaults.write_text(f"RSC_HEALTH_PYTHON={python}\nexport RSC_HEALTH_PYTHON\n"
                        "[ -x /nonexistent/scontrol ] && PATH=/nonexistent:$PATH\n")
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert marker.exists() and "refused" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr


def test_the_suspects_trigger_sources_only_a_defaults_file_no_one_else_could_write(env,
                                                                                  tmp_path):
    """The reconfigure hook runs as SlurmUser or root on the slurmctld host and sourced
    /etc/default/rsc-health whatever its owner. It now holds the wrappers' trust rule."""
    marker = tmp_path / "ran-as-root"
    defaults = Path(env["RSC_HEALTH_DEFAULTS"])
    defaults.write_text(f"touch '{marker}'\n")
    os.chown(defaults, NOBODY, 0)
    out = subprocess.run([str(TRIGGER)], env=env, capture_output=True, text=True, timeout=60)
    assert not marker.exists() and out.returncode == 1
    assert "refused" in out.stderr and str(defaults) in out.stderr, out.stderr


def test_the_suspects_trigger_finds_the_readmes_healthctl_without_path(env, tmp_path):
    """slurmctld runs triggers with a bare PATH and the defaults example's PATH does not name
    the venv: the hook exited 127 ("healthctl: not found") and the tier waited for the timer
    (helper-113). Unset RSC_HEALTH_HEALTHCTL: `healthctl` on PATH, else the README's venv;
    set, it is used as given."""
    marker = tmp_path / "healthctl-ran"
    fake = _dir(tmp_path / "bin2") / "healthctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > '{marker}'\n")
    fake.chmod(0o755)
    Path(env["RSC_HEALTH_DEFAULTS"]).write_text(f"RSC_HEALTH_HEALTHCTL={fake}\n")
    out = subprocess.run([str(TRIGGER)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert marker.read_text().strip() == "suspects apply"
    Path(env["RSC_HEALTH_DEFAULTS"]).write_text("")
    out = subprocess.run([str(TRIGGER)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 127 and "healthctl" in out.stderr  # nothing here to find
