"""The node path's paths are str (issue 25: no pathlib on a job start): compat.pure_path and
path_parts read a path as pathlib does, and config's paths are the ones pathlib gave."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from rsc_health import compat, config


def test_a_path_is_read_as_pathlib_reads_it():
    rng = random.Random(25)
    pieces = ["/", "//", "///", "a", ".", "..", "b/", "./", "c d", "é", "x.toml"]
    samples = ["", "/", "//", "///", ".", "..", "/etc/rsc_health/config.toml", "a//b/",
               "//net/share", "/var/lib/../lib/./rsc_health/",
               # pure_path's fast path: a str already in pathlib's form is itself
               "a/.", "./a", "a/./b", "/.", "./", "a/", "/a/b", "a/b", "..", "../a", "a/..", "/.."]
    samples += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
                for _ in range(20000)]
    for text in samples:
        want = PurePosixPath(text)
        assert compat.pure_path(text) == str(want), text
        assert compat.pure_path(want) == str(want), text
        root, parts = compat.path_parts(text)
        assert root == want.root and parts == list(want.parts[1 if want.root else 0:]), text
        assert compat.join_parts(root, parts[:-1]) == str(want.parent), text


def test_a_path_must_be_text():
    with pytest.raises(TypeError):
        compat.pure_path(b"/etc")  # type: ignore[arg-type]


@pytest.mark.parametrize("root", ["/", "/tmp/x", "/tmp//x/", "rel/./y", "rel", "", "//host/n"])
def test_the_state_dir_and_compiled_config_are_where_pathlib_put_them(root, monkeypatch):
    cfg = config.load_config(config.os.devnull)
    base = Path(root or "/")
    configured = Path(cfg.get("node.state_dir"))
    assert config.state_dir(cfg, base) == str(base / configured.relative_to(configured.anchor))
    assert config.state_dir(cfg, str(base)) == config.state_dir(cfg, base)
    assert config.compiled_path(base) == str(base / configured.relative_to(configured.anchor)
                                              / config.COMPILED_FILE)
    monkeypatch.setenv("RSC_HEALTH_ROOT", root)
    assert config.node_root() == str(base) and isinstance(config.node_root(), str)
    assert config.node_root(base) == str(base)


def test_config_imports_no_pathlib():
    code = ("import sys; from rsc_health import config; "
            "c = config.load_config(config.os.devnull); config.state_dir(c, config.node_root());"
            "print(sorted(m for m in ('pathlib', 'fnmatch', 're', 'enum', 'functools', "
            "'datetime', 'json') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(Path(config.__file__).parents[1])})
    assert out.stdout.strip() == "[]", out.stderr


def test_path_mode_answers_as_pathlibs_exists_is_dir_and_is_symlink(tmp_path):
    """One reading of pathlib's stat errors for durable and config: a dangling or looping
    symlink, a file where a directory is on the way and a NUL are "no", as pathlib says."""
    import os
    import pathlib
    import stat as st

    from rsc_health.compat import path_mode

    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.symlink(tmp_path / "dir", tmp_path / "todir")
    names = ["file", "dir", "dangling", "loop", "todir", "missing", "file/under", "nul\x00"]
    for name in names:
        path = str(tmp_path / name) if "\x00" not in name else str(tmp_path) + "/" + name
        p = pathlib.Path(path)
        mode, lmode = path_mode(path), path_mode(path, follow=False)
        assert (mode is not None) == p.exists(), name
        assert (mode is not None and st.S_ISDIR(mode)) == p.is_dir(), name
        assert (lmode is not None and st.S_ISLNK(lmode)) == p.is_symlink(), name
