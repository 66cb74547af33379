"""`dcgmi diag -r 1|2|3 -j`: DCGM's own diagnostic, judged by DCGM. Its JSON (schema:
../shared/data/qualify/tool-outputs/dcgm_diag_schema.json) lists test categories, each test's
per-entity results with `status` Pass | Fail | Warn | Skip and warnings. A `Fail` is the
hardware's; a run-time error, a test every GPU skipped, or a warning that says the test could
not do its work (allocation failed, GPU busy with another process) is inconclusive, never a
pass (DCGM itself has reported Pass after an allocation error). A `Fail` is inconclusive that
way only when every warning it carries says so and none names a hardware fault: a GPU with a
double-bit ECC error fails its next allocation too, and DCGM lists both (error_id 4 beside 56).

A `Fail` whose every finding is a setting of the node, not a measurement of its parts, is
inconclusive: DCGM 4's `software` test fails a healthy GPU whose persistence mode is off
(DCGM_FR_PERSISTENCE_MODE, error_id 29: a real DCGM 4.2.3 run on a GB10), and a CUDA
performance-limiting environment variable (DCGM_FR_BAD_CUDA_ENV, 28) fails it the same way; a
qualification `failed` sends the node to repair, which neither needs.

A `Warn` is a test that ran and did not fail, on which DCGM saw a condition past its own
limits that is not (yet) a fault: a PCIe replay rate (DCGM_FR_PCI_REPLAY_RATE, which its health
watches also rate a warning), clocks held back for heat or power, single-bit ECC errors past a
count. In a sweep it warns (checks/dcgm); in a qualification, the proof a node gets before it
takes jobs again, it is said in the outcome (`warned`) and [qualify] dcgm_warn decides: by
default the run is inconclusive (retried, never a pass) -- those conditions are the fail-slow
signs a drained node should not carry back into service.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rsc_health.qualify.outcome import Metric, Outcome

NAME = "dcgm_diag"
TOOL = "dcgmi"

# DCGM's own result words (lower-cased), not rsc-health's statuses.
DCGM_FAIL, DCGM_WARN, DCGM_PASS = "fail", "warn", "pass"

# Warnings that mean the test did not test (DCGM error texts, lower-cased substrings).
NOT_TESTED = ("allocat", "being used by another", "busy", "timeout", "timed out",
              "insufficient", "not enough", "unable to", "could not", "failed to initialize")

# DCGM error_ids (dcgm_errors.h, DCGM_FR_*) that name a fault of the hardware: ECC/DBE/SBE, page
# retirement and row remapping, memory mismatch and faulty memory, InfoROM, thermal and clock
# violations, NVLink and NVSwitch, PCIe replays and link width/generation, XID/SXID, P2P writes.
# A warning of one is a finding whatever else the result says: never read as "did not test".
HARDWARE_IDS = frozenset({
    3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17, 40, 41, 42, 43, 45, 46, 52, 57, 58, 70,
    71, 79, 80, 81, 83, 84, 85, 86, 87, 88, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107,
    109})
# The same faults in DCGM 2.x, which prints no error_id: its message texts (dcgm_errors.h
# DCGM_FR_*_MSG, and the field tags its DCGM_FR_FIELD_* messages name), lower-cased substrings.
HARDWARE_TEXTS = ("double-bit", "double bit", "single-bit ecc", "ecc_dbe", "ecc_sbe", "dbe",
                  "row remap", "row_remap", "retired page", "retired_page", "page retirement",
                  "memory mismatch", "faulty memory", "miscompare", "uncorrectable",
                  "uncontained", "corrupt inforom", "xid", "thermal violation",
                  "allowed temperature", "nvlink error", "nvlink link", "nvlinks are up",
                  "errors on nvswitch", "pcie replay", "pcie_replay", "pci link",
                  "peer-to-peer test")

# DCGM error_ids (dcgm_errors.h) that name a node setting, never a part: DCGM_FR_BAD_CUDA_ENV,
# DCGM_FR_PERSISTENCE_MODE. DCGM 2.x prints no error_id: its message texts (dcgm_errors.h
# DCGM_FR_*_MSG, lower-cased substrings) say the same.
SETTING_IDS = {28: "DCGM_FR_BAD_CUDA_ENV", 29: "DCGM_FR_PERSISTENCE_MODE"}
SETTING_TEXTS = ("persistence mode for gpu", "performance-limiting environment variable")


@dataclass(frozen=True)
class Result:
    """One test's result for one entity, as `dcgmi diag -j` printed it."""

    test: str
    entity_group: str  # "GPU", "Switch", ...; "" for a system-wide test (Deployment tests)
    entity_id: str
    status: str  # lower case: pass | fail | warn | skip | ...
    warnings: tuple[str, ...]
    error_ids: tuple[int | None, ...] = ()  # each warning's DCGM error_id (DCGM 3.x on)

    @property
    def entity(self) -> str:
        return f"{self.entity_group}{self.entity_id}"

    def _ids(self) -> tuple[int | None, ...]:
        return self.error_ids + (None,) * (len(self.warnings) - len(self.error_ids))

    def hardware(self) -> str | None:
        """The first warning that names a fault of the hardware, if any: by its error_id
        (HARDWARE_IDS), or where DCGM printed none by its text (HARDWARE_TEXTS), a text that
        also says the test could not run ("Could not query field ecc_dbe_volatile_total")
        being no finding."""
        for warning, error_id in zip(self.warnings, self._ids()):
            if error_id is not None:
                if error_id in HARDWARE_IDS:
                    return warning
                continue
            text = warning.lower()
            if (any(k in text for k in HARDWARE_TEXTS)
                    and not any(k in text for k in NOT_TESTED)):
                return warning
        return None

    def untested(self) -> str | None:
        """The warning that says the test could not do its work, when that is what the result
        says: a Pass with one proved nothing; a Fail or Warn only when every warning reads so
        and none names a hardware fault (an allocation that failed beside a double-bit ECC
        error is the error's, and the Fail stands)."""
        flagged = [w for w in self.warnings if any(k in w.lower() for k in NOT_TESTED)]
        if not flagged:
            return None
        if self.status == DCGM_PASS:
            return flagged[0]
        if self.hardware() is not None:
            return None
        # Every other warning a setting of the node (persistence mode off beside a failed
        # allocation): no part's finding either.
        if any(not (any(k in w.lower() for k in NOT_TESTED) or _setting(w, i))
               for w, i in zip(self.warnings, self._ids())):
            return None
        return flagged[0]

    def setting(self) -> str | None:
        """The first warning, when every one names a node setting (persistence mode off, a
        CUDA environment variable), not the hardware; None when any may be the part's."""
        if not self.warnings:
            return None
        if all(_setting(w, i) for w, i in zip(self.warnings, self._ids())):
            return self.warnings[0]
        return None


