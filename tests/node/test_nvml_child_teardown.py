"""The NVML child shuts NVML down before its answer (helper-136, on 71ce3f8, which left the
driver's teardown to the child's exit, watched by no one): a teardown that blocks in a wedged
driver is a hung probe (nvml_hung, the child killed and recorded, not asked again while it
waits, nvml_wedged after nvml_hang_sweeps sweeps), never one more child stuck in the kernel
each run, none of them killed, recorded or said."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pynvml

from rsc_health import engine
from rsc_health.collect import hangs
from tests.node.conftest import Node
from tests.node.test_nvml_backend import FakeNvml


def _living_children() -> list[int]:
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(name))
    return out


def test_an_nvml_child_whose_driver_teardown_hangs_is_said_and_not_left_behind_per_run(
        monkeypatch, hung_mount):
    """The driver's teardown of the NVML client blocks in the kernel (modelled, as the other
    hang tests do, by a statfs on a FUSE mount whose daemon never answers). Before 71ce3f8 the
    teardown was nvmlShutdown, in the child, before its answer: a hang there was abandoned at
    nvml_timeout_s and recorded. Now the child's exit does it, after the answer: three sweeps
    leave three children stuck, unkilled and unrecorded, and the node is judged healthy."""
    FakeNvml().install(monkeypatch)
    before = set(_living_children())
    real_exit = os._exit
    parent = os.getpid()

    def exit_through_the_driver(code):
        if os.getpid() != parent:  # the forked NVML child: its descriptors close at exit
            os.statvfs(str(hung_mount / "checkpoint"))
        real_exit(code)

    monkeypatch.setattr(os, "_exit", exit_through_the_driver)
    # Before 71ce3f8 the same teardown was nvmlShutdown's, called in the child.
    monkeypatch.setattr(pynvml, "nvmlShutdown",
                        lambda: os.statvfs(str(hung_mount / "checkpoint")))
    node = Node(hung_mount)
    cfg = node.config
    cfg.data["gpu"].update(backend="nvml", nvml_binding="pynvml", count=2, nvml_timeout_s=1.0)
    sdir = Path(engine.state_dir(cfg, node.root))
    try:
        runs = [engine.run(cfg, node.root, only={"gpu"}, sweep=True) for _ in range(3)]
        stuck = sorted(set(_living_children()) - before)
        record = hangs.load(sdir / engine.HANGS_FILE)["probes"].get(hangs.NVML)
        said = [f.code for run in runs for f in run if f.code in ("nvml_hung", "nvml_wedged")]
        # At most the one child on record may be left stuck, and its hang is said.
        assert len(stuck) <= 1, f"{len(stuck)} NVML children stuck in the driver, " \
            f"record={record}, findings={said}"
        assert record is not None and said
    finally:
        monkeypatch.setattr(os, "_exit", real_exit)
        for pid in _living_children():
            if pid not in before:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
