"""`--file -` reads standard input for every ingest, through a real pipe: `ticket import` and
`ingest exclusions` opened a file named '-' instead (and said it did not exist)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select

from rsc_health.historian import schema
from rsc_health.historian.db import connect

REPO = Path(__file__).parents[2]

TICKETS = ("node,opened,closed,reason\n"
           "gpu001,2024-03-01T10:00:00,2024-03-02T09:00:00,\"HBM, replaced\"\n"
           "gpu002,2024-03-03T11:00:00,,fan \xe9clat\u00e9\n")
EXCLUSIONS = "".join(json.dumps({"job_id": str(j), "node": f"gpu{j:03d}",
                                 "time": "2024-03-01T10:00:00Z"}) + "\n" for j in range(3))


def _piped(url: str, text: bytes, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsc_health.cli", "--db", url, *args],
                          input=text, capture_output=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("command, text, table, rows", [
    (("ticket", "import"), TICKETS.encode(), schema.tickets, 2),
    (("ingest", "exclusions"), EXCLUSIONS.encode(), schema.job_exclusions, 3),
    # Bytes that are not UTF-8 are replaced, as the other stdin ingests do.
    (("ticket", "import"), TICKETS.encode("latin-1"), schema.tickets, 2),
    # Excel's "CSV UTF-8": a byte-order mark and CRLF (the header's first name was
    # "\ufeffnode": "CSV lacks column(s) node", every export refused)
    (("ticket", "import"), b"\xef\xbb\xbf" + TICKETS.replace("\n", "\r\n").encode(),
     schema.tickets, 2),
])
def test_file_dash_reads_a_pipe(tmp_path, command, text, table, rows):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    proc = _piped(url, text, *command, "--file", "-", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["read"], report["written"], report["bad"]) == (rows, rows, [])
    engine = connect(url, create_missing=True)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(table)).scalar() == rows
        if table is schema.tickets:
            reasons = conn.execute(select(table.c.reason).order_by(table.c.node)).scalars()
            assert list(reasons)[0] == "HBM, replaced"
    engine.dispose()
