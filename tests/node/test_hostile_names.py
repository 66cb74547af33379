"""Names the node path takes from its environment are bytes the OS gave it: a node name that
is not UTF-8 reaches Python as lone surrogates. An XID's spool record id is a hash over the
node's name, and that hash encoded the name strictly: every run that found an XID ended in a
checker fault at the spool step, before anything was spooled or acted on."""

from __future__ import annotations

import os

from rsc_health import nodepath

from .test_nodepath_faults import XID79, _records, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import slurm_away


def test_a_node_name_that_is_not_utf8_still_spools_and_keeps_an_xid79(node_env,  # noqa: F811
                                                                      monkeypatch):
    monkeypatch.setitem(os.environb, b"SLURMD_NODENAME", b"node\xff01")
    (node_env / "dev/kmsg").open("a").write(XID79)
    assert nodepath.run_stage("prolog", slurm_factory=lambda c, d: slurm_away()) == 1
    codes = [r.get("code") for r in _records(node_env)]
    assert "xid79" in codes and "checker_fault" not in codes
