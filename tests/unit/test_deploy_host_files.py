"""The system user and directories (deploy/systemd/, issue 26), applied by systemd's own
tools under a scratch root: systemd-sysusers makes the user the units run as, systemd-tmpfiles
the directories with their modes, and the product's writers accept them: the export, as
rsc-health, writes the fleet file into node_exporter's textfile directory beside root's own
file, and cannot replace root's."""

from __future__ import annotations

import configparser
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from rsc_health.durable import unsafe_directory, write_atomic

REPO = Path(__file__).resolve().parents[2]
HOST = REPO / "deploy" / "systemd"

pytestmark = pytest.mark.skipif(
    not (shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles")),
    reason="systemd-sysusers / systemd-tmpfiles missing")


def _apply(root: Path, tool: str, conf: Path, *extra: str) -> None:
    with open(conf) as fh:
        done = subprocess.run([tool, f"--root={root}", *extra, "-"], stdin=fh,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def root():
    # Not pytest's tmp_path (0700): the rsc-health user must be able to reach the directories.
    path = Path(tempfile.mkdtemp(prefix="rsc-sysroot-", dir="/tmp"))
    path.chmod(0o755)
    (path / "etc").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _user(root: Path) -> tuple[int, int]:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        name, _, uid, gid, _, home, shell = line.split(":")
        if name == "rsc-health":
            assert home == "/var/lib/rsc_health" and shell.endswith("nologin")
            return int(uid), int(gid)
    raise AssertionError("no rsc-health user")


def test_the_user_is_the_one_the_manager_units_run_as(root):
    _apply(root, "systemd-sysusers", HOST / "rsc-health.sysusers.conf")
    uid, _ = _user(root)
    assert 0 < uid < 1000  # a system user
    units = [*(REPO / "deploy" / "manager").glob("*.service"),
             REPO / "checks" / "rsc-health-report.service"]
    for unit in units:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read(unit)
        assert parser["Service"]["User"] == "rsc-health", unit.name
        state = parser["Service"].get("StateDirectory")
        assert state in (None, "rsc_health"), unit.name
        if parser["Service"].get("ProtectSystem") == "strict":
            # Each opens the historian: a SQLite one (one host) writes its -wal and -shm
            # beside the database even to read, so /var/lib/rsc_health must stay writable. The
            # export had only the textfile directory, and said historian_up 0 every 5 minutes
            # over a sound historian (helper-113).
            writable = parser["Service"].get("ReadWritePaths", "").split()
            assert state == "rsc_health" or "/var/lib/rsc_health" in writable, unit.name


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as the rsc-health user")
def test_the_manager_directories_take_the_export_as_rsc_health_and_roots_file(root):
    _apply(root, "systemd-sysusers", HOST / "rsc-health.sysusers.conf")
    _apply(root, "systemd-tmpfiles", HOST / "rsc-health-manager.tmpfiles.conf", "--create")
    uid, gid = _user(root)
    textfile = root / "var/lib/node_exporter/textfile_collector"
    st = textfile.stat()
    assert stat.S_IMODE(st.st_mode) == 0o1775 and (st.st_uid, st.st_gid) == (0, gid)
    assert unsafe_directory(st) == ""  # root's writers take it: sticky
    report = (root / "var/lib/rsc_health/report").stat()
    assert (report.st_uid, stat.S_IMODE(report.st_mode)) == (uid, 0o755)
    assert stat.S_IMODE((root / "etc/rsc_health").stat().st_mode) == 0o750  # DB password
    write_atomic(textfile / "rsc_health.prom", "rsc_health_pending_drain 0\n")  # root's

    pid = os.fork()
    if pid == 0:  # the export, as rsc-health
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            write_atomic(textfile / "rsc_health_fleet.prom", "rsc_health_historian_up 1\n")
            try:
                write_atomic(textfile / "rsc_health.prom", "planted 1\n")
                code = 2  # replaced root's file: the sticky bit did not hold
            except PermissionError:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (textfile / "rsc_health_fleet.prom").stat().st_uid == uid
    assert (textfile / "rsc_health.prom").read_text() == "rsc_health_pending_drain 0\n"


def test_the_node_directories_are_the_modes_the_node_path_makes(root):
    from rsc_health import spool
    from rsc_health.node import store

    _apply(root, "systemd-tmpfiles", HOST / "rsc-health-node.tmpfiles.conf", "--create")
    state = root / "var/lib/rsc_health"
    assert stat.S_IMODE(state.stat().st_mode) == store.STATE_DIR_MODE
    assert stat.S_IMODE((state / "spool").stat().st_mode) == spool.SPOOL_DIR_MODE
    for d in (state, state / "spool", root / "var/lib/node_exporter/textfile_collector"):
        assert unsafe_directory(d.stat()) == "", d