def _setting(warning: str, error_id: int | None) -> bool:
    """Whether one warning names a node setting: by its error_id, or its text where none."""
    if error_id is not None:
        return error_id in SETTING_IDS
    return any(k in warning.lower() for k in SETTING_TEXTS)


def diagnostic(doc: dict) -> dict:
    """The diagnostic's body: "DCGM Diagnostic" (DCGM 3.x/4.x), or "DCGM GPU Diagnostic"
    (DCGM 2.x, per-result "gpu_ids")."""
    if not isinstance(doc, dict):
        raise TypeError("not a JSON object")
    diag = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(diag, dict):
        raise KeyError("DCGM Diagnostic")
    return diag


def results(doc: dict) -> list[Result]:
    """Every per-entity result of a parsed `dcgmi diag -j` document (the one reader of it:
    the qualification plug-in here and the dcgm node family). Raises KeyError / TypeError /
    ValueError on a document that is not one."""
    out = []
    for category in diagnostic(doc).get("test_categories", []):
        for test in category["tests"]:
            name = str(test["name"])
            for result in test["results"]:
                if not isinstance(result, dict):
                    raise TypeError(f"{name}: a result that is not an object")
                listed = result.get("warnings", []) or []
                warnings = tuple(str(w.get("warning", "")) if isinstance(w, dict) else str(w)
                                 for w in listed)
                error_ids = tuple(w.get("error_id") if isinstance(w, dict) and
                                  type(w.get("error_id")) is int else None for w in listed)
                if "entity_group" in result or "entity_id" in result:
                    group, ident = str(result["entity_group"]), str(result["entity_id"])
                elif "gpu_ids" in result:  # DCGM 2.x: "gpu_ids" : "0" (or "0,1")
                    group, ident = "GPU", str(result["gpu_ids"])
                elif "gpu_id" in result:  # DCGM 3.0-3.3 (NVIDIA/DCGM#139): "gpu_id" : "0"
                    group, ident = "GPU", str(result["gpu_id"])
                else:
                    group, ident = "", ""
                out.append(Result(name, group, ident, str(result["status"]).lower(), warnings,
                                  error_ids))
    return out


