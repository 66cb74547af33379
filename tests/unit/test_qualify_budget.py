"""The default tiers fit the time they are given. A tier whose tests cannot all finish within
[qualify] tier_budget_s ends inconclusive every time (the tests past the budget never run:
"no time left in the tier's budget"), and a flow that stops waiting before the job could have
stored its result cancels it: either way no node of that tier is ever cleared or failed. The
suspects' tier ([suspects] qualify_tier) is deep."""

from __future__ import annotations

from rsc_health.config import load_config
from rsc_health.node.stage import STAGES, budget
from rsc_health.qualify.runner import TIERS, tier_tests

# The least each default test takes, as its tool documents it: `dcgmi diag -r 3` is "long
# hardware diagnostics, normally lasting approximately 15 minutes", -r 2 "approximately two
# minutes", -r 1 seconds (DCGM's dcgmi diag reference); gpu_burn burns for the seconds its
# argv ends with. The other tests are counted as taking no time at all.
DCGM_LEVEL_S = {"1": 0.0, "2": 120.0, "3": 900.0}


def least_s(spec) -> float:
    if spec.plugin == "dcgm_diag":
        return DCGM_LEVEL_S[spec.command[spec.command.index("-r") + 1]]
    if spec.plugin == "gpu_burn":
        return float(spec.command[-1])
    return 0.0


def test_every_default_tier_fits_its_budget_and_the_flow_waits_past_it(tmp_path):
    site = tmp_path / "config.toml"
    site.write_text("")
    cfg = load_config(str(site))
    tier_budget = float(cfg.get("qualify.tier_budget_s"))
    gate = budget(cfg, STAGES["sweep"])  # two looks of the node's checks, half of it each
    for tier in TIERS:
        need = sum(least_s(s) for s in tier_tests(cfg, tier))
        assert need < tier_budget, f"{tier}: its tests take {need:.0f} s at the least"
    assert cfg.get("suspects.qualify_tier") in TIERS
    assert tier_budget + gate < float(cfg.get("qualify.flow_timeout_s"))
