"""One door to Slurm: `rsc_health.slurm.from_config(cfg)` builds every handle, so [slurm]
bin_dir and call_timeout_s hold for the node path, the operator's commands and the historian
alike (issue 21: three historian modules built their own sacct/sacctmgr runner)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "rsc_health"
HANDLES = {"CliSlurm", "Accounting"}


def test_only_the_slurm_package_builds_a_slurm_handle():
    built = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent == ROOT / "slurm":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in HANDLES:
                    built.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}(...)")
    assert built == [], "\n".join(built)


def test_the_historian_s_runner_has_the_node_path_s_bin_dir(tmp_path):
    from rsc_health.config import load_config
    from rsc_health.slurm import from_config

    config = tmp_path / "config.toml"
    config.write_text(f'[slurm]\nbin_dir = "{tmp_path}"\n')
    slurm = from_config(load_config(config))
    acct = slurm.accounting(30)
    assert slurm.bin_dir == acct.bin_dir == tmp_path and acct.timeout_s == 30
