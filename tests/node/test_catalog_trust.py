"""The XID and SXid catalog overrides decide what drains: `[xid] catalog_override` naming a
file another user may write let that user set XID 79 to "ignore" (a node off the bus keeps
taking jobs) or XID 13, which any user's job can raise, to drain_now (healthy nodes drained at
will). The site config itself is refused unless root's and writable by no one else; the files
it names as policy now follow the same rule: refused, said as the family's checker error, and
nothing consumed (the XID is judged once the file is fixed)."""

from __future__ import annotations

import os

import pytest

from rsc_health.engine import run
from rsc_health.policy import decide

from .conftest import bad

XID79 = ("3,1400,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off "
         "the bus.\n")
IGNORE_79 = '[codes.79]\naction = "ignore"\nname = "planted"\n'


def _override(tmp_path, how: str):
    site = tmp_path / "policy" / "xid_site.toml"
    site.parent.mkdir(mode=0o755)
    site.write_text(IGNORE_79)
    if how == "others_may_write":
        site.chmod(0o666)
    elif how == "owned_by_someone_else":
        os.chown(site, 65534, 65534)
    elif how == "directory_others_may_write":
        site.parent.chmod(0o777)
    return site


@pytest.mark.parametrize("how", ["others_may_write", "owned_by_someone_else",
                                 "directory_others_may_write"])
def test_an_xid_catalog_others_could_write_is_refused_and_consumes_nothing(node, tmp_path, how):
    if os.geteuid() != 0 and how == "owned_by_someone_else":
        pytest.skip("chown needs root")
    site = _override(tmp_path, how)
    node.append("dev/kmsg", XID79)
    cfg = node.config
    cfg.data["xid"]["catalog_override"] = str(site)
    findings = run(cfg, node.root, only={"xid"})
    errors = [f for f in findings if f.code == "xid_error"]
    assert len(errors) == 1 and "refused" in errors[0].reason and str(site) in errors[0].reason
    assert not [f for f in findings if f.code == "xid79"]
    # Fixed (the packaged catalog alone here): the XID was never consumed, and drains.
    findings, verdict = node.check(only={"xid"})
    assert [f.code for f in bad(findings)] == ["xid79"] and verdict.drains


def test_a_root_owned_catalog_in_a_sticky_directory_is_used(node, tmp_path):
    site = _override(tmp_path, "")
    site.parent.chmod(0o1777)
    node.append("dev/kmsg", XID79)
    cfg = node.config
    cfg.data["xid"]["catalog_override"] = str(site)
    assert not decide(run(cfg, node.root, only={"xid"})).drains  # its 79 = ignore holds


def test_an_sxid_catalog_others_may_write_is_refused(node, tmp_path):
    site = _override(tmp_path, "others_may_write")
    cfg = node.config
    cfg.data["sxid"]["catalog_override"] = str(site)
    findings = run(cfg, node.root, only={"sxid"})
    assert [f.code for f in findings] == ["sxid_error"]
    assert "refused" in findings[0].reason
