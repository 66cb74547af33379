"""D5: a node whose GPUs do not all report the same model name (an RMA part of another SKU)
gets gpu_model "" from commands/qualify._identity ("peers cannot be chosen", its own comment),
and the run goes on: no peer shares the "" group, so every metric is judged against the
model-agnostic imported baseline (10% margin) instead of its real peers (max 5%), and no
metric is owed (store.expected finds no group). A node 7% under its peers FAILS with the
consistent name and PASSES with one odd GPU name."""
from __future__ import annotations

import json

from rsc_health.sim import qualify_tools as standin  # noqa: E402
from tests.fixtures.nodes.node_copy import HEALTHY, copy_node  # noqa: E402
from tests.unit.qualify_bad_node.qhelp import NCCL, db, qrun, tier, tools  # noqa: E402

TIER = tier(NCCL, "@BASE@")


def test_a_gpu_of_another_name_moves_the_node_from_its_peers_to_the_baseline(tmp_path):
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps({"nccl-bw/allreduce_8589934592_busbw": 231.0}))
    base.chmod(0o644)
    cfg = tmp_path / "config.toml"
    cfg.write_text((HEALTHY / "config.toml").read_text() + TIER.replace("@BASE@", str(base)))
    url = db(tmp_path)
    root = copy_node(tmp_path / "root")
    odd = copy_node(tmp_path / "root-odd")
    p = odd / "rsc_health" / "nvml.json"
    doc = json.loads(p.read_text())
    doc["devices"][5]["name"] = "NVIDIA H100 80GB HBM3e"   # one replaced GPU, another SKU
    p.write_text(json.dumps(doc))
    # Peers: model and driver read from NVML (no --gpu-model/--driver, as the flow's job runs).
    spread = [231.0, 230.2, 231.6, 229.9, 230.8, 231.3]
    for i, b in enumerate(spread):
        bd = tools(tmp_path, f"gpu{i:03d}", {"all_reduce_perf": standin.nccl(b)})
        qrun(cfg, url, f"gpu{i:03d}", bd, root=root, model=None, driver=None)
    slow = tools(tmp_path, "gpu500", {"all_reduce_perf": standin.nccl(231.0 * 0.93)})
    # Control: the same node, every GPU named alike: 7% under 6 peers fails (exit 3).
    code, doc = qrun(cfg, url, "gpu500", slow, "--no-record", root=root, model=None,
                     driver=None)
    assert code == 3 and doc["results"][0]["basis"] == "peers", doc
    # One GPU named otherwise: gpu_model "" -> judged by the baseline alone.
    code, doc = qrun(cfg, url, "gpu500", slow, "--no-record", root=odd, model=None, driver=None)
    # Expected: never a pass (inconclusive: peers cannot be chosen). Observed: exit 0, pass,
    # basis "baseline", gpu_model "".
    assert code != 0, (code, doc.get("verdict"), doc.get("gpu_model"),
                       [(r["basis"], r["status"], r["reason"]) for r in doc.get("results", [])])
