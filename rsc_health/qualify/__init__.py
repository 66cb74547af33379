"""Qualification: the micro-benchmarks a node runs before it returns to service, each a plug-in.

A plug-in is one module in this package that names its tool and parses the tool's real output
into `Metric`s (per node, per GPU, per HCA) or says why the run proves nothing (`Outcome`
inconclusive: tool missing, output cut short, a setup the metric cannot be judged under) or
that the tool itself saw a fault (`Outcome.failed`: wrong results, a faulty GPU); a tool that
says a fault only on stderr as it exits non-zero has an optional `fault(stderr)` too. Metrics are
named as SuperBench names them (`nccl-bw/allreduce_8589934592_busbw`,
`ib-loopback/ib_write_8388608_ib0_bw`, `gemm-flops/fp64_tc_flops`), so an imported SuperBench
fleet baseline (baseline.py) lines up with our own results by name. Judging is peer-relative
(judge.py): no metric has a fixed threshold here.

The registry below is the only list of plug-ins; tests/unit/test_qualify_registry.py proves each
one parses its real output and a stand-in's, and says inconclusive on an empty one.
"""

from __future__ import annotations

from types import ModuleType

from rsc_health.qualify.outcome import Metric, Outcome

__all__ = ["PLUGINS", "Metric", "Outcome", "parse"]


def _registry() -> dict[str, ModuleType]:
    from rsc_health.qualify import (
        bandwidth_test,
        dcgm_diag,
        gpu_burn,
        nccl_tests,
        nvbandwidth,
        perftest,
    )

    return {m.NAME: m for m in (dcgm_diag, nccl_tests, perftest, gpu_burn, nvbandwidth,
                                bandwidth_test)}


PLUGINS = _registry()


def parse(test: str, text: str, tool: str | None = None) -> Outcome:
    """Parse one tool's output. Never raises on hostile text: garbage is inconclusive."""
    plugin = PLUGINS[test]
    try:
        return plugin.parse(text, tool)
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:
        return Outcome(test, inconclusive=f"unreadable {test} output ({type(exc).__name__}: "
                       f"{str(exc)[:80]})")
