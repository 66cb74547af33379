from rsc_health.model import Finding, Level, Severity, Status
from rsc_health.policy import decide, format_reason, is_ours, parse_reason


def finding(sev: Severity, status: Status = Status.FAIL, code="xid79", repair=True, comp="gpu3"):
    return Finding("xid", comp, status, sev, "fell off the bus", code=code, repair=repair)


def test_worst_finding_sets_level_and_reason():
    v = decide([finding(Severity.WARN, Status.WARN), finding(Severity.DRAIN_NOW)])
    assert v.level is Level.DRAIN_NOW
    assert v.reason == "rsc_health:now:xid79:gpu3 fell off the bus"
    assert v.exit_code == 3
    assert not v.auto_resumable


def test_checker_error_never_drains_by_itself():
    err = Finding("checker", "nvml", Status.ERROR, Severity.WARN, "boom")
    assert decide([err]).level is Level.CHECKER_ERROR
    assert decide([err, finding(Severity.DRAIN_AFTER_JOB)]).level is Level.DRAIN_AFTER_JOB


def test_transient_causes_are_auto_resumable():
    f = Finding(
        "mount",
        "/checkpoint",
        Status.FAIL,
        Severity.DRAIN_NOW,
        "missing",
        code="mount_missing",
        repair=False,
    )
    v = decide([f])
    assert v.auto_resumable
    assert v.reason == "rsc_health:now:mount_missing:/checkpoint missing"


def test_reason_round_trips_and_human_reasons_are_not_ours():
    reason = format_reason(
        "job", [finding(Severity.DRAIN_AFTER_JOB), finding(Severity.DRAIN_AFTER_JOB)]
    )
    assert parse_reason(reason) == {
        "mode": "job",
        "code": "xid79",
        "text": "gpu3 fell off the bus (+1 more)",
    }
    assert not is_ours("Prolog error")
    assert not is_ours("swapping DIMM B2 -- alice")


def test_reason_is_sanitized_and_clipped():
    f = Finding("xid", "gpu0", Status.FAIL, Severity.DRAIN_NOW, "bad `rm -rf` $(x) " + "y" * 300)
    reason = decide([f]).reason
    assert len(reason) <= 120
    assert "`" not in reason and "$" not in reason
