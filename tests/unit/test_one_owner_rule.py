"""One reading of "owned by us" (collect.sysfs.ours: root's or the running user's) for what
the node path reads its orders and state from. It was written by hand in eight places; a
ninth that spells it differently (forgetting the running user, or root) would refuse an
operator's read-only check or trust a file it should not. Each place now asks `ours`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from rsc_health.collect.sysfs import ours

ROOT = Path(__file__).resolve().parents[2] / "rsc_health"
BY_HAND = re.compile(r"in \(0, os\.geteuid\(\)\)|in \(os\.geteuid\(\), 0\)")


def test_root_and_the_running_user_are_ours_and_no_one_else():
    assert ours(0) and ours(os.geteuid())
    assert not ours(65534 if os.geteuid() != 65534 else 65533)


def test_no_module_spells_the_owner_rule_by_hand():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(ROOT.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if BY_HAND.search(line)]
    assert found == []
