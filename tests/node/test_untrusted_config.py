"""A site config someone else could have written is refused, as a site check program would be.

The config chooses what root runs ([slurm] bin_dir: scontrol; [site] nhc_path; [qualify]
commands), where root writes and which checks run at all: a file an unprivileged user can
write, or swap through a directory they can write, would make them root on every node and let
them switch the health checks off. Refused like a broken config: loud (stderr, spool,
textfile), the job runs, a pending drain verdict still fails the job start.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rsc_health import config, nodepath
from rsc_health.config import ConfigError, load_config, load_config_compiled
from tests.fixtures.nodes.node_copy import copy_node

from .test_nodepath_faults import _no_slurm, _records, node_env  # noqa: F401 - the fixture

NOBODY = 65534
PLANTED = '[slurm]\nbin_dir = "/home/mallory/bin"\n'


def _plant(site: Path) -> None:
    """Mallory's edit: [slurm] bin_dir pointed at her own scontrol."""
    text = site.read_text()
    site.write_text(text.replace("[slurm]", '[slurm]\nbin_dir = "/home/mallory/bin"', 1)
                    if "[slurm]" in text else text + "\n" + PLANTED)


def _site(tmp_path: Path, text: str = PLANTED, name: str = "c.toml") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp_path, 0o755)
    f = tmp_path / name
    f.write_text(text)
    os.chmod(f, 0o644)
    return f


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666, 0o622])
def test_a_config_others_may_write_is_refused(tmp_path, mode):
    f = _site(tmp_path / "etc")
    os.chmod(f, mode)
    with pytest.raises(ConfigError, match="writable by group or others") as exc:
        load_config(f)
    assert "chmod go-w" in str(exc.value)


def test_a_config_owned_by_someone_else_is_refused(tmp_path):
    f = _site(tmp_path / "etc")
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"owned by uid {NOBODY}"):
        load_config(f)


def test_a_config_in_a_directory_others_may_write_is_refused(tmp_path):
    """Root's own 0644 file, but anyone could rename another over it."""
    d = tmp_path / "shared"
    f = _site(d)
    os.chmod(d, 0o777)
    with pytest.raises(ConfigError, match="on its path is writable by group or others"):
        load_config(f)


def test_a_config_in_a_directory_someone_else_owns_is_refused(tmp_path):
    d = tmp_path / "home-mallory"
    f = _site(d)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"on its path is owned by uid {NOBODY}"):
        load_config(f)


def test_a_symlink_to_a_file_someone_else_can_swap_is_refused(tmp_path):
    """The root-owned link is not the question: what it points into is."""
    theirs = tmp_path / "theirs"
    target = _site(theirs)
    os.chown(theirs, NOBODY, NOBODY)
    link_dir = tmp_path / "etc"
    link_dir.mkdir()
    link = link_dir / "config.toml"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="refused"):
        load_config(link)


def test_roots_config_in_a_sticky_directory_is_read(tmp_path):
    """A sticky directory (/tmp) lets no one else rename or remove root's entries."""
    d = tmp_path / "sticky"
    f = _site(d, '[slurm]\ncall_timeout_s = 7.0\n')
    os.chmod(d, 0o1777)
    assert load_config(f).get("slurm.call_timeout_s") == 7.0


def test_a_config_that_became_writable_is_refused_even_when_compiled(tmp_path, monkeypatch):
    """The compiled config's key holds the file's mode and owner: a chmod is a miss, and the
    parse refuses it; nothing of the planted file is served from the copy."""
    node = copy_node(tmp_path / "node")
    site = node / "config.toml"
    os.chmod(site, 0o644)
    first = load_config_compiled(node, site)
    assert first.get("slurm.bin_dir") == ""
    _plant(site)
    os.chmod(site, 0o666)
    with pytest.raises(ConfigError, match="writable by group or others"):
        load_config_compiled(node, site)


def test_the_packaged_defaults_and_dev_null_are_not_judged(tmp_path):
    """/dev/null is a world-writable device by design: naming it means "no site file"."""
    assert stat.S_IMODE(os.stat(os.devnull).st_mode) & stat.S_IWOTH
    assert load_config(os.devnull).get("slurm.bin_dir") == ""
    assert config._read_defaults()["slurm"]["bin_dir"] == ""


def test_the_prolog_with_a_config_others_may_write_says_so_and_runs_nothing_from_it(
        node_env, monkeypatch, capsys):  # noqa: F811
    """The planted bin_dir is never used: no Slurm object is even built from it; the run says
    the config is broken (config_error, spooled) and lets the job run."""
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0  # a last good config
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    _plant(site)
    os.chmod(site, 0o666)
    built = []

    def factory(cfg, deadline):
        built.append(cfg.get("slurm.bin_dir"))
        return _no_slurm(cfg, deadline)

    assert nodepath.run_stage("prolog", slurm_factory=factory) == 0
    assert "/home/mallory/bin" not in built
    err = capsys.readouterr().err
    assert "bad config" in err and "writable by group or others" in err
    codes = [r.get("code") for r in _records(node_env)]
    assert "config_error" in codes
