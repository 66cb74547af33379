"""GPU presence and accessibility: NVML itself, the device count, lost GPUs, temperature and
hardware throttling."""

from __future__ import annotations

from rsc_health.checks._finding import checker_error, fail, gpu_name, ok, warn
from rsc_health.collect import hangs
from rsc_health.collect.gpu import known, unusable, val, versions
from rsc_health.model import Finding, Severity

# nvmlClocksThrottleReason* bits that mean the hardware protected itself.
HW_THROTTLE = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}


def check(state, cfg: dict) -> list[Finding]:
    gcfg = cfg.get("gpu", {})
    expected = int(gcfg.get("count", 0))
    report = state.gpu
    wedged = _wedged(state, gcfg) if expected else []
    if report is None:
        return wedged
    return wedged + _answered(state, report, gcfg, expected)


def _wedged(state, gcfg: dict) -> list[Finding]:
    """NVML hung on this run and on [gpu] nvml_hang_sweeps sweeps in a row: the driver is
    wedged and answers nothing until the GPUs are reset. The node's fault, not a checker
    error for ever: drain after the job (a repair)."""
    hang = hangs.wedged(state, hangs.NVML, int(gcfg.get("nvml_hang_sweeps", 3)))
    if hang is None:
        return []
    return [fail("gpu", hangs.NVML, Severity.DRAIN_AFTER_JOB, "nvml_wedged",
                 f"NVML has not answered for {hang['sweeps']} sweeps in a row, a wedged "
                 f"driver: reset the GPUs", repair=True, probe=hangs.NVML, **hang)]


def _answered(state, report, gcfg: dict, expected: int) -> list[Finding]:
    if report.malformed:
        return [checker_error("gpu", "nvml", f"gpu: NVML answers not understood: "
                              f"{report.malformed}")]
    if report.error:
        if expected == 0:
            return [ok("gpu", "nvml", f"no GPUs expected ({report.error})")]
        if not unusable(report.error):
            return [_could_not_ask("nvml", "gpu", report.error)]
        code, text = {
            "NVML_ERROR_LIBRARY_NOT_FOUND": ("nvml_missing", "NVML library not found"),
            "NVML_ERROR_DRIVER_NOT_LOADED": ("driver_not_loaded", "NVIDIA driver not loaded"),
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
                "driver_mismatch", "NVIDIA driver/library version mismatch (driver upgraded "
                "without a reboot?)"),
            "NVML_ERROR_GPU_NOT_FOUND": ("gpu_missing", f"NVML found no GPU of {expected}"),
        }.get(report.error, ("nvml_error", f"NVML failed: {report.error}"))
        return [fail("gpu", "nvml", Severity.DRAIN_NOW, code, text, repair=True, nvml=report.error)]

    out: list[Finding] = []
    if len(report.gpus) < expected:
        out.append(
            fail(
                "gpu", "gpus", Severity.DRAIN_NOW, "gpu_missing",
                f"{len(report.gpus)} of {expected} GPUs visible", repair=True,
            )
        )
    temp_max = float(gcfg.get("temperature_max_c", 87))
    for g in report.gpus:
        comp = gpu_name(g.index)
        # Its bus id rides along (never in the component: that is the finding's identity in
        # the historian), so the heartbeat can say which bus id each index has (gpuname).
        bus = {"bus_id": g.pci_bus_id} if g.pci_bus_id else {}
        # So do the driver and firmware versions (qualification's driver/firmware trigger).
        bus.update(versions(report, g))
        if g.error and not unusable(g.error):
            out.append(_refused(state, g, gcfg) or _could_not_ask(comp, comp, g.error))
            continue
        if g.error:
            code = "gpu_lost" if g.error == "NVML_ERROR_GPU_IS_LOST" else "gpu_inaccessible"
            out.append(
                fail("gpu", comp, Severity.DRAIN_NOW, code, f"{comp} not accessible: {g.error}",
                     repair=True, nvml=g.error)
            )
            continue
        if g.unanswered:
            # Every health call refused: the refused handle's count (_refused), one checker
            # error until then, not one a field.
            out.append(_refused(state, g, gcfg) or checker_error(
                "gpu", comp, f"{comp}: NVML gave its handle, then answered none of its health "
                f"calls ({g.unanswered}, {len(g.field_errors)} answers)", nvml=g.unanswered))
            continue
        for field, error in g.field_errors.items():
            out.append(checker_error("gpu", comp, f"{comp} {field}: {error}", nvml=error))
        found = False
        temp = val(g.answers.get("temperature"))
        if isinstance(temp, (int, float)) and temp > temp_max:
            found = True
            out.append(warn("gpu", comp, "gpu_hot", f"{comp} at {temp} C (max {temp_max:g})",
                            **bus))
        reasons = val(g.answers.get("throttle_reasons"))
        if isinstance(reasons, int):
            hw = [name for bit, name in HW_THROTTLE.items() if reasons & bit]
            if hw:
                found = True
                out.append(
                    warn("gpu", comp, "gpu_throttle", f"{comp} throttled: {', '.join(hw)}",
                         throttle_reasons=reasons, **bus)
                )
        if not found:
            out.append(ok("gpu", comp, f"{comp} {g.name or ''} ok".replace("  ", " "), **bus))
    return out


def _refused(state, g, gcfg: dict) -> Finding | None:
    """NVML refused this GPU's handle (HANDLE_REFUSED), or gave it and refused every health
    call so (GpuState.unanswered: the same record), on this run and on [gpu]
    handle_error_sweeps sweeps in a row: no moment's contention but a GPU in a bad state (one
    the driver failed to initialise answers so on every call), which no job can use. The node's
    fault: drain after the job, a repair. None before then (a checker error, as one run's)."""
    name = hangs.nvml_handle(g.index)
    rec = hangs.wedged(state, name, int(gcfg.get("handle_error_sweeps", 3)))
    if rec is None:
        return None
    comp = gpu_name(g.index)
    if g.error:
        code, what, error = "gpu_no_handle", f"refused its handle ({g.error})", g.error
    else:
        code, error = "gpu_no_answer", g.unanswered
        what = f"given its handle, refused every health call ({error})"
    return fail("gpu", comp, Severity.DRAIN_AFTER_JOB, code,
                f"{comp}: NVML has {what} for {rec['sweeps']} sweeps in a row, a GPU in a bad "
                f"state (failed to initialise?): reset or repair",
                repair=True, nvml=error, probe=name, **rec)


def _could_not_ask(component: str, label: str, error: str) -> Finding:
    """An NVML answer that is no evidence against the GPU: a checker error naming it, and
    saying so when this checker does not know the code at all (a driver newer than its table,
    or not an NVML code), so the operator can tell "cannot look" from "do not understand"."""
    note = "" if known(error) else " (a return code this checker does not know: newer driver?)"
    return checker_error("gpu", component, f"{label}: NVML could not be asked: {error}{note}",
                         nvml=error)
