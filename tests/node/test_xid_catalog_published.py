"""Our XID catalog against NVIDIA's published one (tests/fixtures/xid/nvidia_xid_catalog.csv,
a dated copy of docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): every code it
lists is ours too, and each acts as NVIDIA's immediate action says by the rule written at the top
of rsc_health/xid_catalog.toml, or stricter with a reason, never laxer."""

from __future__ import annotations

import csv
from pathlib import Path

from rsc_health.model import Level, Severity
from rsc_health.xid import ACTIONS, load_catalog

PUBLISHED = Path(__file__).parents[1] / "fixtures" / "xid" / "nvidia_xid_catalog.csv"

# The rule (the catalog's header says the same): NVIDIA's immediate action -> (action, repair).
RULE = {
    **dict.fromkeys(("RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48",
                     "WORKFLOW_NVLINK_ERR"), ("drain_now", True)),
    **dict.fromkeys(("CONTACT_SUPPORT", "CHECK_MECHANICALS", "UPDATE_SWFW", "CHECK_UVM"),
                    ("drain_after_job", True)),
    **dict.fromkeys(("RESTART_APP", "WORKFLOW_XID_45"), ("warn", False)),
    "IGNORE": ("ignore", False),
    "WORKFLOW_NVLINK5_ERR": ("by_severity", False),
    "XID_154": ("by_recovery_action", False),
}
# NVIDIA puts the fault on the program (investigatory action), where the node needs nothing.
APP_AT_FAULT = {"CHECK_APP/CUDA", "WORKFLOW_XID_13", "WORKFLOW_XID_31", "XID_137_FLOW"}
APP_BY_TRIGGER_TEXT = {43, 45}  # "a user application error", "the user application aborts"
NODE_NEEDS_NOTHING = {"RESTART_APP", "IGNORE", "WORKFLOW_XID_45"}
# Entries that are not what the rule gives: stricter than NVIDIA (kept from before, or NVIDIA's
# own trigger text), and the codes the table gives no bucket. A new one is a decision: add it
# here and give its reason in the catalog.
DEVIATING = {43, 63, 92, 94, *range(162, 173)}
APPLICATION_EXCEPTIONS = {32, 68}


def _published() -> dict[int, dict]:
    with PUBLISHED.open(newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {int(r["code"]): r for r in rows}


def _rank(action: str) -> int:
    return int(ACTIONS[action]) if action in ACTIONS else int(Severity.DRAIN_NOW)


def test_the_fixture_is_nvidias_table_whole():
    table = _published()
    assert sorted(table) == list(range(1, 173))
    assert table[79]["immediate"] == "RESTART_BM" and table[109]["immediate"] == "RESET_GPU"
    assert {r["immediate"] for r in table.values()} <= {*RULE, ""}


def test_the_catalog_lists_every_xid_nvidia_publishes():
    ours = {int(c) for c in load_catalog().data["codes"]}
    assert sorted(set(_published()) - ours) == []


def test_each_xid_acts_as_nvidias_immediate_action_says():
    codes = load_catalog().data["codes"]
    wrong, laxer, deviating = [], [], set()
    for code, row in _published().items():
        entry = codes[str(code)]
        assert entry.get("nvidia") == (row["immediate"] or "none"), code  # its source
        ours = (entry["action"], bool(entry.get("repair", False)))
        want = RULE.get(row["immediate"])
        if ours == want:
            assert "why" not in entry, code
            continue
        deviating.add(code)
        if not entry.get("why"):
            wrong.append((code, row["immediate"], ours))
        if want and (_rank(ours[0]), ours[1]) < (_rank(want[0]), want[1]):
            laxer.append((code, row["immediate"], ours))
    assert (wrong, laxer) == ([], [])
    assert deviating == DEVIATING


def test_application_is_set_where_nvidia_puts_the_fault_on_the_program():
    cat = load_catalog()
    app = cat.application_codes()
    expected = {
        code for code, row in _published().items()
        if row["immediate"] in NODE_NEEDS_NOTHING
        and (row["investigatory"] in APP_AT_FAULT or code in APP_BY_TRIGGER_TEXT)
    }
    assert app ^ expected == APPLICATION_EXCEPTIONS
    for code in APPLICATION_EXCEPTIONS:
        assert cat.data["codes"][str(code)].get("application_why"), code
    # Never the program's where the node itself needs a reset, a reboot or a hand.
    assert not [c for c in app if cat.rule(c).severity > Severity.WARN]


def test_newly_listed_reset_class_xids_drain_now_for_repair():
    cat = load_catalog()
    for code in (46, 109, 155, 156, 158, 151):
        rule = cat.rule(code)
        assert (rule.severity, rule.repair) == (Severity.DRAIN_NOW, True), code
    for code in (8, 32, 39, 126):  # RESTART_APP: the node stays in service
        assert cat.rule(code).severity is Severity.WARN, code
    for code in (56, 57, 58, 61, 65, 73, 81, 122, 142):  # CONTACT_SUPPORT
        assert (cat.rule(code).severity, cat.rule(code).repair) == (Severity.DRAIN_AFTER_JOB, True)


def test_a_context_switch_timeout_xid_109_line_drains_the_node(node):
    """XID 109 (ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR, NVIDIA: RESET_GPU) was not in the catalog:
    it only warned and the node kept taking jobs on a GPU that needs a reset."""
    node.append("dev/kmsg", "3,1400,36500000000,-;NVRM: Xid (PCI:0000:5d:00): 109, pid=2814, "
                            "name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT, "
                            "Info 0x3c046\n")
    findings, verdict = node.check()
    xid = [f for f in findings if f.family == "xid" and f.code == "xid109"]
    assert [(f.component, f.severity, f.repair) for f in xid] == [
        ("gpu3", Severity.DRAIN_NOW, True)]
    assert verdict.level is Level.DRAIN_NOW
    assert verdict.reason.startswith("rsc_health:now:xid109:gpu3 XID 109 Context Switch Timeout")
