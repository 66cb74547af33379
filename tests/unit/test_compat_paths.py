"""The node path's paths are str (issue 25: no pathlib on a job start): compat.pure_path and
path_parts read a path as pathlib does."""

from __future__ import annotations

import random
from pathlib import PurePosixPath

import pytest

from rsc_health import compat


def test_a_path_is_read_as_pathlib_reads_it():
    rng = random.Random(25)
    pieces = ["/", "//", "///", "a", ".", "..", "b/", "./", "c d", "é", "x.toml"]
    samples = ["", "/", "//", "///", ".", "..", "/etc/rsc_health/config.toml", "a//b/",
               "//net/share", "/var/lib/../lib/./rsc_health/"]
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
