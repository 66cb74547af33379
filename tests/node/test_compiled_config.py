"""The compiled config a job start loads instead of parsing TOML (config.load_config_compiled):
the same Config as load_config, and a miss (parsed and validated again) whenever the file it
came from changed, the code that validated it changed, or the compiled file is not one root
(or this user) wrote: a planted symlink or FIFO, a group-writable or foreign-owned file, a
truncated or corrupt one."""

from __future__ import annotations

import marshal
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import rsc_health
from rsc_health import config
from rsc_health.config import ConfigError, compiled_path, load_config, load_config_compiled
from tests.fixtures.nodes.node_copy import copy_node


@pytest.fixture
def node(tmp_path):
    return copy_node(tmp_path / "node")


def _site(node: Path) -> Path:
    return node / "config.toml"


def _load(node: Path) -> config.Config:
    return load_config_compiled(node, _site(node))


def _no_parse(monkeypatch) -> list[Path]:
    parsed: list[Path] = []
    real = config._parse_toml

    def counting(data, path):
        parsed.append(Path(path))
        return real(data, path)

    monkeypatch.setattr(config, "_parse_toml", counting)
    return parsed


def _same(a: config.Config, b: config.Config) -> None:
    assert (a.data, a.path, a.overrides) == (b.data, b.path, b.overrides)


def test_the_second_load_is_the_compiled_config_and_equals_a_parse(node, monkeypatch):
    first = _load(node)
    kept = Path(compiled_path(node))
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600  # the historian URL may hold a password
    parsed = _no_parse(monkeypatch)
    second = _load(node)
    assert parsed == []  # no TOML parsed
    _same(second, first)
    _same(second, load_config(_site(node)))


def test_overrides_survive_the_round_trip(node, monkeypatch):
    with _site(node).open("a") as fh:
        fh.write('\n[nodes."bench*".mounts]\nprobe_timeout_s = 1.5\n'
                 '[partitions.gpu.gpu]\ncount = 4\n')
    _load(node)
    parsed = _no_parse(monkeypatch)
    cfg = _load(node)
    assert parsed == []
    seen = cfg.for_node("bench07", "gpu")
    assert seen.get("mounts.probe_timeout_s") == 1.5 and seen.get("gpu.count") == 4
    assert cfg.for_node("other01").get("gpu.count") == 8


def test_an_edit_that_keeps_size_and_mtime_is_seen(node, monkeypatch):
    # A config pushed with the same length and its mtime set back (rsync -t, touch -r): the
    # inode change time still moves.
    _load(node)
    site = _site(node)
    before = site.stat()
    text = site.read_text()
    assert "count = 8" in text
    time.sleep(0.01)
    site.write_text(text.replace("count = 8", "count = 7"))
    os.utime(site, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = site.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    parsed = _no_parse(monkeypatch)
    assert _load(node).get("gpu.count") == 7
    assert parsed == [site]


def test_a_config_replaced_by_rename_is_seen(node):
    _load(node)
    site = _site(node)
    new = site.with_name("config.new")
    new.write_text(site.read_text().replace("count = 8", "count = 6"))
    os.replace(new, site)
    assert _load(node).get("gpu.count") == 6


def test_another_version_of_the_package_parses_again(node, monkeypatch):
    _load(node)
    monkeypatch.setattr(rsc_health, "__version__", "9.9.9")
    parsed = _no_parse(monkeypatch)
    _load(node)
    assert parsed == [_site(node)]


def test_a_planted_symlink_is_not_followed_and_is_replaced(node, tmp_path, monkeypatch):
    _load(node)
    kept = Path(compiled_path(node))
    elsewhere = tmp_path / "elsewhere"
    blob = kept.read_bytes()
    elsewhere.write_bytes(blob)  # a valid blob, but not at a name root wrote
    kept.unlink()
    kept.symlink_to(elsewhere)
    parsed = _no_parse(monkeypatch)
    _load(node)
    assert parsed == [_site(node)]
    assert not kept.is_symlink() and kept.is_file()  # written anew, not through the link
    assert elsewhere.read_bytes() == blob  # the target itself left untouched
    assert _but_when(kept.read_bytes()) == _but_when(blob)


def test_a_fifo_there_does_not_block(node):
    kept = Path(compiled_path(node))
    kept.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(kept)
    done: list[config.Config] = []
    worker = threading.Thread(target=lambda: done.append(_load(node)), daemon=True)
    worker.start()
    worker.join(10)
    assert done and done[0].get("gpu.count") == 8


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_file_others_may_write_is_refused(node, monkeypatch, mode):
    _load(node)
    os.chmod(Path(compiled_path(node)), mode)
    parsed = _no_parse(monkeypatch)
    _load(node)
    assert parsed == [_site(node)]


def test_a_file_owned_by_someone_else_is_refused(node, monkeypatch):
    _load(node)
    kept = Path(compiled_path(node))
    if os.geteuid() == 0:
        os.chown(kept, 4242, 4242)
    else:  # the file is ours: pretend we are another user
        real = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    parsed = _no_parse(monkeypatch)
    _load(node)
    assert parsed == [_site(node)]


def test_a_directory_others_may_write_is_not_trusted(node, monkeypatch):
    _load(node)
    os.chmod(Path(compiled_path(node)).parent, 0o777)
    parsed = _no_parse(monkeypatch)
    assert _load(node).get("gpu.count") == 8
    assert parsed == [_site(node)]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "wrong_shape", "huge"])
