"""`healthctl install-units` (issue 26): the shipped units hard-coded /usr/local/bin/healthctl
while the documented install is a venv. Rendered, every command line names the healthctl of
the venv the command ran from, systemd's own verifier accepts the units, and paths a unit
cannot carry are refused rather than written broken."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_HEALTHCTL = Path(sys.executable).parent / "healthctl"
needs_venv_healthctl = pytest.mark.skipif(
    not VENV_HEALTHCTL.is_file(), reason=f"{VENV_HEALTHCTL}: rsc-health not installed here")


def _install(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "rsc_health.cli", "install-units", *args],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def _exec_lines(unit: Path) -> list[list[str]]:
    """Every Exec*= command of a unit, split as systemd does (one `sh -c` level opened)."""
    out = []
    for line in unit.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.startswith("Exec"):
            words = shlex.split(value)
            if Path(words[0]).name == "sh" and words[1:2] == ["-c"]:
                script = words[2]
                loop = re.search(r"for \w+ in ([\w ]+); do (\S+) (\w+) \"\$\w+\"", script)
                if loop:  # for what in a b; do HEALTHCTL ingest "$what" ...: each step
                    out += [[loop[2], loop[3], step] for step in loop[1].split()]
                else:
                    out += [shlex.split(part) for part in script.split("&&")]
            else:
                out.append(words)
    return out


@needs_venv_healthctl
def test_every_rendered_command_runs_this_venvs_healthctl(tmp_path):
    done = _install("all", "--dest", str(tmp_path))
    assert done.returncode == 0, done.stderr
    services = sorted(tmp_path.glob("*.service"))
    shipped = {p.name for d in ("deploy/node", "deploy/manager", "checks")
               for p in (REPO / d).glob("*.service")}
    assert {p.name for p in services} == shipped
    commands = [words for s in services for words in _exec_lines(s)]
    healthctls = [w[0] for w in commands if Path(w[0]).name == "healthctl"]
    assert len(healthctls) >= 9 and set(healthctls) == {str(VENV_HEALTHCTL)}
    assert not any("/usr/local/bin/healthctl" in line for s in services
                   for line in s.read_text().splitlines() if not line.startswith("#"))
    for service in services:
        section = configparser.ConfigParser(strict=False, interpolation=None)
        section.read(service)
        assert section["Service"]["Environment"] == f"RSC_HEALTH_PYTHON={sys.executable}"
    # The named program is there and runs (the venv's console script, not a shell's PATH).
    ran = subprocess.run([healthctls[0], "--help"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "install-units" in ran.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
@needs_venv_healthctl
def test_systemd_verifies_the_rendered_units_and_not_the_hard_coded_ones(tmp_path):
    rendered = tmp_path / "rendered"
    assert _install("all", "--dest", str(rendered)).returncode == 0
    # The sweep's script goes to /usr/local/sbin in the README's install step; here it is
    # the checkout's copy, so systemd finds an executable there as on a node.
    sweep = rendered / "rsc-health-sweep.service"
    sweep.write_text(sweep.read_text().replace("/usr/local/sbin/rsc-health-sweep",
                                               str(REPO / "checks" / "rsc-health-sweep")))
    units = sorted(str(p) for p in rendered.iterdir())
    verify = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True,
                            text=True, timeout=120)
    assert verify.returncode == 0, verify.stderr
    if not Path("/usr/local/bin/healthctl").exists():
        # What issue 26 met: the units as shipped name a program a venv install lacks.
        plain = tmp_path / "plain"
        plain.mkdir()
        shutil.copy(REPO / "deploy/node/rsc-health-flush.service", plain)
        bad = subprocess.run(["systemd-analyze", "verify", str(plain / "rsc-health-flush.service")],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "/usr/local/bin/healthctl" in bad.stderr


@needs_venv_healthctl
def test_a_node_gets_the_node_units_only(tmp_path):
    assert _install("node", "--dest", str(tmp_path)).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rsc-health-flush.service", "rsc-health-flush.timer",
        "rsc-health-sweep.service", "rsc-health-sweep.timer"]


def test_a_venv_path_a_unit_cannot_carry_is_refused(tmp_path):
    odd = tmp_path / "my venv" / "bin"
    odd.mkdir(parents=True)
    (odd / "healthctl").write_text("#!/bin/sh\n")
    out = _install("node", "--dest", str(tmp_path / "units"), "--healthctl",
                   str(odd / "healthctl"))
    assert out.returncode == 1 and "cannot name this path unquoted" in out.stderr
    assert not (tmp_path / "units").exists() or not any((tmp_path / "units").iterdir())


def test_a_missing_healthctl_is_refused(tmp_path):
    out = _install("node", "--dest", str(tmp_path), "--healthctl", "/nonexistent/bin/healthctl")
    assert out.returncode == 1 and "does not exist" in out.stderr
    assert not any(tmp_path.iterdir())


def test_a_destination_others_may_write_is_refused(tmp_path):
    dest = tmp_path / "units"
    dest.mkdir()
    dest.chmod(0o777)  # not sticky: anyone could swap a unit root then loads
    fake = tmp_path / "bin" / "healthctl"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    out = _install("node", "--dest", str(dest), "--healthctl", str(fake))
    assert out.returncode == 1 and "cannot write" in out.stderr, out.stderr
    assert not any(dest.iterdir())


def test_the_hourly_ingest_runs_every_step_when_one_fails_and_says_it_failed(tmp_path):
    """sacct failing (slurmdbd away) must not stop node events, reservations and telemetry;
    before, the unit chained them with && and an hour of events was skipped with it."""
    unit = (REPO / "deploy/manager/rsc-health-ingest.service").read_text()
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    words = shlex.split(line.partition("=")[2])
    assert Path(words[0]).name == "sh" and words[1] == "-c"
    ran = tmp_path / "ran"
    fake = tmp_path / "healthctl"
    fake.write_text(f'#!/bin/sh\necho "$2" >> {ran}\n[ "$2" != sacct ]\n')
    fake.chmod(0o755)
    script = words[2].replace("/usr/local/bin/healthctl", str(fake))
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert ran.read_text().split() == ["sacct", "events", "reservations", "telemetry"]
    assert done.returncode == 1  # the unit shows the failure
    fake.write_text(f'#!/bin/sh\necho "$2" >> {ran}\n')
    assert subprocess.run(["/bin/sh", "-c", script], timeout=60).returncode == 0
