"""NVML, the reader the GPU families share: which backend, and its answers from an
abandonable child. (Each family collects the rest itself: rsc_health.checks.)"""

from __future__ import annotations

import os

from rsc_health.collect import gpu as gpu_mod
from rsc_health.collect import hangs
from rsc_health.collect.sysfs import pure

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:  # annotations only: config reads the family registry, which reads this
    from _typeshed import StrPath  # str | os.PathLike[str]

    from rsc_health.config import Config


def gpu_backend(cfg: Config, root: StrPath, telemetry: bool = False):
    """`auto`: replay when reading a test/snapshot root that carries captured answers.
    telemetry: ask live NVML for the telemetry fields too (only when that family runs)."""
    gcfg = cfg.section("gpu")
    root = pure(root)  # str(Path(root)): "/." is the live node "/", as before
    rel = str(gcfg.get("replay_file", "rsc_health/nvml.json")).lstrip("/")
    replay = pure(os.path.join(root, rel))  # str(Path(root) / rel): named in its errors
    backend = gcfg.get("backend", "auto")
    if backend == "replay" or (backend == "auto" and root != "/" and os.path.exists(replay)):
        return gpu_mod.ReplayBackend(replay)
    return gpu_mod.NvmlBackend(max_links=int(gcfg.get("max_nvlinks", 18)), telemetry=telemetry,
                               binding=str(gcfg.get("nvml_binding", "own")))


def read_nvml(cfg: Config, root: StrPath, state, hangs_before: dict[str, dict],
              telemetry: bool = False, deadline: float | None = None) -> None:
    """NVML's answers into state.nvml_answers and state.gpu. Live NVML is asked from an
    abandonable child (a wedged driver blocks its calls in the kernel); a probe abandoned
    before whose child is still waiting is not asked again. A failure is a checker error
    (state.errors), a hang is said in state.hung_probes.

    `deadline` (time.monotonic(), the stage's): the child is waited for until [gpu]
    nvml_timeout_s, never past it, as the IB reader is. A job start whose budget is shorter
    than nvml_timeout_s otherwise waited on past its own watchdog: the run ended with the child
    neither killed nor recorded (one more stuck child every job start) and nothing read after
    NVML (the kernel log's XIDs among it) judged. Past the deadline already, NVML is not asked
    (a checker error; a hang on record stays as it was)."""

    def guard(fn):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a collector bug is a checker finding
            state.errors.append(("gpu", "nvml", f"{type(exc).__name__}: {exc}"))
            return None

    backend = gpu_backend(cfg, root, telemetry)
    if isinstance(backend, gpu_mod.NvmlBackend):
        timeout = float(cfg.get("gpu.nvml_timeout_s", 10.0))
        if deadline is not None:
            import time

            left = deadline - time.monotonic()
            if left <= 0:
                state.errors.append(("gpu", "nvml", "stage deadline passed: NVML was not "
                                     "asked"))
                return
            timeout = min(timeout, left)
        mark = hangs.marker(hangs.NVML, root)
        state.probes_asked.append(hangs.NVML)
        waiting = hangs_before.get(hangs.NVML) or {}
        if hangs.still_waiting(waiting) and waiting.get("after_health") is True:
            # The child left behind hung in a warn-only telemetry field, after every GPU's
            # health had answered: the health calls still return. Not asking them until that
            # child comes back would let a GPU lost meanwhile take jobs for up to
            # nvml_hang_sweeps sweeps; ask them again from a new child (telemetry is not
            # asked while the old one waits). Should this one hang too, it is the record and
            # nothing is asked again: at most two children stuck.
            answers = guard(lambda: _nvml_answers(
                gpu_backend(cfg, root, telemetry=False), timeout, state, mark))
            if hangs.NVML not in state.hung_probes:
                state.hung_after_health.add(hangs.NVML)
                state.hung_probes[hangs.NVML] = (
                    f"NVML: the telemetry probe abandoned before (pid {waiting['pid']}) is still "
                    f"waiting in the driver; health asked again without telemetry")
        elif hangs.still_waiting(waiting):
            state.hung_probes[hangs.NVML] = (
                f"NVML: the probe abandoned before (pid {waiting['pid']}) is still waiting "
                f"in the driver; not asked again")
            answers = None
        else:
            answers = guard(lambda: _nvml_answers(backend, timeout, state, mark))
    else:
        answers = guard(backend.read)
    if answers is not None:
        state.nvml_answers = answers
        state.gpu = guard(lambda: gpu_mod.parse_answers(answers))
        _refused_handles(state)


