"""[nodes."GLOB"] precedence is the file's order, value by value: of two matching globs that
set the same key, the one the file sets later wins, wherever each glob first appears. TOML
merges all tables of one glob into one key placed where it first appears, so the parsed
dict's order is not the file's (helper-208)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsc_health import ConfigError
from rsc_health.cli import AppContext
from rsc_health.commands.config import config
from rsc_health.config import (
    glob_match,
    last_good_config,
    load_config,
    load_config_compiled,
    remember_good,
    state_dir,
)

STOP_ALL = '''[actions]
enabled = false
[nodes."gpu*".gpu]
count = 8
[nodes."gpu00[1-8]".actions]
enabled = true
# 03:00, the pilot is draining healthy nodes: every gpu node back to shadow, appended last
[nodes."gpu*".actions]
enabled = false
'''


def _load(tmp_path, text):
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p, load_config(p)


def test_a_later_table_wins_as_documented(tmp_path):
    """An operator stopping a misbehaving pilot appends `[nodes."gpu*".actions] enabled =
    false` at the end. An earlier `[nodes."gpu*".gpu]` table put "gpu*" first in the parsed
    dict, and precedence was by that order: the pilot's table still won for gpu001..008."""
    _, cfg = _load(tmp_path, STOP_ALL)
    live = [n for n in ("gpu001", "gpu005", "gpu008") if cfg.actions_enabled(n)]
    assert live == [], f"still live under the later `enabled = false` table: {live}"
    assert cfg.for_node("gpu001").get("actions.enabled") is False
    assert cfg.for_node("gpu001").get("gpu.count") == 8


def test_config_show_node_says_what_actions_enabled_does(tmp_path):
    p, cfg = _load(tmp_path, STOP_ALL)
    res = CliRunner().invoke(config, ["show", "--node", "gpu003", "--section", "actions"],
                             obj=AppContext(config_path=str(p)))
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)["config"]["actions"]["enabled"]
    assert shown is False is cfg.actions_enabled("gpu003")


def test_precedence_is_per_value_not_per_glob(tmp_path):
    """A glob's later table of another section does not lift its earlier values over a
    later glob's: the pilot written after `gpu*`'s actions table stays live even when
    `gpu*` gets one more table at the very end."""
    _, cfg = _load(tmp_path, '''[nodes."gpu*".actions]
enabled = false
[nodes."gpu00[1-8]".actions]
enabled = true
[nodes."gpu*".gpu]
count = 4
''')
    assert cfg.actions_enabled("gpu002") and not cfg.actions_enabled("gpu020")
    view = cfg.for_node("gpu002")
    assert view.get("actions.enabled") is True and view.get("gpu.count") == 4


def test_dotted_and_inline_forms_rank_where_they_are_written(tmp_path):
    _, cfg = _load(tmp_path, '''[nodes]
"gpu*".gpu.count = 8
"gpu00[1-8]" = { actions = { enabled = true } }
'gpu*'.actions.enabled = false
''')
    assert not cfg.actions_enabled("gpu001")
    assert cfg.for_node("gpu001").get("actions.enabled") is False


def test_strings_that_look_like_tables_do_not_move_a_glob(tmp_path):
    _, cfg = _load(tmp_path, '''[nodes."gpu*".actions]
enabled = false
[nodes."gpu00[1-8]".actions]
enabled = true
[nodes."gpu*".gpu]
# [nodes."gpu*".actions]
count = 8
''')
    assert cfg.actions_enabled("gpu001")


def test_the_compiled_config_keeps_the_file_order(tmp_path, monkeypatch):
    """A job start reads the compiled config, not the TOML: it must rank values alike."""
    import time

    from rsc_health import config as config_module

    p = tmp_path / "config.toml"
    p.write_text(STOP_ALL)
    root = tmp_path / "root"
    real = time.time_ns  # nothing racy: the first load compiles, the second reads it
    monkeypatch.setattr(time, "time_ns", lambda: real() + config_module.RACY_NS + 10**9)
    first = load_config_compiled(root, p)

    def no_parse(data, path):
        raise AssertionError("parsed again: the compiled config was not read")

    monkeypatch.setattr(config_module, "_parse_toml", no_parse)
    again = load_config_compiled(root, p)
    for cfg in (first, again):
        assert not cfg.actions_enabled("gpu001")
        assert cfg.for_node("gpu001").get("actions.enabled") is False


PILOT = ('[actions]\nenabled = true\n'
         '[nodes."gpu[01-16]".actions]\nenabled = false\n')


def test_a_slurm_hostlist_as_node_glob_is_not_silently_a_one_character_set(tmp_path):
    """`[nodes."gpu[01-16]".actions] enabled = false`, a pilot's shadow nodes written as
    Slurm names node ranges: fnmatch reads `[01-16]` as ONE character out of {0, 1, 6}, so
    the table matched gpu0, gpu1 and gpu6 and none of gpu01..gpu16, and `config check` said
    ok. Now the config is refused, naming the table."""
    p = tmp_path / "config.toml"
    p.write_text(PILOT)
    res = CliRunner().invoke(config, ["check"], obj=AppContext(config_path=str(p)))
    assert res.exit_code == 4, res.output
    assert 'nodes."gpu[01-16]"' in res.output and "Slurm hostlist range" in res.output


@pytest.mark.parametrize("glob", ["gpu[01-16]", "gpu[1-4,8]", "gpu[1,3]", "dgx-[0001-0128]*",
                                  "gpu0[1-9]x[10-12]"])
def test_slurm_ranges_are_refused_in_any_node_glob(tmp_path, glob):
    p = tmp_path / "config.toml"
    p.write_text(f'[nodes."{glob}".gpu]\ncount = 4\n')
    with pytest.raises(ConfigError, match="Slurm hostlist range"):
        load_config(p)


