"""The node-side flush needs only the node-flush extra (SQLAlchemy + psycopg), and its memory
stays bounded whatever the spool's size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pandas', 'pyarrow', 'numpy', 'scipy', 'matplotlib', 'jinja2'):
            raise ImportError('not on a node: ' + name)
sys.meta_path.insert(0, Block())
from rsc_health.cli import main
import atexit
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            print(line.strip(), file=sys.stderr)
atexit.register(hwm)
sys.argv = ['healthctl'] + sys.argv[1:]
main()
"""


def _spool(path: Path, sweeps: int, nodes: int) -> int:
    t0 = datetime(2024, 3, 1, tzinfo=UTC)
    n = 0
    with (path / "pending.jsonl").open("w") as fh:
        for s in range(sweeps):
            t = (t0 + timedelta(minutes=5 * s)).isoformat()
            for i in range(nodes):
                for fam in ("gpu", "ecc", "infiniband", "mount"):
                    fh.write(json.dumps({"kind": "check", "id": f"{s}-{i}-{fam}", "time": t,
                                         "node": f"n{i}", "source": "sweep", "check": fam,
                                         "component": "*", "status": "ok",
                                         "severity": "none", "code": "", "reason": ""}) + "\n")
                    n += 1
    return n


def test_flush_runs_without_pandas_and_with_bounded_memory(tmp_path):
    sdir = tmp_path / "spool"
    sdir.mkdir()
    lines = _spool(sdir, sweeps=300, nodes=100)  # 120,000 lines, ~20 MB of JSON
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, "--db", f"sqlite:///{tmp_path / 'h.db'}", "spool",
         "flush", "--dir", str(sdir)],
        env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{lines} line(s)" in proc.stdout and "400 opened" in proc.stdout
    # Streaming: far below what 120,000 parsed records held at once would take (VmHWM is
    # the flush's own peak; a child's ru_maxrss would include the forked pytest's).
    hwm_kib = int(proc.stderr.strip().splitlines()[-1].split()[1])
    assert hwm_kib / 1024 < 150, hwm_kib