def unplaced_fails(doc: dict) -> list[str]:
    """Tests whose own summary (DCGM 4's "test_summary") says Fail while none of their
    per-entity results does: a failure no result places on a part. Nothing a verdict may pass
    over; the caller reads them as inconclusive."""
    out = []
    for category in diagnostic(doc).get("test_categories", []):
        for test in category["tests"]:
            summary = test.get("test_summary")
            if not (isinstance(summary, dict)
                    and str(summary.get("status", "")).lower() == DCGM_FAIL):
                continue
            placed = any(isinstance(r, dict) and str(r.get("status", "")).lower() == DCGM_FAIL
                         for r in test.get("results") or [])
            if not placed:
                out.append(str(test["name"]))
    return out


def parse(text: str, tool: str | None = None) -> Outcome:
    doc = json.loads(text)
    diag = diagnostic(doc)
    if diag.get("runtime_error"):
        return Outcome(NAME, inconclusive=f"runtime error: {str(diag['runtime_error'])[:120]}")
    ran = 0
    metrics: list[Metric] = []
    warned: list[str] = []
    unproven: str | None = None  # the first result that tested nothing, or a setting
    for r in results(doc):
        if r.status not in (DCGM_FAIL, DCGM_PASS, DCGM_WARN):
            continue
        untested = r.untested()
        if untested:
            unproven = unproven or f"{r.test} {r.entity}: {untested[:160]}"
            continue
        if r.status == DCGM_FAIL:
            setting = r.setting()
            if setting:
                unproven = unproven or (f"{r.test} {r.entity}: a node setting, not the "
                                        f"hardware: {setting[:160]}")
                continue
            # The hardware's: a Fail on another result that tested nothing never hides it.
            why = (r.hardware() or r.warnings[0])[:160] if r.warnings else "no reason given"
            return Outcome(NAME, failed=f"{r.test} {r.entity}: {why}")
        ran += 1
        if r.status == DCGM_WARN:
            why = r.warnings[0][:160] if r.warnings else "no reason given"
            warned.append(f"{r.test} {r.entity}: {why}")
    if unproven:
        return Outcome(NAME, inconclusive=unproven)
    unplaced = unplaced_fails(doc)
    if unplaced:
        return Outcome(NAME, inconclusive=f"{unplaced[0]}: its summary says Fail and no "
                                          "result names the part")
    if not ran:
        return Outcome(NAME, inconclusive="every test skipped or none listed")
    # DCGM judges its own tests; what we keep is that they ran and passed, as a count.
    # A count: fewer than the same test's peers is a GPU or test DCGM skipped here and ran
    # there (inconclusive), never a margin that lets 39 of 40 pass and fails 15 of 16.
    metrics.append(Metric("dcgm-diag/passed_results", float(ran), "results", exact=True))
    return Outcome(NAME, metrics=metrics, warned=(f"DCGM Warn on {len(warned)} result(s): "
                                                  + "; ".join(warned[:3]) if warned else None))