@pytest.mark.parametrize("glob", ["gpu[0-9]", "gpu00[1-8]", "gpu[01][0-9]", "gpu[13]",
                                  "gpu[!0-3]*", "node[a-c]?"])
def test_fnmatch_sets_stay_accepted(tmp_path, glob):
    p = tmp_path / "config.toml"
    p.write_text(f'[nodes."{glob}".gpu]\ncount = 4\n')
    assert load_config(p).overrides["nodes"][glob] == {"gpu": {"count": 4}}


def test_the_last_good_config_keeps_the_file_order(tmp_path):
    """While a push is broken the node judges with last_good_config(), rebuilt from the kept
    text: it must rank [nodes."GLOB"] values as the load that kept it did. It was rebuilt
    without the file's order (the parsed dict's), so the pilot stopped by a table appended
    last drained again exactly when a push was broken (helper-209)."""
    import os

    p, cfg = _load(tmp_path, STOP_ALL)
    assert cfg.actions_enabled("gpu001") is False
    root = tmp_path / "root"
    sdir = state_dir(cfg, root)
    os.makedirs(sdir, mode=0o700)
    remember_good(cfg, sdir, cfg.parsed)
    kept, _ = last_good_config(root)
    assert kept.actions_enabled("gpu001") is False
    assert kept.for_node("gpu001").get("actions.enabled") is False
    assert kept.node_layers() == cfg.node_layers()


MOUNTS_AOT = '''[[nodes."gpu*".mounts.expected]]
path = "/checkpoint"
fstype = "lustre"

[nodes."cpu*".gpu]
count = 0

[[nodes."gpu*".mounts.expected]]
path = "/scratch"
fstype = "nfs"
'''


def test_an_array_of_tables_under_a_glob_is_one_value(tmp_path):
    """[mounts] expected is a list of tables, which TOML writes as [[...]]: under a glob in a
    file with two globs the position reader walked into the list and refused the valid file
    ('cannot tell the order'), so every node judged with the last good config (helper-209).
    The list applies as one value."""
    one_glob = MOUNTS_AOT.split('[nodes."cpu*"')[0]
    assert load_config(_write(tmp_path, one_glob)).for_node("gpu001").get(
        "mounts.expected") == [{"path": "/checkpoint", "fstype": "lustre"}]
    cfg = load_config(_write(tmp_path, MOUNTS_AOT))
    assert cfg.for_node("gpu001").get("mounts.expected") == [
        {"path": "/checkpoint", "fstype": "lustre"}, {"path": "/scratch", "fstype": "nfs"}]
    assert cfg.for_node("cpu001").get("gpu.count") == 0
    assert cfg.for_node("cpu001").get("mounts.expected") == load_config(
        _write(tmp_path, "")).get("mounts.expected")


def test_an_array_of_tables_ranks_where_the_file_sets_it(tmp_path):
    """A later glob's list replaces an earlier one's, whichever glob appeared first."""
    text = ('[nodes."gpu*".gpu]\ncount = 8\n'
            '[[nodes."gpu00[1-8]".mounts.expected]]\npath = "/pilot"\nfstype = "nfs"\n'
            '[[nodes."gpu*".mounts.expected]]\npath = "/checkpoint"\nfstype = "lustre"\n')
    cfg = load_config(_write(tmp_path, text))
    assert cfg.for_node("gpu001").get("mounts.expected") == [
        {"path": "/checkpoint", "fstype": "lustre"}]


def _write(tmp_path, text):
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("glob", ["gpu00[0-35-9]", "gpu0[13-5]", "gpu00[0-24-9]"])
def test_an_fnmatch_set_with_two_ranges_is_not_a_slurm_range(tmp_path, glob):
    """`gpu00[0-35-9]` is fnmatch's {0-3, 5-9}: every gpu00N but gpu004. The bracket was
    split on '-' and its middle '35' read as a two-digit Slurm bound: a valid glob refused
    (helper-209). Read as fnmatch reads it, it is no Slurm range (none has two dashes or a
    bound above the other)."""
    import fnmatch

    cfg = load_config(_write(tmp_path, f'[nodes."{glob}".actions]\nenabled = false\n'))
    for n in range(100):
        name = f"gpu{n:03d}"
        assert glob_match(name, glob) == fnmatch.fnmatchcase(name, glob)
        assert cfg.actions_enabled(name) is not fnmatch.fnmatchcase(name, glob)


@pytest.mark.parametrize("glob", ["gpu001,gpu002", "gpu[001-002],gpu010", "gpu0*, cpu0*",
                                  "gpu001 gpu002"])
def test_a_slurm_hostlist_of_names_is_refused(tmp_path, glob):
    """`healthctl drain` takes a Slurm hostlist, and the same operator writes one as a glob:
    a comma (or blank) list matches no node (a Slurm node name holds neither), so the pilot's
    shadow table applied to nothing and the config loaded without a word (helper-209)."""
    text = f'[actions]\nenabled = true\n[nodes."{glob}".actions]\nenabled = false\n'
    with pytest.raises(ConfigError, match="Slurm hostlist"):
        load_config(_write(tmp_path, text))


@pytest.mark.parametrize("glob", ["gpu[a,b]*", "gpu[!,]*"])
def test_a_comma_inside_a_set_of_letters_is_not_refused(tmp_path, glob):
    """Inside a set a comma is only a character no node name holds: the set still means what
    it says, so it is not refused."""
    load_config(_write(tmp_path, f'[nodes."{glob}".gpu]\ncount = 4\n'))
