"""D3: `healthctl qualify run` judges with the fleet-wide config, never the node's own view
(`[nodes."GLOB"]` overrides, README "Configure"), while its gate resolves it. A site that sets
`[gpu] count` per node glob (top level 0: its CPU nodes) gets gpus=0 in verdict.missing: a node
whose gpu-burn ran on 7 of its 8 GPUs passes. With the same count at top level it is
inconclusive. The same holds for every [qualify] key set per node (baseline, min_peers,
dcgm_warn, tests)."""
from __future__ import annotations

import json
from pathlib import Path

from rsc_health.sim import qualify_tools as standin  # noqa: E402
from tests.fixtures.nodes.node_copy import HEALTHY, copy_node  # noqa: E402
from tests.unit.qualify_bad_node.qhelp import BURN, NCCL, db, qrun, tier, tools  # noqa: E402

TIER = tier(BURN, "@BASE@")


def _configs(tmp: Path) -> tuple[Path, Path]:
    base = tmp / "baseline.json"
    base.write_text(json.dumps({"gpu-burn/fp64_tc_flops": 16950.0}))
    base.chmod(0o644)
    hw = (HEALTHY / "config.toml").read_text()
    assert hw.startswith("# Expected") and "[gpu]\ncount = 8\n" in hw
    top = tmp / "top.toml"
    top.write_text(hw + TIER.replace("@BASE@", str(base)))
    # The same hardware said per node glob (the README's [nodes."gpu0*"] override).
    per_node = tmp / "per_node.toml"
    per_node.write_text(TIER.replace("@BASE@", str(base)) + "\n" + hw.replace(
        "[gpu]", '[nodes."gpu*".gpu]').replace("[infiniband]", '[nodes."gpu*".infiniband]')
        .replace("[mounts]", '[nodes."gpu*".mounts]'))
    return top, per_node


def test_gpu_count_set_per_node_is_ignored_by_the_judge(tmp_path):
    top, per_node = _configs(tmp_path)
    root = copy_node(tmp_path / "root")
    url = db(tmp_path)
    seven = tools(tmp_path, "gpu300", {"gpu_burn": standin.gpu_burn([16950.0] * 7)})
    # Control: [gpu] count = 8 at top level: 7 of 8 GPUs is inconclusive (exit 4).
    code, doc = qrun(top, url, "gpu300", seven, "--no-record", root=root)
    assert code == 4 and "ran on 7 of 8 GPUs" in doc["reason"], doc
    # The node's own view says 8 GPUs too (the gate used it: 8 GPUs in NVML, no finding).
    code, doc = qrun(per_node, url, "gpu300", seven, "--no-record", root=root)
    # Expected: inconclusive (exit 4), as above. Observed: exit 0, verdict pass.
    assert code == 4, (code, doc.get("verdict"), doc.get("reason"))


NCCL_TIER = tier(NCCL, "@A100@") + '\n[nodes."gpu*".qualify]\nbaseline = "@H100@"\n'


def test_a_baseline_set_per_node_is_ignored(tmp_path):
    """The imported baseline is not per GPU model, so a mixed fleet names one per node glob;
    `qualify run` reads the top-level one: an H100 node 30% under its H100 baseline passes
    against the A100 numbers."""
    a100, h100 = tmp_path / "a100.json", tmp_path / "h100.json"
    a100.write_text(json.dumps({"nccl-bw/allreduce_8589934592_busbw": 235.0}))
    h100.write_text(json.dumps({"nccl-bw/allreduce_8589934592_busbw": 360.0}))
    for p in (a100, h100):
        p.chmod(0o644)
    cfg = tmp_path / "config.toml"
    cfg.write_text((HEALTHY / "config.toml").read_text() + NCCL_TIER.replace(
        "@A100@", str(a100)).replace("@H100@", str(h100)))
    root = copy_node(tmp_path / "root")
    url = db(tmp_path)
    slow = tools(tmp_path, "gpu400", {"all_reduce_perf": standin.nccl(250.0)})  # -31% vs 360
    code, doc = qrun(cfg, url, "gpu400", slow, "--no-record", root=root)
    # Expected: fail (exit 3) against the node's own baseline (360, line 324).
    # Observed: exit 0, judged against the top-level A100 baseline (235).
    assert code == 3, (code, [(r["basis"], r["median"], r["status"]) for r in
                              doc.get("results", [])])
