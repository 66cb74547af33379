"""NVSwitch SXid lines: real shapes parsed, forged ones refused, judged by the SXid catalog
(fatal drains, non-fatal warns), each counted once across sweeps past a cursor of its own
that a stage judging only XIDs never moves."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rsc_health.collect import kmsg
from rsc_health.model import Level, Severity, Status
from rsc_health.xid import load_sxid_catalog
from tests.fixtures.nodes.node_copy import NODE_STATE
from tests.node.conftest import bad

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "sxid" / "kern.log"
FATAL = ("3,5001,99000100,-;nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 "
         "LTSSM Fault Up\n")
NONFATAL = ("4,5002,99000200,-;nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, "
            "Link 32 egress non-posted PRIV error (First)\n")


def test_every_real_line_shape_parses_and_a_cut_line_does_not():
    events = kmsg.parse_text(REAL.read_text(), "kern.log", kmsg.parse_sxid_line)
    got = [(e.switch, e.sxid, e.severity, e.detail) for e in events]
    assert got == [
        (3, 12028, "nonfatal", False), (0, 20034, "fatal", False),
        (0, 20009, "nonfatal", False), (0, 24007, "fatal", False),
        (3, 28006, "nonfatal", False), (1, 11004, "nonfatal", False),
        (2, 11004, None, True), (4, 19084, "nonfatal", False), (2, 10002, None, True),
    ]
    assert events[1].pci == "0000:00:00.0" and events[1].message == "Link 30 LTSSM Fault Up"
    # SXid lines are not XIDs, nor XID lines SXids.
    assert kmsg.parse_text(REAL.read_text()) == []
    assert kmsg.parse_sxid_line("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.") \
        is None


def test_another_programs_text_quoting_an_sxid_is_not_one():
    forged = [
        "Nov 21 03:14:15 host sshd[77]: Invalid user nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): "
        "20034, Fatal, x",
        "Nov 21 03:14:15 host alice: nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, x",
        "6,1,1,-;audit: name=\"nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal\"",
    ]
    assert [kmsg.parse_sxid_line(line) for line in forged] == [None, None, None]
    # The kernel's own line through syslog is one.
    assert kmsg.parse_sxid_line("Nov 21 03:14:15 host kernel: [131453.740743] nvidia-nvswitch0: "
                                "SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up")


def test_hostile_lines_are_skipped_in_bounded_time():
    huge = "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, " + "A" * 200_000
    binary = bytes(range(256)).decode("latin-1") * 50
    lines = [huge, binary, "nvidia-nvswitch99999: SXid (PCI:x): 1,",
             "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 999999, Fatal"]
    events = kmsg.parse_text("\n".join(lines), "", kmsg.parse_sxid_line)
    # The huge line is cut at MAX_LINE and still read as what it starts with; the rest are not
    # SXids (a switch number or code longer than the driver prints).
    assert [(e.sxid, e.severity) for e in events] == [(20034, "fatal")]
    assert len(events[0].message) <= 200


def test_the_catalog_drains_fatal_warns_non_fatal_and_reads_unknown_codes_by_their_word():
    cat = load_sxid_catalog()
    fatal = cat.rule(20034, "fatal")
    assert fatal.severity is Severity.DRAIN_NOW and fatal.repair
    assert cat.rule(20034, "nonfatal").severity is Severity.WARN
    assert all(cat.rule(x).severity is Severity.DRAIN_NOW for x in (12020, 22003, 23001, 23017))
    assert all(cat.rule(x, "nonfatal").severity is Severity.WARN for x in (11012, 12028, 19084))
    assert cat.rule(11004, "nonfatal").severity is Severity.DRAIN_AFTER_JOB
    assert cat.rule(28006, "nonfatal").severity is Severity.WARN  # not listed: its word
    assert cat.rule(28006, "fatal").severity is Severity.DRAIN_NOW
    assert cat.rule(28006, None).severity is Severity.DRAIN_AFTER_JOB


def test_a_fatal_sxid_drains_now_once_and_the_next_sweep_does_not_see_it_again(node):
    node.append("dev/kmsg", FATAL + NONFATAL)
    findings, verdict = node.check()
    sx = [f for f in findings if f.family == "sxid"]
    assert verdict.level is Level.DRAIN_NOW
    assert {(f.component, f.code, f.severity) for f in sx} == {
        ("nvswitch0", "sxid20034", Severity.DRAIN_NOW), ("nvswitch3", "sxid12028", Severity.WARN)}
    assert all(f.repair for f in sx if f.severity is Severity.DRAIN_NOW)
    again, verdict = node.check()
    assert [f.code for f in again if f.family == "sxid" and f.status is not Status.OK] == []
    assert verdict.level is Level.OK


def test_a_stage_that_judges_only_xids_leaves_sxid_lines_for_the_sweep(node):
    node.append("dev/kmsg", FATAL)
    node.check(only={"xid", "gpu"})  # a prolog with the default prolog_families
    assert (node.path(NODE_STATE) / "xid_cursor.json").exists()
    assert not (node.path(NODE_STATE) / "sxid_cursor.json").exists()
    findings, verdict = node.check()  # the sweep: every family
    assert [f.code for f in bad(findings) if f.family == "sxid"] == ["sxid20034"]


def test_detail_lines_count_with_their_first_line(node):
    node.append("dev/kmsg", FATAL + FATAL.replace("5001", "5003").replace(
        "Fatal, Link 28 LTSSM Fault Up", "Severity 5 Engine instance 28 Sub-engine instance 00"))
    findings, _ = node.check(only={"sxid"})
    sx = [f for f in findings if f.family == "sxid"]
    assert len(sx) == 1 and sx[0].data["detail_lines"] == 1 and sx[0].data["count"] == 1


def test_a_bad_site_catalog_is_a_checker_error_and_consumes_nothing(node, tmp_path):
    site = tmp_path / "sxid.toml"
    site.write_text('[codes.20034]\naction = "explode"\n')
    node.append("dev/kmsg", FATAL)
    cfg = node.config
    cfg.data["sxid"]["catalog_override"] = str(site)
    from rsc_health.engine import run

    findings = run(cfg, node.root, only={"sxid"})
    assert [f.code for f in findings] == ["sxid_error"]
    findings, _ = node.check(only={"sxid"})  # the packaged catalog again: still new
    assert [f.code for f in bad(findings)] == ["sxid20034"]


@pytest.mark.parametrize("how", ["empty", "truncated", "directory", "fifo", "dev_zero"])
def test_a_lost_sxid_cursor_never_has_an_sxid_judged_twice_and_is_rebuilt(node, how):
    from tests.node.test_lost_state import _break

    node.write("proc/uptime", "7200.00 50000.00\n")  # up two hours; the SXid an hour ago
    node.append("dev/kmsg", FATAL.replace("99000100", str(3600 * 10**6)))
    assert [f.code for f in node.check(only={"sxid"})[0]] == ["sxid20034"]
    _break(node.path(NODE_STATE) / "sxid_cursor.json", how)
    started = time.monotonic()
    first, _ = node.check(only={"sxid"})
    assert time.monotonic() - started < 10
    assert not [f for f in first if f.code == "sxid20034"]  # judged once already
    assert len([f for f in first if f.status is Status.ERROR and "cursor" in f.reason]) == 1
    second, verdict = node.check(only={"sxid"})
    assert verdict.level is Level.OK  # rebuilt: said once