def test_a_damaged_file_is_parsed_again_and_rewritten(node, monkeypatch, damage):
    good = _load(node)
    kept = Path(compiled_path(node))
    blob = kept.read_bytes()
    key = marshal.loads(blob)[0]
    bad = {"truncated": blob[: len(blob) // 2], "garbage": b"\xff\x00not marshal" * 50,
           "empty": b"", "wrong_shape": marshal.dumps((key, ["not", "a", "table"], 7, {})),
           "huge": marshal.dumps((key, {"x": "y" * (config.MAX_CONFIG_BYTES + 10)}, None, {}))}
    kept.write_bytes(bad[damage])
    parsed = _no_parse(monkeypatch)
    _same(_load(node), good)
    assert parsed == [_site(node)]
    # Rewritten whole (all but when its load began).
    assert _but_when(kept.read_bytes()) == _but_when(blob)


GARBLED_COUNT = """
import marshal, resource, struct, sys
from pathlib import Path
from rsc_health.config import compiled_path, load_config_compiled
node = Path(sys.argv[1])
kept = Path(compiled_path(node))
blob = kept.read_bytes()
assert blob[0] & 0x7F == ord(")") and blob[1] == 6  # the kept 6-tuple, and its items:
kept.write_bytes(b"[" + struct.pack("<i", 2**31 - 1) + blob[2:])  # as a list of 2**31
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # a node that overcommits no memory
print(load_config_compiled(node, node / "config.toml").get("gpu.count"))
print(len(marshal.loads(kept.read_bytes())))
"""


def test_a_compiled_file_whose_count_is_garbled_is_a_miss_not_a_checker_fault(node):
    """marshal trusts a list's count: 5 bytes claiming 2**31 items ask for 16 GiB before the
    first item is read. Where the node cannot have it (vm.overcommit_memory=2, a memory
    limit) that is MemoryError, which escaped the read: every job start was a checker fault
    and, never a miss, the file was never rewritten. Now a miss, rewritten whole."""
    _load(node)
    done = subprocess.run([sys.executable, "-c", GARBLED_COUNT, str(node)], capture_output=True,
                          text=True, timeout=60, cwd=Path(rsc_health.__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["8", "6"]


def _but_when(blob: bytes) -> tuple:
    kept = marshal.loads(blob)
    return kept[:4] + kept[5:]


def test_a_broken_config_is_never_served_from_the_compiled_one(node):
    _load(node)
    _site(node).write_text("[gpu]\ncount = 'eight'\n")
    with pytest.raises(ConfigError):
        _load(node)
    with pytest.raises(ConfigError):
        _load(node)  # nothing was kept of the broken file


def test_a_missing_named_config_is_an_error_every_time(node):
    _load(node)
    _site(node).unlink()
    for _ in range(2):
        with pytest.raises(ConfigError):
            _load(node)


def test_a_site_with_its_own_state_dir_keeps_none(node, tmp_path):
    with _site(node).open("a") as fh:
        fh.write('\n[node]\nstate_dir = "/srv/health"\n')
    cfg = _load(node)
    assert cfg.get("node.state_dir") == "/srv/health"
    assert not Path(compiled_path(node)).exists()
    assert _load(node).get("node.state_dir") == "/srv/health"


def test_a_date_value_is_parsed_each_time(node, monkeypatch):
    # marshal has no datetime: such a config is not kept, and still loads.
    import rsc_health.config_schema as schema

    monkeypatch.setattr(schema, "validate_site", lambda *a: None)
    with _site(node).open("a") as fh:
        fh.write("\n[site]\nsince = 2026-11-26\n")
    first = _load(node)
    assert str(first.get("site.since")) == "2026-11-26"
    assert not Path(compiled_path(node)).exists()


def test_concurrent_job_starts_each_get_the_config_and_leave_one_whole_file(node):
    results: list[config.Config] = []
    errors: list[BaseException] = []

    def start():
        try:
            results.append(_load(node))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=start) for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert not errors and len(results) == 8
    for cfg in results:
        _same(cfg, results[0])
    kept = Path(compiled_path(node))
    assert marshal.loads(kept.read_bytes())[1] == results[0].data
    assert [p.name for p in kept.parent.iterdir() if p.name.startswith(".")] == []  # no litter


def _coarse_timestamps(monkeypatch) -> None:
    """The site file's times as a filesystem with 1-second timestamps stamps them (ext3,
    128-byte-inode ext4, an NFS server on one): whole seconds."""
    real = config._stat_key

    def coarse(path):
        key = real(path)
        if key is None:
            return None
        return (*key[:3], key[3] // 10**9 * 10**9, key[4] // 10**9 * 10**9, *key[5:])

    monkeypatch.setattr(config, "_stat_key", coarse)


def test_a_same_size_edit_within_one_timestamp_tick_is_seen(node, monkeypatch):
    """git's racily clean case: the prolog compiles the config, and within the same second the
    site file is rewritten in place with the same size (count = 8 -> 7). Size, mtime and ctime
    all still match the key. Before: the stale config (8 GPUs) was served from the compiled
    copy until some later edit; now a key changed within RACY_NS of its load is trusted only
    while the file holds the very bytes that were parsed."""
    _coarse_timestamps(monkeypatch)
    site = _site(node)
    text = site.read_text()
    for _ in range(3):
        time.sleep(1.02 - time.time() % 1)  # the start of a second: load and edit fit in it
        site.write_text(text)
        assert _load(node).get("gpu.count") == 8
        before = config._stat_key(site)
        site.write_text(text.replace("count = 8", "count = 7"))
        if config._stat_key(site) == before:
            break
        site.write_text(text)  # the second turned between: try again
    else:
        pytest.skip("could not edit within one second here")
    parsed = _no_parse(monkeypatch)
    assert _load(node).get("gpu.count") == 7
    assert parsed == [site]


def test_a_racy_key_keeps_the_bytes_and_an_old_one_none(node, monkeypatch):
    """A load that began within RACY_NS of the site file's change keeps the parsed bytes and
    is served after comparing them (no parse); once the file is older than that, a new
    compiled copy keeps none and is served on its key alone."""
    site = _site(node)
    _load(node)
    kept = marshal.loads(Path(compiled_path(node)).read_bytes())
    assert kept[5] == site.read_bytes()  # racy: the file was just copied
    parsed = _no_parse(monkeypatch)
    _same(_load(node), load_config(site))
    assert parsed == [site]  # the load_config above, not _load

    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + config.RACY_NS + 10**9)
    Path(compiled_path(node)).unlink()
    _load(node)
    assert marshal.loads(Path(compiled_path(node)).read_bytes())[5] is None
    parsed.clear()
    assert _load(node).get("gpu.count") == 8 and parsed == []


def test_code_changed_within_the_bound_is_not_compiled(node, monkeypatch):
    """The code that validates the config (an upgrade rewriting config.py in place) changed
    within RACY_NS of the load: nothing is compiled, the next load parses again."""
    real = config._code_key
    now = time.time_ns()  # the code's change time, the same for every stat of it

    def fresh_code():
        fmt, version, parts = real()
        return fmt, version, tuple((*p[:3], now, now, *p[5:]) if p else p for p in parts)

    monkeypatch.setattr(config, "_code_key", fresh_code)
    _load(node)
    assert not Path(compiled_path(node)).exists()
