"""With `[infiniband] rate_gbps` set, an ACTIVE port whose `rate` file cannot be read (the
kernel's rate_show answers EINVAL for a width it cannot tell, or the file is missing, empty or
not its format) was judged "ok ... ACTIVE 0 Gb/s": the check could not look at the link's
speed and said all is well, so a port trained down to 1X or SDR stayed in service. Now it is
the checker's error on that port; with no rate expected, nothing is said of it."""

from __future__ import annotations

import pytest

from rsc_health.engine import run
from rsc_health.model import Level, Status
from rsc_health.policy import decide

RATE = "sys/class/infiniband/mlx5_1/ports/1/rate"


def _unreadable(node, how: str) -> None:
    path = node.path(RATE)
    path.unlink()
    if how == "empty":
        path.write_text("")
    elif how == "garbled":
        path.write_text("Unknown\n")
    elif how == "directory":  # a read that fails, as EINVAL from rate_show does
        path.mkdir()


@pytest.mark.parametrize("how", ["missing", "empty", "garbled", "directory"])
def test_an_active_port_whose_rate_cannot_be_read_is_the_checkers_error_not_ok(node, how):
    _unreadable(node, how)
    findings, verdict = node.check()
    port = [f for f in findings if f.component == "mlx5_1/1"]
    assert [(f.family, f.status) for f in port] == [("checker", Status.ERROR)]
    assert "rate" in port[0].reason and verdict.level is Level.CHECKER_ERROR


def test_with_no_rate_expected_an_unreadable_rate_says_nothing(node):
    _unreadable(node, "missing")
    cfg = node.config
    cfg.data["infiniband"]["rate_gbps"] = 0
    findings = run(cfg, node.root)
    verdict = decide(findings)
    assert [f.status for f in findings if f.component == "mlx5_1/1"] == [Status.OK]
    assert verdict.level is Level.OK
