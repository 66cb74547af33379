"""The shipped job_submit.lua and rsc-health agree on the feature and the size of a big job
(the lua runs inside slurmctld and cannot read rsc-health's config); the real Slurm test
(tests/slurm/test_suspect_tier.py) proves the lua adds the constraint."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rsc_health.config import load_config

LUA = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "job_submit.lua"


def test_the_lua_requires_the_configured_feature_at_the_configured_size():
    text = LUA.read_text()
    cfg = load_config(os.devnull)
    feature = re.search(r'^local RSC_TRUSTED = "([^"]+)"$', text, re.M)
    size = re.search(r"^local RSC_BIG_JOB_NODES = (\d+)$", text, re.M)
    assert feature and feature.group(1) == cfg.get("suspects.trusted_feature")
    assert size and int(size.group(1)) == cfg.get("suspects.big_job_nodes")
    # Both of Slurm's entry points call it: a job grown by `scontrol update` is caught too.
    assert text.count("\trsc_require_trusted(job_desc, nil)\n") == 1
    assert text.count("\trsc_require_trusted(job_desc, job_rec)\n") == 1
