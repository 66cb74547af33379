"""A site's own node features are Slurm's to judge, not ours: one Slurm took in slurm.conf and
shows back (`ib:hdr`, `gpu+nvl`, `rack/3`) is handed back to it unchanged when the suspect tier
takes the trusted feature off. Only what would break the list scontrol is given is refused: a
comma (it would split one feature in two), '=' or whitespace or a control character (one
AvailableFeatures= value no more), an empty name, or one past 256 characters. Before, any
feature outside [A-Za-z0-9_.-] made every pass refuse that node: reported, never applied."""

from __future__ import annotations

import pytest

from rsc_health.historian import db
from rsc_health.slurm.cli_backend import SlurmCommandError, _one_feature
from rsc_health.slurm.memory import MemorySlurm
from tests.historian.test_suspects import T0, TRUSTED, cfg, ev, run_pass


@pytest.mark.parametrize("site", ["ib:hdr", "gpu+nvl", "rack/3", "h100_80gb", "knl.quad"])
def test_a_suspect_with_a_site_feature_slurm_accepts_loses_only_the_trusted_one(tmp_path, site):
    engine = db.connect(f"sqlite:///{tmp_path / 'h.db'}", create_missing=True)
    slurm = MemorySlurm()
    for i in range(1, 21):
        slurm.add_node(f"node{i:02d}", features=(site, TRUSTED), weight=10)
    res = run_pass(engine, slurm, cfg(tmp_path), T0, [ev("node07", T0)])
    assert not res.errors, res.errors
    assert slurm.info["node07"].features == (site,)
    assert slurm.info["node07"].weight == 1000
    engine.dispose()


@pytest.mark.parametrize("hostile", ["a,b", "a b", "a=b", "a\nb", "a\tb", "", "x" * 257,
                                     "a\x00b", "\u00e9t\u00e9 x"])
def test_what_would_break_the_feature_list_is_still_refused(hostile):
    with pytest.raises(SlurmCommandError):
        _one_feature(hostile)
    slurm = MemorySlurm()
    slurm.add_node("node01", features=("h100",), weight=10)
    with pytest.raises(SlurmCommandError):
        slurm.update_node("node01", features=["h100", hostile], weight=1000)
    assert (slurm.info["node01"].features, slurm.info["node01"].weight) == (("h100",), 10)
