"""collect.gpu._field_errors walks every NVML answer of every GPU at each job start. It no
longer makes a generator and a path for each leaf (about 190 answers a GPU); what it finds,
and in which order (the checker's findings follow it), is what the recursive generator found:
held here to that generator, on the healthy fixture's real answers and with errors planted at
every depth."""

from __future__ import annotations

import copy
import json

from rsc_health.collect import gpu
from tests.fixtures.nodes.node_copy import HEALTHY


def _reference(node, path=""):  # the walk as it was (a generator per node)
    if isinstance(node, dict):
        e = gpu.err(node)
        if e:
            if e not in gpu.ABSENT and path:
                yield path, e
            return
        for key, value in node.items():
            yield from _reference(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _reference(value, f"{path}[{i}]")


def _containers(node, out):
    """Every dict and list inside `node` (itself first)."""
    out.append(node)
    children = node.values() if isinstance(node, dict) else node
    for value in children:
        if isinstance(value, (dict, list)):
            _containers(value, out)
    return out


def test_the_errors_found_and_their_order_are_the_recursive_walks():
    devices = json.loads((HEALTHY / "rsc_health" / "nvml.json").read_text())["devices"]
    assert devices
    for dev in devices:
        assert gpu._field_errors(dev) == list(_reference(dev)) == []
    codes = ["NVML_ERROR_NO_PERMISSION", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_TIMEOUT", 18,
             None, ""]
    planted = copy.deepcopy(devices[0])
    spots = [c for c in _containers(planted, []) if isinstance(c, dict)][1:]
    assert len(spots) > 10
    for n, spot in enumerate(spots[::3]):  # every third table, at every depth
        spot["error"] = codes[n % len(codes)]
    found = gpu._field_errors(planted)
    assert found == list(_reference(planted))
    assert any("NO_PERMISSION" in e for _, e in found)
    assert any("NOT_A_CODE" in e for _, e in found)
    assert not any(e == "NVML_ERROR_NOT_SUPPORTED" for _, e in found)
    lists = [c for c in _containers(planted, []) if isinstance(c, list)]
    assert lists
    for lst in lists:
        lst.append({"error": "NVML_ERROR_UNKNOWN"})
    assert gpu._field_errors(planted) == list(_reference(planted))
    assert gpu._field_errors({"error": "NVML_ERROR_TIMEOUT"}) == []  # the top itself: no path
