"""A config mistake is one line naming the file and the key, never a silently wrong setting."""

from __future__ import annotations

import pytest

from rsc_health.config import ConfigError, load_config, resolve_node_config


def _load(tmp_path, text: str):
    path = tmp_path / "site.toml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[gpu]\ncuont = 8\n", ["[gpu] cuont", "unknown key", "count"]),
        ('[slurm]\nlock_timeout_s = "x"\n', ["[slurm] lock_timeout_s", "expected a number"]),
        ('[actions]\nenabled = "false"\n', ["[actions] enabled", "true or false"]),
        ("[gpu]\ncount = 1e9\n", ["[gpu] count", "expected an integer"]),
        ("[gpu]\ncount = 100000\n", ["[gpu] count", "<= 64"]),
        ("[mounts]\nprobe_timeout_s = -1\n", ["probe_timeout_s", ">= 0"]),
        ("[mounts]\nprobe_timeout_s = 0\n", ["probe_timeout_s", "> 0"]),
        ('[mounts]\nexpected = [{path = "/x", fstyp = "nfs"}]\n', ["expected", "fstyp"]),
        ("[infiniband]\nerrors_per_sweep = {symbol_eror = 3}\n", ["symbol_eror"]),
        ("[nosuch]\nx = 1\n", ["unknown section [nosuch]"]),
        ('[nodes."gpu*".gpu]\ncount = "8"\n', ['[nodes."gpu*"]', "[gpu] count"]),
        ("[partitions.big.slurm]\nsweep_budget_s = nan\n", ["[partitions.big]", "finite"]),
    ],
)
def test_a_wrong_key_type_or_range_is_one_error_naming_file_and_key(tmp_path, text, words):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    message = str(info.value)
    assert str(tmp_path / "site.toml") in message
    for word in words:
        assert word in message, message
    assert "\n" not in message


def test_well_typed_values_load_and_ints_are_fine_for_durations(tmp_path):
    cfg = _load(tmp_path, "[slurm]\nlock_timeout_s = 5\nsweep_budget_s = 30.5\n[gpu]\ncount = 8\n")
    assert cfg.get("slurm.lock_timeout_s") == 5 and cfg.get("gpu.count") == 8


def test_one_node_name_and_overrides_for_every_entry_point(tmp_path, monkeypatch):
    cfg = _load(tmp_path, '[nodes."gpu0*".gpu]\ncount = 4\n[partitions.big.gpu]\ncount = 2\n')
    monkeypatch.setenv("SLURMD_NODENAME", "gpu007")
    node_cfg, name = resolve_node_config(cfg)
    assert name == "gpu007" and node_cfg.get("gpu.count") == 4
    monkeypatch.delenv("SLURMD_NODENAME")
    node_cfg, name = resolve_node_config(cfg, node="cpu1", partition="big")
    assert node_cfg.get("gpu.count") == 2


@pytest.mark.parametrize("key", ["enabled = false", "guard_max_share = 0.5",
                                 "resume_after_clean_sweeps = 1"])
def test_actions_per_partition_are_refused_for_the_nodes_own(tmp_path, key):
    """[partitions.NAME] applies where a job's partition is known (prolog, epilog), never in a
    sweep, and a node may be in several partitions: `[partitions.dev.actions] enabled = false`
    made dev jobs start on a faulty node (the prolog in shadow mode) while the sweep on the same
    node drained it. What rsc-health does to a node in Slurm is the node's: refused per
    partition, with [nodes."GLOB"] named instead (it applies to every entry point)."""
    site = tmp_path / "site.toml"
    site.write_text(f"[partitions.dev.actions]\n{key}\n")
    with pytest.raises(ConfigError) as err:
        load_config(site)
    assert "[partitions.dev] [actions]" in str(err.value)
    assert "[nodes.\"GLOB\".actions]" in str(err.value)
    site.write_text(f'[nodes."dev*".actions]\n{key}\n')
    cfg, _ = resolve_node_config(load_config(site), "dev01", "gpu")
    assert cfg.get("actions." + key.split(" = ")[0]) != load_config("/dev/null").get(
        "actions." + key.split(" = ")[0])


@pytest.mark.parametrize("table", ['nodes."gpu0*"', "partitions.dev"])
@pytest.mark.parametrize("section,key", [("lemon", "node_fails = 9"),
                                         ("failslow", "k = 9.0"),
                                         ("suspects", "max_share = 0.5"),
                                         ("report", "rolling_days = 3")])
def test_fleet_sections_in_an_override_table_are_refused(tmp_path, table, section, key):
    """[lemon], [failslow], [suspects], [report]... are read by the management host once for the
    whole fleet: no [nodes."GLOB"] or [partitions.NAME] table applies to them. Such a table was
    validated, shown by `config show --node`, and ignored (helper-105): an operator who
    loosened the lemon rule for one rack believed it loosened. Refused, with where to set it."""
    site = tmp_path / "site.toml"
    site.write_text(f"[{table}.{section}]\n{key}\n")
    with pytest.raises(ConfigError) as err:
        load_config(site)
    assert f"[{section}]: read by the management host" in str(err.value)
    assert f"set it in [{section}]" in str(err.value)
    # the same key at the top level is the site's
    site.write_text(f"[{section}]\n{key}\n")
    load_config(site)
