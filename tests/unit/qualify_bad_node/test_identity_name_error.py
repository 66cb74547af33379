"""qualify run: one GPU whose nvmlDeviceGetName failed (NvmlBackend's call() gives
{"error": ...}) should be the new "identity" inconclusive ("NVML could not say"); instead
_identity builds a set of the names and crashes on the unhashable dict."""
from __future__ import annotations

import json

from rsc_health.sim import qualify_tools as standin
from tests.fixtures.nodes.node_copy import HEALTHY, copy_node
from tests.unit.qualify_bad_node.qhelp import NCCL, db, qrun, tier, tools

TIER = tier(NCCL)


def test_a_gpu_name_nvml_could_not_read_is_inconclusive_not_a_crash(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text((HEALTHY / "config.toml").read_text() + TIER)
    url = db(tmp_path)
    odd = copy_node(tmp_path / "root-odd")
    p = odd / "rsc_health" / "nvml.json"
    doc = json.loads(p.read_text())
    doc["devices"][5]["name"] = {"error": "NVML_ERROR_UNKNOWN"}
    p.write_text(json.dumps(doc))
    bd = tools(tmp_path, "gpu500", {"all_reduce_perf": standin.nccl(231.0)})
    code, out = qrun(cfg, url, "gpu500", bd, "--no-record", root=odd, model=None, driver=None)
    assert code == 4, (code, out)
    assert any(r.get("test") == "identity" for r in out.get("results", []) + out.get(
        "outcomes", [])) or "identity" in json.dumps(out), out
