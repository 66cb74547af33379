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
    # One export to stdout as root first, so that every module it needs is imported: this
    # machine's interpreter may sit where the stand-in user cannot read (a deployment
    # installs it readable). It writes no file.
    warm = CliRunner().invoke(cli, ["--config", os.devnull, "--db", url, "metrics", "export"])
    assert warm.exit_code == 0, warm.output

    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.setgroups([NOBODY])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            res = _export(url, out)
            with open(said, "w") as fh:
                fh.write(res.output + ("" if res.output else repr(res.exception)))
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
def test_the_timers_export_updates_the_file_when_run_as_the_readme_says(textfile_dir):
    """The README's first export is the timer's service (its user), not root's."""
    url, home, out = textfile_dir
    code, said = _export_as_the_timer(url, home, out)  # systemctl start ...export.service
    assert code == 0, said
    _a_node_went_silent(url)
    code, said = _export_as_the_timer(url, home, out)
    assert code == 0, said
    assert out.stat().st_uid == NOBODY
    assert 'rsc_health_node_stale{node="gpu001"} 1.0' in out.read_text(), said


@needs_root
def test_an_export_as_root_there_says_the_timer_cannot_replace_its_file(textfile_dir):
    """Root's export still writes (exit 0) but says at once that the timer will fail on its
    file, which file to delete and how to run the export instead; the timer's export then
    names the file to delete instead of a bare 'Operation not permitted' on a temporary
    name; deleted, the timer's export writes it again."""
    url, home, out = textfile_dir
    first = _export(url, out)  # root, an old install's habit
    assert first.exit_code == 0, first.output
    assert out.stat().st_uid == 0
    assert f"rm {out}" in first.output, first.output
    assert "systemctl start rsc-health-export.service" in first.output, first.output

    _a_node_went_silent(url)
    code, said = _export_as_the_timer(url, home, out)
    assert code == 1, said
    assert f"rm {out}" in said, said
    assert "root (uid 0)" in said, said
    assert ".tmp" not in said, said

    out.unlink()
    code, said = _export_as_the_timer(url, home, out)
    assert code == 0, said
    assert 'rsc_health_node_stale{node="gpu001"} 1.0' in out.read_text(), said


@needs_root
def test_root_says_nothing_of_the_kind_in_a_directory_of_its_own(tmp_path):
    """0755 root:root (or /tmp's 1777 root:root): no other writer the file could block."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    db.create(create_engine(url))
    out = tmp_path / "out" / "fleet.prom"
    result = _export(url, out)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output


def test_the_readmes_install_block_runs_the_first_export_as_the_timers_user():
    text = (REPO / "README.md").read_text()
    shell = "\n".join(re.findall(r"```bash\n(.*?)```", text, re.S))
    for line in shell.splitlines():
        if "metrics export" in line and "textfile_collector" in line:
            assert line.lstrip().startswith("sudo -u rsc-health "), line
    assert "systemctl start rsc-health-export.service" in shell
