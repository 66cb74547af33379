"""[nodes."GLOB"] overrides are matched as fnmatch.fnmatchcase matches them, without importing
fnmatch (and re) on a job start: rsc_health.config.glob_match."""

from __future__ import annotations

import fnmatch
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rsc_health import config

NAMES = ["gpu001", "gpu017", "gpu-a100-017", "node7", "dgx-h100-0042", "login1", "a", "",
         "gpu01.cluster", "GPU017", "gpu\n1", "gpu[1]", "gpu!7", "gpu-7", "x*y", "gpu^1", "gpu]"]
PATTERNS = ["gpu*", "gpu0[0-1]?", "*a100*", "dgx-h100-00[!0-3]?", "node[0-9]", "gpu[!a-z]*",
            "*", "?", "", "gpu0*7", "*7", "gpu[01][0-9][0-9]", "gpu[a-cx-z0-9]*", "GPU*",
            "gpu?1", "**", "gpu[001-010]", "gpu[]1]*", "gpu[!]]*", "gpu[", "gpu[!", "gpu[^1]",
            "gpu[z-a]1", "gpu[!z-a]*", "gpu[a-]7", "gpu[-7]", "gpu[\\]]", "gpu[!-]7", "x[*]y",
            "gpu[a-c-e]*", "gpu[--0]7", "*[!0-9]", "[!a-z]*", "gpu*.cluster"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_node_globs_match_what_fnmatch_matches(pattern):
    for name in NAMES:
        assert config.glob_match(name, pattern) == fnmatch.fnmatchcase(name, pattern), name


def test_random_globs_match_what_fnmatch_matches():
    rng = random.Random(25)
    for _ in range(20000):
        pattern = "".join(rng.choice("ab-z0!^[]\\*?&|.\n") for _ in range(rng.randint(0, 8)))
        name = "".join(rng.choice("abz0-!^[]\\.\n") for _ in range(rng.randint(0, 6)))
        try:
            want: object = fnmatch.fnmatchcase(name, pattern)
        except Exception as exc:  # noqa: BLE001 - fnmatch's own failure is what is compared
            want = type(exc)
        try:
            got: object = config.glob_match(name, pattern)
        except Exception as exc:  # noqa: BLE001
            got = type(exc)
        assert got == want, (pattern, name)


def test_a_node_override_by_glob_applies_to_the_nodes_it_matches(tmp_path):
    site = tmp_path / "config.toml"
    site.write_text('[nodes."gpu0[0-1]?"]\ngpu = { count = 4 }\n'
                    '[nodes."dgx-*"]\ngpu = { count = 2 }\n')
    site.chmod(0o644)
    cfg = config.load_config(site)
    assert cfg.for_node("gpu017").get("gpu.count") == 4
    assert cfg.for_node("dgx-h100-1").get("gpu.count") == 2
    assert cfg.for_node("gpu027").get("gpu.count") == cfg.get("gpu.count")


def test_matching_node_globs_imports_neither_fnmatch_nor_re():
    code = ("import sys; from rsc_health import config\n"
            "cfg = config.load_config(config.os.devnull)\n"
            "cfg.overrides = {'nodes': {'gpu0[0-1]?': {'gpu': {'count': 4}}, 'dgx-*': {}}}\n"
            "print(cfg.for_node('gpu017').get('gpu.count'), cfg.for_node('dgx-1').get('gpu.count')"
            " == cfg.get('gpu.count'), sorted({'fnmatch', 're'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(Path(config.__file__).parents[1])})
    assert out.stdout.split() == ["4", "True", "[]"], out.stderr
