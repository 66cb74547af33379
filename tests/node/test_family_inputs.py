"""A family reads what it declares, whatever runs it: NVML for every family that judges it
(checks.Family.nvml), and only the counters of the families that ran move their baselines."""

from __future__ import annotations

from rsc_health import nodepath
from tests.fixtures.nodes.node_copy import NODE_STATE

from .conftest import bad
from .test_nodepath_faults import _records, node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import node01_slurm


def _bump(node, edit) -> None:
    node.nvml(lambda doc: edit(doc["devices"]))


def test_check_only_pcie_judges_the_gpus_pcie_replays(node):
    node.check()  # the sweep's baselines
    _bump(node, lambda gpus: gpus[2]["pcie"].update(replay=500))
    findings, _ = node.check(only={"pcie"}, save_state=False)
    assert [(f.component, f.code) for f in bad(findings)] == [("gpu2", "pcie_replay")]


def _stage(name: str) -> int:
    return nodepath.run_stage(name, slurm_factory=lambda c, d: node01_slurm())


def test_a_prolog_that_does_not_judge_nvlink_leaves_its_errors_to_the_next_sweep(node_env):  # noqa: F811
    from .conftest import Node

    node = Node(node_env)
    assert _stage("sweep") == 0
    # Errors rise between two sweeps; a job starts in between (the prolog's families judge
    # neither NVLink nor PCIe): the next sweep must still see them.
    def rise(gpus):
        gpus[1]["nvlink"][3].update(replay=7)
        gpus[5]["pcie"].update(replay=900)

    _bump(node, rise)
    assert _stage("prolog") == 0
    _stage("sweep")
    seen = {(r["check"], r["component"], r["code"]) for r in _records(node_env)
            if r["kind"] == "check" and r["status"] != "ok"}
    assert ("nvlink", "gpu1", "nvlink_errors") in seen
    assert ("pcie", "gpu5", "pcie_replay") in seen
    assert (node_env / NODE_STATE / "counters.json").exists()


def test_after_a_reboot_the_first_prolog_keeps_a_baseline_for_the_next_sweep(node_env):  # noqa: F811
    from .conftest import Node

    node = Node(node_env)
    assert _stage("sweep") == 0
    node.write("proc/sys/kernel/random/boot_id", "0f0f0f0f-1111-2222-3333-444444444444\n")
    assert _stage("prolog") == 0  # the first run of the new boot judges no NVLink
    _bump(node, lambda gpus: gpus[6]["nvlink"][2].update(recovery=4))
    _stage("sweep")
    seen = {(r["check"], r["component"], r["code"]) for r in _records(node_env)
            if r["kind"] == "check" and r["status"] != "ok"}
    assert ("nvlink", "gpu6", "nvlink_errors") in seen
