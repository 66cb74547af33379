"""A replayed or captured NVML document (`check --from`, [gpu] backend = replay) with one
answer of the wrong shape: that field's checker error, the rest of the node still judged,
never a crash of the whole run (one engine_error hiding every other GPU's faults)."""

from __future__ import annotations

import pytest

from rsc_health.model import Level

from .conftest import bad

UNKNOWN = {"error": "NVML_ERROR_UNKNOWN"}


def _gpu5_dbe(doc) -> None:
    doc["devices"][5]["ecc"]["volatile"]["uncorrected"] = 4


def _judged(node):
    findings, verdict = node.check()
    shown = [(f.family, f.component, f.code, f.reason[:80]) for f in bad(findings)]
    assert not any(f.code == "engine_error" or "check failed" in f.reason
                   for f in findings), shown
    assert any(f.code == "ecc_dbe" and f.component == "gpu5" for f in findings), shown
    assert verdict.level is Level.DRAIN_NOW, shown
    return findings


def test_one_garbled_nvlink_answer_does_not_hide_another_gpus_double_bit_error(node):
    """gpu3's `nvlink` is an error object instead of the list of links, and gpu5 has 4
    volatile uncorrectable ECC errors. nvlink.counters iterated the dict's keys and raised
    AttributeError: the whole run was one engine checker error, gpu5's DBE never judged."""
    def edit(doc):
        doc["devices"][3]["nvlink"] = dict(UNKNOWN)
        _gpu5_dbe(doc)
    node.nvml(edit)
    findings = _judged(node)
    gpu3 = [(f.code, f.reason) for f in bad(findings) if f.component == "gpu3"]
    assert gpu3 and all(code.endswith("_unreadable") for code, _ in gpu3), gpu3
    assert any("nvlink" in reason and "UNKNOWN" in reason for _, reason in gpu3), gpu3


def _set(path: str, value):
    def edit(doc):
        dev = doc["devices"][3]
        *up, last = path.split(".")
        for key in up:
            dev = dev[key]
        dev[last] = value
    return edit


def _nvlink_entry(doc):
    doc["devices"][3]["nvlink"][2] = "link 2"


@pytest.mark.parametrize("edit, field", [
    (_set("ecc", []), "ecc"),
    (_set("ecc.volatile", [0, 0]), "ecc.volatile"),
    (_set("ecc.aggregate", [0, 0]), "ecc.aggregate"),
    (_set("pcie", [4, 5, 16, 16, 0]), "pcie"),
    (_set("nvlink", 18), "nvlink"),
    (_nvlink_entry, "nvlink[2]"),
    (_set("index", "3"), "index"),
    (_set("index", 2.5), "index"),
    (_set("remapped_rows", [0, 0, 0, 0]), "remapped_rows"),
], ids=["ecc", "ecc.volatile", "ecc.aggregate", "pcie", "nvlink-number", "nvlink-entry",
        "index-string", "index-float", "remapped_rows"])
def test_a_malformed_answer_is_that_fields_checker_error_not_the_whole_runs(node, edit, field):
    """A list where an object belongs, a non-object link, a GPU index that is no integer:
    gpu3's checker error naming the field; gpu5's double-bit error still drains now."""
    def both(doc):
        edit(doc)
        _gpu5_dbe(doc)
    node.nvml(both)
    findings = _judged(node)
    gpu3 = [f.reason for f in bad(findings) if f.component == "gpu3"]
    assert any(f"gpu3 {field}: NVML_ANSWER_MALFORMED" in r for r in gpu3), gpu3
    assert not [f for f in bad(findings) if f.component == "gpu3"
                and not f.code.endswith("_unreadable")], gpu3


def test_a_family_whose_counters_cannot_be_read_does_not_end_every_familys_run(node,
                                                                            monkeypatch):
    """Whatever else a family's counters() meets that it cannot read, it is that family's
    checker error: the other families (gpu5's double-bit error) are still judged."""
    from rsc_health.checks import BY_NAME

    def boom(state):
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(BY_NAME["nvlink"].counters, "_value", boom)
    node.nvml(_gpu5_dbe)
    findings = _judged(node)
    assert any("counters unreadable: AttributeError" in f.reason for f in bad(findings)), [
        (f.family, f.code, f.reason[:80]) for f in bad(findings)]
