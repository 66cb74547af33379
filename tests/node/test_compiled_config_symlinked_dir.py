"""The compiled config's key holds the owners and modes of the directories above the site file
(helper-105, c994bf1), so a directory made writable by others is refused loudly as
load_config refuses it. The key stats the directories of the path *as named*; load_config's
trust check (durable.path_refusal) judges every directory the kernel looks the name up in,
symlinks followed. A site file reached through a link (/etc/rsc_health -> a tree that
configuration management owns) whose real parent is made writable by others is refused by
load_config and still served, silently, by the compiled copy."""

from __future__ import annotations

import os

import pytest

from rsc_health import nodepath
from rsc_health.config import ConfigError, load_config
from tests.node.test_config_fleet_mistakes import _not_ok, _site
from tests.node.test_nodepath_faults import _no_slurm, node_env  # noqa: F401


def test_a_site_config_behind_a_link_whose_real_directory_others_can_write_is_refused(
        node_env, tmp_path, monkeypatch):  # noqa: F811
    srv = tmp_path / "srv"
    real = srv / "cfg"
    real.mkdir(parents=True)
    os.chmod(srv, 0o755)
    os.chmod(real, 0o755)
    (real / "config.toml").write_text(_site().read_text())
    etc = tmp_path / "etc"
    etc.mkdir()
    os.chmod(etc, 0o755)
    (etc / "rsc_health").symlink_to(real)  # root's link, in root's directory
    site = etc / "rsc_health" / "config.toml"
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0  # compiled, kept

    os.chmod(srv, 0o777)  # anyone may now swap cfg/ for a directory of their own
    with pytest.raises(ConfigError):
        load_config(site)  # what the README promises
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    assert ("checker", "config_error") in _not_ok(node_env)
