"""The XID catalog is data, with a site override file over the packaged defaults."""

from __future__ import annotations

import pytest

from rsc_health.model import Level, Severity
from rsc_health.xid import CatalogError, load_catalog


def test_defaults_match_issue_2():
    cat = load_catalog()
    now = [48, 62, 64, 74, 79, 95, 119, 120, 136, 140, 143]
    assert all(cat.rule(x).severity is Severity.DRAIN_NOW and cat.rule(x).repair for x in now)
    assert all(cat.rule(x).severity is Severity.DRAIN_AFTER_JOB for x in (63, 92, 94))
    assert all(cat.rule(x).severity is Severity.WARN for x in (13, 31, 43, 45, 68, 69))
    assert cat.rule(9999).severity is Severity.WARN  # unknown
    for x in range(144, 151):
        assert cat.rule(x, "fatal").severity is Severity.DRAIN_NOW
        assert cat.rule(x, "nonfatal").severity is Severity.WARN


def test_site_override_replaces_codes_one_by_one(tmp_path, node):
    site = tmp_path / "xid_site.toml"
    site.write_text('[codes.13]\naction = "drain_after_job"\nname = "site says so"\n'
                    '[defaults]\nunknown = "ignore"\n')
    cat = load_catalog(site)
    assert cat.rule(13).severity is Severity.DRAIN_AFTER_JOB
    assert cat.rule(79).severity is Severity.DRAIN_NOW  # untouched
    assert cat.rule(9999).severity is Severity.NONE
    # ...and the engine uses it when the config names it.
    node.append("dev/kmsg", "3,1400,1,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, "
                            "Graphics SM Warp Exception\n")
    cfg = node.config
    cfg.data["xid"]["catalog_override"] = str(site)
    from rsc_health.engine import run
    from rsc_health.policy import decide

    assert decide(run(cfg, node.root)).level is Level.DRAIN_AFTER_JOB


def test_bad_override_is_a_checker_error(tmp_path, node):
    site = tmp_path / "bad.toml"
    site.write_text('[codes.79]\naction = "panic"\n')
    with pytest.raises(CatalogError):
        load_catalog(site)
    cfg = node.config
    cfg.data["xid"]["catalog_override"] = str(site)
    from rsc_health.engine import run

    errors = [f for f in run(cfg, node.root) if f.status.value == "error"]
    assert [f.component for f in errors] == ["xid catalog"]


def test_a_site_can_change_what_each_xid154_recovery_action_does(tmp_path):
    site = tmp_path / "xid_site.toml"
    site.write_text('[by_recovery_action]\ndrain_p2p = "drain_now"\nrepair = ["drain_p2p"]\n')
    cat = load_catalog(site)
    assert cat.rule(154, recovery="drain_p2p").severity is Severity.DRAIN_NOW
    assert cat.rule(154, recovery="drain_p2p").repair
    assert not cat.rule(154, recovery="gpu_reset").repair  # the site's repair list replaced ours
    assert cat.rule(154, recovery="none").severity is Severity.NONE


def test_an_unknown_action_in_by_recovery_action_is_refused_naming_the_file(tmp_path):
    site = tmp_path / "xid_site.toml"
    site.write_text('[by_recovery_action]\ngpu_reset = "panic"\n')
    with pytest.raises(CatalogError, match="by_recovery_action.*panic"):
        load_catalog(site)