def _refused_handles(state) -> None:
    """Each GPU whose handle NVML refused (gpu.HANDLE_REFUSED), or gave but then refused
    every health call so (GpuState.unanswered: no more usable), into state.refused_probes;
    every GPU NVML was asked about counts as asked (hangs.update: one that answers again
    starts the count afresh). Answers that never reached the GPUs (a hang before the count)
    ask nothing."""
    report = state.gpu
    if report is None or report.error or report.malformed:
        return
    state.probes_asked.append(hangs.NVML_HANDLE)
    for g in report.gpus:
        if g.error in gpu_mod.HANDLE_REFUSED and gpu_mod.err(g.answers) == g.error:
            state.refused_probes[hangs.nvml_handle(g.index)] = (
                f"NVML refused gpu{g.index}'s handle: {g.error}")
        elif g.unanswered:
            state.refused_probes[hangs.nvml_handle(g.index)] = (
                f"NVML gave gpu{g.index}'s handle, then refused every health call: "
                f"{g.unanswered}")


def _nvml_answers(backend, timeout: float, state, mark: str | None = None) -> dict | None:
    """NVML's answers from an abandonable child; None when it hung before the device count.
    When it hangs mid-read (one GPU's call blocks in a wedged driver), what it answered
    before is kept and judged (a GPU lost before the hang still drains), the hang itself is
    said (`hung_probes`: the engine's nvml_hung), and the GPUs it never reached are
    unanswered (checker errors, never drains)."""
    import time

    from rsc_health.collect import bounded

    started = time.monotonic()
    try:
        return bounded.call(backend.read_streamed, timeout, streaming=True, mark=mark)
    except bounded.Died as exc:
        # A crash, not a hang: nothing waits in the kernel, so no hang is recorded (hangs
        # count toward a drain; a checker that crashes must not drain the node). The own
        # binding is checked against pynvml's layouts and a stub, not every driver: should
        # it crash, the health pass is asked again through pynvml in the time left.
        if backend.binding == "own" and not backend.telemetry:
            state.errors.append(("gpu", "nvml", (
                f"the own NVML binding's child died: {exc}; the health pass was asked again "
                f'through pynvml (set [gpu] nvml_binding = "pynvml" and report this)')))
            fallback = gpu_mod.NvmlBackend(max_links=backend.max_links, binding="pynvml")
            left = max(0.5, timeout - (time.monotonic() - started))
            return _nvml_answers(fallback, left, state, mark)
        state.errors.append(("gpu", "nvml", f"NVML's child died: {exc}"))
        return gpu_mod.with_unanswered(gpu_mod.unpack_report(exc.partial))
    except bounded.Abandoned as exc:
        answers = gpu_mod.with_unanswered(gpu_mod.unpack_report(exc.partial))
        state.probe_pids[hangs.NVML] = exc.pid
        if answers is None:
            state.hung_probes[hangs.NVML] = f"NVML: Abandoned: {exc}"
            return None
        got = sum(1 for d in answers["devices"] if d.get("error") != "NVML_ERROR_TIMEOUT")
        if got >= answers["device_count"]:
            state.hung_after_health.add(hangs.NVML)
        where = (f"after answering for {got} of {answers['device_count']} GPUs"
                 if got < answers["device_count"] else
                 "in the telemetry pass, after every GPU's health answers")
        state.hung_probes[hangs.NVML] = f"NVML: Abandoned: {exc} (NVML hung {where})"
        return answers
