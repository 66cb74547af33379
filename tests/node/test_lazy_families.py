"""A stage imports only the family modules it runs: the registry names each family's
functions and file lists by module and attribute (checks._Attr), resolved on first use. Every
name in the registry still resolves to what its Family field promises, so the contract tests'
hold on every family is unchanged; and a prolog on a healthy node leaves the families it does
not run (nor keep counter baselines of) unimported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsc_health.checks import REGISTRY, _Attr
from rsc_health.config import load_config
from tests.fixtures.nodes.node_copy import copy_node

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = ("check", "collect", "counters", "capture")
NAMES = ("reads", "reads_config")
# A prolog reads every family's counters (a counter with no baseline yet is kept whoever
# read it), so these modules load in every stage; but not those whose counters come from their
# own collect alone (Family.counters_own: none when they did not run).
COUNTING = {f.name for f in REGISTRY if f.counters is not None and not f.counters_own}
# Standard-library modules a healthy prolog has no use for: copy (and weakref with it: config
# trees are copied by config._copied), signal (only to kill an abandoned probe), subprocess
# (a healthy prolog runs no program), dataclasses (rsc_health.record).
UNUSED = {"copy", "weakref", "signal", "subprocess", "dataclasses"}


@pytest.mark.parametrize("fam", REGISTRY, ids=lambda f: f.name)
def test_every_name_in_the_registry_resolves_to_what_its_field_promises(fam):
    for key in FUNCTIONS:
        value = getattr(fam, key)
        if value is not None:
            assert isinstance(value, _Attr) and callable(value.resolve()), (fam.name, key)
            assert value.module == fam.name
    for key in NAMES:
        value = getattr(fam, key)
        names = tuple(value)
        assert all(isinstance(n, str) and n for n in names), (fam.name, key, names)
        if isinstance(value, _Attr):
            assert names, f"{fam.name}.{key} names an empty tuple: leave it out"


def test_a_family_attribute_that_does_not_exist_fails_when_used_not_at_import():
    missing = _Attr("gpu", "no_such_function")
    with pytest.raises(AttributeError):
        missing()


def test_a_healthy_prolog_loads_only_the_families_it_runs_or_counts_and_no_failure_path(tmp_path):
    root = tmp_path / "node"
    copy_node(root)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO), "RSC_HEALTH_ROOT": str(root),
           "RSC_HEALTH_CONFIG": str(root / "config.toml"), "SLURMD_NODENAME": "node01",
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node01"}
    code = ("import json, sys\nfrom rsc_health import nodepath\ncode = nodepath.main(['prolog'])\n"
            f"UNUSED = {sorted(UNUSED)!r}\n"
            "print(json.dumps([code, sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('rsc_health.checks.')), "
            "sorted(m for m in UNUSED if m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout.splitlines()[-1]
    exit_code, loaded, unused = json.loads(out)
    assert exit_code == 0
    assert unused == []
    ran = set(load_config(root / "config.toml").get("slurm.prolog_families"))
    families = {f.name for f in REGISTRY}
    assert ran | COUNTING <= set(loaded)
    assert set(loaded) & families == ran | COUNTING
    assert families - ran - COUNTING, "nothing left to leave unloaded: the test proves nothing"
