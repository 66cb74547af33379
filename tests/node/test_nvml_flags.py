"""NVML's yes/no answers (a retirement or remap pending, a remap failed, a link up) are judged
on their type, not on truthiness: only a real bool or the integers 0/1 (what pynvml returns)
say yes or no. "false" as a string, 1.0, [], {} or 2 in a captured or replayed answer is
something the checker could not read: a checker error, never a drain (and never a silent
"no" either)."""

from __future__ import annotations

import pytest

from rsc_health.model import Level, Severity, Status

from .conftest import bad

NOT_FLAGS = ["false", "true", "0", "1", "", 1.0, 0.0, 2, -1, [], [1], {}, {"x": 1}]


def _no_drain_but_said(node, family):
    findings, verdict = node.check(only={"gpu", family})
    found = bad(findings)
    assert not [f for f in found if f.severity > Severity.WARN], [(f.code, f.reason)
                                                                   for f in found]
    assert verdict.level is Level.CHECKER_ERROR, [(f.code, f.reason) for f in found]
    assert any(f.status is Status.ERROR and f.code == f"{family}_unreadable" for f in found)


@pytest.mark.parametrize("value", NOT_FLAGS, ids=repr)
def test_a_retirement_pending_flag_that_is_not_a_flag_is_a_checker_error(node, value):
    node.nvml(lambda d: d["devices"][1].update(
        retired_pages={"sbe": 0, "dbe": 0, "pending": value}))
    _no_drain_but_said(node, "remap")


@pytest.mark.parametrize("key", ["pending", "failure"])
@pytest.mark.parametrize("value", NOT_FLAGS, ids=repr)
def test_a_remap_flag_that_is_not_a_flag_is_a_checker_error(node, key, value):
    node.nvml(lambda d: d["devices"][1]["remapped_rows"].update({key: value}))
    _no_drain_but_said(node, "remap")


@pytest.mark.parametrize("value", NOT_FLAGS, ids=repr)
def test_a_link_state_that_is_not_a_flag_is_a_checker_error_not_a_down_link(node, value):
    node.nvml(lambda d: d["devices"][1]["nvlink"][3].update(state=value))
    _no_drain_but_said(node, "nvlink")


@pytest.mark.parametrize("value", [-1, 2**70, 1.5, "3", True])
def test_a_retired_page_count_no_gpu_holds_is_a_checker_error(node, value):
    node.nvml(lambda d: d["devices"][1].update(
        retired_pages={"sbe": value, "dbe": 0, "pending": 0}))
    _no_drain_but_said(node, "remap")


@pytest.mark.parametrize(("pending", "code", "severity"), [
    (True, "retire_pending", Severity.DRAIN_AFTER_JOB),
    (1, "retire_pending", Severity.DRAIN_AFTER_JOB),
])
def test_real_flags_still_drain(node, pending, code, severity):
    node.nvml(lambda d: d["devices"][1].update(
        retired_pages={"sbe": 1, "dbe": 2, "pending": pending}))
    found = bad(node.check(only={"gpu", "remap"})[0])
    assert [(f.component, f.code, f.severity) for f in found] == [("gpu1", code, severity)]


@pytest.mark.parametrize("pending", [False, 0])
def test_real_no_is_no(node, pending):
    node.nvml(lambda d: d["devices"][1].update(
        retired_pages={"sbe": 1, "dbe": 2, "pending": pending}))
    findings, verdict = node.check(only={"gpu", "remap"})
    assert bad(findings) == [] and verdict.level is Level.OK


def test_retired_pages_past_the_limit_still_drain(node):
    node.nvml(lambda d: d["devices"][1].update(
        retired_pages={"sbe": 40, "dbe": 20, "pending": False}))
    found = bad(node.check(only={"gpu", "remap"})[0])
    assert [(f.code, f.severity) for f in found] == [("retired_pages_exhausted",
                                                       Severity.DRAIN_NOW)]


@pytest.mark.parametrize(("key", "code"), [("failure", "remap_failed"),
                                           ("pending", "remap_pending")])
@pytest.mark.parametrize("value", [True, 1])
def test_real_remap_flags_still_drain(node, key, code, value):
    node.nvml(lambda d: d["devices"][1]["remapped_rows"].update({key: value}))
    found = bad(node.check(only={"gpu", "remap"})[0])
    assert [(f.component, f.code) for f in found] == [("gpu1", code)]


@pytest.mark.parametrize("value", [0, False])
def test_a_real_down_link_still_drains(node, value):
    node.nvml(lambda d: d["devices"][1]["nvlink"][3].update(state=value))
    found = bad(node.check(only={"gpu", "nvlink"})[0])
    assert [(f.component, f.code) for f in found] == [("gpu1", "nvlink_down")]


def test_a_link_entry_without_a_state_is_a_checker_error_not_a_down_link(node):
    node.nvml(lambda d: d["devices"][1]["nvlink"][3].pop("state"))
    _no_drain_but_said(node, "nvlink")
