"""A broken or refused config push does not blind the node: the run judges with the whole last
config that loaded on it (kept as text in last_good_config.json, root's, 0600) and says the new
one is broken (config_error, a checker error) in the same run.

Before, a typo pushed to the fleet stopped every check on every node until it was fixed: the
prolog let a job start on a GPU that had fallen off the bus.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rsc_health import nodepath
from rsc_health.config import LAST_GOOD_FILE, last_good_config
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, _no_slurm, _records, node_env  # noqa: F401

NOBODY = 65534


def _site() -> Path:
    return Path(os.environ["RSC_HEALTH_CONFIG"])


def _break(site: Path, how: str = "typo") -> None:
    if how == "typo":
        site.write_text(site.read_text() + "\n[actions]\nenabeld = false\n")
    elif how == "not_toml":
        site.write_text("[slurm\n")
    elif how == "refused":
        os.chmod(site, 0o666)


def _drained(calls: list) -> object:
    class Slurm:
        def drain(self, node, reason):
            calls.append(("drain", node, reason))

        def __getattr__(self, name):
            def call(*args, **kwargs):
                calls.append((name, *args))
                return []
            return call

    return lambda cfg, deadline: Slurm()


@pytest.mark.parametrize("how", ["typo", "not_toml", "refused"])
def test_a_broken_push_after_a_good_run_still_fails_the_job_start_on_a_dead_gpu(
        how, node_env, capsys):  # noqa: F811
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0  # loads, kept
    _break(_site(), how)
    (node_env / "dev/kmsg").open("a").write(XID79)

    assert nodepath.main(["prolog"]) == 1  # slurmd drains, the job goes elsewhere

    err = capsys.readouterr().err
    assert "bad config" in err and "judged with the last good config" in err
    codes = {r.get("code") for r in _records(node_env) if r["kind"] == "check"}
    assert {"config_error", "xid79"} <= codes


def test_a_healthy_node_under_a_broken_push_runs_its_checks_and_says_the_config_is_broken(
        node_env):  # noqa: F811
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    cursor = node_env / NODE_STATE / "xid_cursor.json"
    before = cursor.read_bytes()
    _break(_site())
    (node_env / "dev/kmsg").open("a").write(
        "6,9001,99100000,-;eth0: link up, 100 Gbps\n")  # news the cursor moves past

    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0

    beat = [r for r in _records(node_env) if r["kind"] == "heartbeat"][-1]
    assert beat["level"] == "checker_error"
    assert cursor.read_bytes() != before  # the sweep judged and moved on


def test_the_last_good_config_follows_each_config_that_loads(node_env):  # noqa: F811
    site = _site()
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    site.write_text(site.read_text() + "\n[slurm]\ncall_timeout_s = 7.0\n")
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    kept = node_env / NODE_STATE / LAST_GOOD_FILE
    assert "call_timeout_s = 7.0" in json.loads(kept.read_text())["toml"]
    assert oct(kept.stat().st_mode & 0o777) == "0o600"  # a historian URL may hold a password
    _break(site)
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    assert "enabeld" not in json.loads(kept.read_text())["toml"]  # never the broken one
    cfg, which = last_good_config(node_env)
    assert cfg.get("slurm.call_timeout_s") == 7.0 and str(site) in which


@pytest.mark.parametrize("plant", ["owner", "mode", "directory"])
def test_a_kept_copy_someone_else_could_have_written_is_not_used(plant, node_env):  # noqa: F811
    """The copy would choose what root runs as surely as the config does: one someone else
    owns, may write, or could swap through the directory is not judged with."""
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    kept = node_env / NODE_STATE / LAST_GOOD_FILE
    assert last_good_config(node_env) is not None
    if plant == "owner":
        os.chown(kept, NOBODY, NOBODY)
    elif plant == "mode":
        os.chmod(kept, 0o666)
    else:
        os.chmod(kept.parent, 0o777)
    assert last_good_config(node_env) is None


@pytest.mark.parametrize("plant", ["owner", "mode"])
def test_a_broken_push_with_a_planted_copy_ends_as_a_broken_config(
        plant, node_env, capsys):  # noqa: F811
    """Nothing of the planted copy runs: the run says the config is broken and judges
    nothing, as it did before any copy was kept."""
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    kept = node_env / NODE_STATE / LAST_GOOD_FILE
    doc = json.loads(kept.read_text())
    doc["toml"] += '\n[slurm]\nbin_dir = "/home/mallory/bin"\n'
    kept.write_text(json.dumps(doc))
    if plant == "owner":
        os.chown(kept, NOBODY, NOBODY)
    else:
        os.chmod(kept, 0o666)
    _break(_site())
    (node_env / "dev/kmsg").open("a").write(XID79)

    assert nodepath.main(["prolog"]) == 0
    err = capsys.readouterr().err
    assert "bad config" in err and "judged with the last good config" not in err
    assert "xid79" not in {r.get("code") for r in _records(node_env)}


@pytest.mark.parametrize("damage", ["no_toml", "not_json", "toml_no_longer_valid", "fifo"])
def test_a_kept_copy_that_cannot_be_used_is_the_old_broken_config_path(
        damage, node_env, capsys):  # noqa: F811
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    kept = node_env / NODE_STATE / LAST_GOOD_FILE
    doc = json.loads(kept.read_text())
    if damage == "no_toml":  # kept by an older release
        doc.pop("toml")
        kept.write_text(json.dumps(doc))
    elif damage == "not_json":
        kept.write_text("{")
    elif damage == "toml_no_longer_valid":  # a release that renamed a key
        doc["toml"] += "\n[gpu]\nretired_key = 1\n"
        kept.write_text(json.dumps(doc))
    else:
        kept.unlink()
        os.mkfifo(kept)
    assert last_good_config(node_env) is None
    _break(_site())

    assert nodepath.main(["sweep"]) == 0
    err = capsys.readouterr().err
    assert "bad config" in err and "judged with the last good config" not in err
