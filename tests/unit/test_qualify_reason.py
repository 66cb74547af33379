"""The drain reason a qualification fail leaves in Slurm: what an operator reads in `sinfo -R`,
120 characters at most (policy.MAX_REASON_LEN), read back by policy.parse_reason."""

from __future__ import annotations

from datetime import UTC, datetime

from rsc_health.policy import MAX_REASON_LEN, OUT_SINCE_PREFIX, parse_reason
from rsc_health.qualify.flow import qualify_reason

# A fail's detail as the judge writes it (the demo's confirmed suspect): the test's name first.
DETAIL = ("gpu_burn_long: gpu-burn/fp64_tc_flops:6 -24.1% vs peers median 1.702e+04 GFLOP/s "
          "(line 1.659e+04)")


def test_a_fail_names_its_test_once_and_keeps_the_gpu_and_the_figures():
    reason = qualify_reason("gpu_burn_long", DETAIL)
    assert reason == ("rsc_health:qualify:gpu_burn_long:gpu-burn/fp64_tc_flops:6 -24.1% vs "
                      "peers median 1.702e+04 GFLOP/s (line 1.659e+04)")
    assert len(reason) <= MAX_REASON_LEN
    assert parse_reason(reason) == {"mode": "qualify", "code": "gpu_burn_long",
                                    "text": DETAIL.split(": ", 1)[1]}


def test_out_since_comes_first_and_the_test_is_still_named_once():
    since = datetime(2026, 11, 28, 3, 4, tzinfo=UTC)
    reason = qualify_reason("node_checks", "node_checks: xid79: gpu3 XID 79", since)
    assert reason == (f"rsc_health:qualify:node_checks:{OUT_SINCE_PREFIX}2026-11-28T03:04Z "
                      "xid79: gpu3 XID 79")


def test_a_text_that_does_not_start_with_its_code_or_is_only_the_code_is_kept_whole():
    assert qualify_reason("inconclusive", "dcgm_r1: tool not found") == (
        "rsc_health:qualify:inconclusive:dcgm_r1: tool not found")
    # a longer test name that merely starts with the code is not cut
    assert qualify_reason("nccl", "nccl_allreduce: 12% under peers") == (
        "rsc_health:qualify:nccl:nccl_allreduce: 12% under peers")
    assert qualify_reason("gpu_burn", "gpu_burn:") == "rsc_health:qualify:gpu_burn:gpu_burn:"
    hostile = "gpu_burn: " + "x" * 500 + "\n\x00;`rm -rf /`"
    reason = qualify_reason("gpu_burn", hostile)
    assert len(reason) <= MAX_REASON_LEN and "\n" not in reason and "\x00" not in reason
