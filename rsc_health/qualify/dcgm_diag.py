"""`dcgmi diag -r 1|2|3 -j`: DCGM's own diagnostic, judged by DCGM. Its JSON (schema:
../shared/data/qualify/tool-outputs/dcgm_diag_schema.json) lists test categories, each test's
per-entity results with `status` Pass | Fail | Warn | Skip and warnings. A `Fail` is the
hardware's; a run-time error, a test every GPU skipped, or a warning that says the test could
not do its work (allocation failed, GPU busy with another process) is inconclusive, never a
pass (DCGM itself has reported Pass after an allocation error).
"""

from __future__ import annotations

import json

from rsc_health.qualify.outcome import Metric, Outcome

NAME = "dcgm_diag"
TOOL = "dcgmi"

# Warnings that mean the test did not test (DCGM error texts, lower-cased substrings).
NOT_TESTED = ("allocat", "being used by another", "busy", "timeout", "timed out",
              "insufficient", "not enough", "unable to", "could not", "failed to initialize")


def parse(text: str, tool: str | None = None) -> Outcome:
    doc = json.loads(text)
    diag = doc["DCGM Diagnostic"]
    if diag.get("runtime_error"):
        return Outcome(NAME, inconclusive=f"runtime error: {str(diag['runtime_error'])[:120]}")
    ran = 0
    metrics: list[Metric] = []
    for category in diag.get("test_categories", []):
        for test in category["tests"]:
            name = str(test["name"])
            for result in test["results"]:
                status = str(result["status"]).lower()
                warnings = [str(w.get("warning", "")) for w in result.get("warnings", []) or []]
                entity = f"{result['entity_group']}{result['entity_id']}"
                if status == "fail":
                    why = warnings[0][:160] if warnings else "no reason given"
                    untested = next((w for w in warnings
                                     if any(k in w.lower() for k in NOT_TESTED)), None)
                    if untested:
                        return Outcome(NAME, inconclusive=f"{name} {entity}: {untested[:160]}")
                    return Outcome(NAME, failed=f"{name} {entity}: {why}")
                if status in ("pass", "warn"):
                    untested = next((w for w in warnings
                                     if any(k in w.lower() for k in NOT_TESTED)), None)
                    if untested:
                        return Outcome(NAME, inconclusive=f"{name} {entity}: {untested[:160]}")
                    ran += 1
    if not ran:
        return Outcome(NAME, inconclusive="every test skipped or none listed")
    # DCGM judges its own tests; what we keep is that they ran and passed, as a count.
    metrics.append(Metric("dcgm-diag/passed_results", float(ran), "results"))
    return Outcome(NAME, metrics=metrics)
