"""The node's heartbeat says which bus id each GPU index has (rsc_health.gpuname): the real
sweep on the healthy fixture node, its NVML replay listing the GPUs with their bus ids."""

from __future__ import annotations

import json

from rsc_health import nodepath
from rsc_health.gpuname import bus_id
from tests.fixtures.nodes.node_copy import NODE_STATE
from tests.node.test_nodepath_faults import node_env  # noqa: F401 - the fixture
from tests.node.test_state_dir_read_only import node01_slurm


def test_the_sweeps_heartbeat_carries_each_gpu_index_with_its_bus_id(node_env):  # noqa: F811
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, deadline: node01_slurm()) == 0
    records = [json.loads(line) for path in sorted((node_env / NODE_STATE / "spool").iterdir())
               if path.is_file() for line in path.read_text().splitlines() if line.strip()]
    beats = [r for r in records if r["kind"] == "heartbeat"]
    assert beats, records
    gpus = beats[-1]["gpus"]
    assert sorted(gpus, key=int) == [str(i) for i in range(8)]  # the fixture's 8 GPUs
    buses = {bus_id(b) for b in gpus.values()}
    assert None not in buses and len(buses) == 8
