"""D6 (low): gpu_burn._PROGRESS scans from every `N% proc'd:` to the end of its line when no
`errors: ... temps:` follows (gpu-burn prints its progress with \r, never \n, so a whole run is
one line). Parse time is quadratic in the output and unbounded in-process (runner.run_test
parses whatever fits under MAX_OUTPUT = 16 MiB): 64 KiB ~4 s, 1 MiB ~17 min, 16 MiB ~days."""
from __future__ import annotations

import time

from rsc_health.qualify import parse
from rsc_health.sim import qualify_tools as standin


def test_a_progress_flood_without_errors_segments_parses_in_linear_time():
    good = standin.gpu_burn([16950.0] * 8)
    text = "\r1.0%  proc'd: " * (96 * 1024 // 15) + "\n" + good
    t0 = time.monotonic()
    out = parse("gpu_burn", text)
    took = time.monotonic() - t0
    assert took < 2.0, f"{len(text)} bytes took {took:.1f} s ({out.inconclusive or 'parsed'})"
