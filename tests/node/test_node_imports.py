"""The node path (engine, `healthctl check`) must not import the historian's heavy libraries."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.nodes.node_copy import copy_node

HEAVY = ("pandas", "sqlalchemy", "matplotlib", "scipy")

PROBE = """
import sys
from click.testing import CliRunner
from rsc_health.cli import cli
result = CliRunner().invoke(cli, ["--root", sys.argv[1], "--config", sys.argv[2], "check"])
assert result.exit_code == 0, result.output
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("HEAVY:", ",".join(heavy))
"""


def test_healthctl_check_imports_no_pandas_sqlalchemy_or_matplotlib(tmp_path):
    root = tmp_path / "node"
    copy_node(root)
    code = PROBE.replace("{heavy!r}", repr(set(HEAVY)))
    out = subprocess.run([sys.executable, "-c", code, str(root), str(root / "config.toml")],
                         capture_output=True, text=True, check=True).stdout
    assert "HEAVY: \n" in out or out.strip().endswith("HEAVY:")
