"""The fleet textfile in node_exporter's sticky textfile directory (deploy/systemd/
rsc-health-manager.tmpfiles.conf: 1775 root:rsc-health) stays the export timer's to replace
(User=rsc-health): an export run as root there left a file only root could replace, and every
timer run failed from then on while the file kept historian_up 1 and its install-time numbers
(helper 203)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

from rsc_health.cli import cli
from rsc_health.historian import db, schema

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to play root and the timer's user")


@pytest.fixture
def textfile_dir():
    # Outside pytest's 0700 tmp_path: the timer's user must reach these directories.
    tmp = Path(tempfile.mkdtemp(prefix="export-owner-"))
    os.chmod(tmp, 0o755)
    try:
        home = tmp / "hist"
        home.mkdir()
        os.chmod(home, 0o1777)
        url = f"sqlite:///{home / 'h.db'}"
        eng = create_engine(url)
        db.create(eng)
        eng.dispose()
        os.chmod(home / "h.db", 0o666)
        textfile = tmp / "textfile_collector"
        textfile.mkdir()
        os.chown(textfile, 0, NOBODY)          # root:rsc-health
        os.chmod(textfile, 0o1775)             # as the shipped tmpfiles.d line makes it
        yield url, home, textfile / "rsc_health_fleet.prom"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _export(url: str, out: Path):
    return CliRunner().invoke(cli, ["--config", os.devnull, "--db", url, "metrics", "export",
                                    "--out", str(out)])


def _export_as_the_timer(url: str, home: Path, out: Path) -> tuple[int, str]:
    """The timer's run as the rsc-health user (here uid/gid 65534, the directory's group)."""
    said = home / "child.txt"
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.setgroups([NOBODY])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            res = _export(url, out)
            with open(said, "w") as fh:
                fh.write(res.output)
            code = res.exit_code
        except BaseException as exc:  # noqa: BLE001
            try:
                with open(said, "w") as fh:
                    fh.write(repr(exc))
            except OSError:
                pass
            code = 99
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), said.read_text() if said.exists() else ""


def _a_node_went_silent(url: str) -> None:
    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(schema.node_runs.insert(), [{
            "node": "gpu001", "source": "sweep", "level": "ok",
            "last_seen": datetime.utcnow() - timedelta(days=1)}])
    eng.dispose()


@needs_root
def test_the_timers_export_still_updates_the_file_after_an_export_tried_as_root(textfile_dir):
    url, home, out = textfile_dir
    first = _export(url, out)  # root, during the install
    assert first.exit_code != 0, first.output
    assert not out.exists()   # nothing of root's left for the timer to trip on
    assert "systemctl start rsc-health-export.service" in first.output, first.output

    code, said = _export_as_the_timer(url, home, out)
    assert code == 0, said
    _a_node_went_silent(url)
    code, said = _export_as_the_timer(url, home, out)
    assert code == 0, said
    assert out.stat().st_uid == NOBODY
    assert 'rsc_health_node_stale{node="gpu001"} 1.0' in out.read_text(), said


@needs_root
def test_the_timers_export_names_the_root_file_it_cannot_replace(textfile_dir):
    """A file root left there (an older install's root export): the timer's export says which
    file to delete instead of a bare 'Operation not permitted' on a temporary name."""
    url, home, out = textfile_dir
    out.write_text("rsc_health_historian_up 1\n")  # root's
    code, said = _export_as_the_timer(url, home, out)
    assert code == 1, said
    assert f"rm {out}" in said, said
    assert "root (uid 0)" in said, said
    assert ".tmp" not in said, said
    # Root, asked to export there itself, says to delete its file too.
    again = _export(url, out)
    assert again.exit_code != 0 and f"rm {out}" in again.output, again.output


def test_the_readmes_install_block_runs_the_first_export_as_the_timers_user():
    text = (REPO / "README.md").read_text()
    shell = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    for line in shell.splitlines():
        if "metrics export" in line and "textfile_collector" in line:
            assert line.lstrip().startswith("sudo -u rsc-health "), line
    assert "systemctl start rsc-health-export.service" in shell
