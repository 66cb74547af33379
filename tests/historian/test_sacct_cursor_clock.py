"""The incremental sacct window starts from what the accounting says, not from the local clock.

The next window used to start `overlap_s` before the local clock's "now". A clock that jumped
forward by more than the overlap for one run (a bad NTP step, a VM restored from a snapshot)
put the cursor in the future; once the clock was right again, the jobs that ended in between
were never read with their final state and stayed RUNNING in the historian for ever.

slurmdbd is played by a `sacct` on PATH that answers `-S/-E` windows from a list of jobs as
of a "real" time the test sets, the way slurmdbd does (every job in any state during the
window, in its state as of now); the parsing and the load are the real ones.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from datetime import datetime, timedelta

from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.ingest import sacct
from rsc_health.slurm.accounting import Accounting

R0 = datetime(2024, 3, 1, 12, 0, 0)
_FMT = "%Y-%m-%dT%H:%M:%S"

FAKE_SACCT = r'''#!PYTHON
import json, os, sys
from datetime import datetime
fmt = "%Y-%m-%dT%H:%M:%S"
args = sys.argv[1:]
if "--json" in args:
    sys.exit("sacct: error: --json is not supported by this test's slurmdbd")
start = datetime.strptime(args[args.index("-S") + 1], fmt)
end = datetime.strptime(args[args.index("-E") + 1], fmt)
fields = next(a for a in args if a.startswith("--format=")).split("=", 1)[1].split(",")
with open(os.environ["FAKE_SLURMDBD"]) as fh:
    world = json.load(fh)
now = datetime.strptime(world["now"], fmt)
with open(os.environ["FAKE_SLURMDBD"] + ".log", "a") as fh:
    fh.write(f"{start:{fmt}} {end:{fmt}}\n")
if start > end:
    sys.exit(f"sacct: error: start time ({start}) requested is after end time ({end})")
print("\x1f".join(fields))
for job in world["jobs"]:
    submit, began, ended = (datetime.strptime(job[k], fmt) if job.get(k) else None
                            for k in ("submit", "start", "end"))
    if submit > now:
        continue
    began = began if began and began <= now else None
    ended = ended if ended and ended <= now else None
    if submit > end or (ended is not None and ended < start):
        continue
    state = job["state"] if ended else ("RUNNING" if began else "PENDING")
    row = {"JobIDRaw": job["id"], "JobID": job["id"], "JobName": "train", "User": "alice",
           "Partition": "gpu", "State": state, "ExitCode": "0:0",
           "Submit": job["submit"], "Eligible": job["submit"],
           "Start": f"{began:{fmt}}" if began else "Unknown",
           "End": f"{ended:{fmt}}" if ended else "Unknown", "NNodes": "1",
           "NodeList": job["node"], "AllocTRES": "cpu=96,gres/gpu=8,node=1", "Cluster": "c1"}
    print("\x1f".join(row[f] for f in fields))
'''


def _job(job_id: str, node: str, submit: datetime, start: datetime, end: datetime) -> dict:
    return {"id": job_id, "node": node, "submit": f"{submit:{_FMT}}",
            "start": f"{start:{_FMT}}", "end": f"{end:{_FMT}}", "state": "COMPLETED"}


class _Clock:
    """The local clock of the host that runs `ingest sacct`, injected."""

    def __init__(self) -> None:
        self.now = R0

    def __call__(self) -> datetime:
        return self.now


def test_a_clock_that_jumped_forward_and_back_loses_no_job_end(historian, tmp_path,
                                                                monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sacct"
    fake.write_text(FAKE_SACCT.replace("PYTHON", sys.executable, 1))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    world_file = tmp_path / "slurmdbd.json"
    monkeypatch.setenv("FAKE_SLURMDBD", str(world_file))
    jobs = [
        # Still running at R0, ends half an hour later.
        _job("100", "gpu001", R0 - timedelta(hours=3), R0 - timedelta(hours=3),
             R0 + timedelta(minutes=30)),
        # Ended just before R0: the newest thing the accounting knows at R0.
        _job("101", "gpu002", R0 - timedelta(hours=2), R0 - timedelta(hours=2),
             R0 - timedelta(minutes=5)),
    ]
    clock = _Clock()
    monkeypatch.setattr(sacct, "_utcnow", clock)

    failed: list[str] = []

    def run_at(real: datetime, local: datetime, since: str | None = None) -> None:
        world_file.write_text(json.dumps({"now": f"{real:{_FMT}}", "jobs": jobs}))
        clock.now = local
        try:
            sacct.ingest_incremental(historian, since=since, form="parsable", overlap_s=3600,
                                     acct=Accounting(timeout_s=600))
        except sacct.SacctError as exc:  # the old cursor: a window that ends before it starts
            failed.append(str(exc))

    # At R0 the local clock is two hours fast (more than the one-hour overlap) ...
    run_at(R0, R0 + timedelta(hours=2), since=f"{R0 - timedelta(hours=4):{_FMT}}")
    # ... then it is stepped back, and the timer's next runs come.
    run_at(R0 + timedelta(minutes=45), R0 + timedelta(minutes=45))
    run_at(R0 + timedelta(minutes=90), R0 + timedelta(minutes=90))

    J = schema.jobs
    with historian.connect() as conn:
        states = dict(conn.execute(select(J.c.job_id, J.c.state)).all())
    windows = (tmp_path / "slurmdbd.json.log").read_text().split("\n")
    assert states == {"100": "COMPLETED", "101": "COMPLETED"}, (windows, failed)
    assert failed == []
    # The cursor follows the accounting: never after its newest start or end, less the overlap.
    assert sacct.get_cursor(historian) <= f"{R0 + timedelta(minutes=30 - 60):{_FMT}}"


def test_next_start_never_passes_the_accounting_nor_the_clock():
    hour = timedelta(hours=1)
    start = f"{R0 - 2 * hour:{_FMT}}"
    # The clock two hours fast: the accounting's newest time decides.
    assert sacct.next_start(start, R0 + 2 * hour, R0, 3600) == R0 - hour
    # The clock behind the accounting: the clock decides (the earlier, safe side).
    assert sacct.next_start(start, R0, R0 + hour, 3600) == R0 - hour
    # Nothing new started or ended since long-running jobs began: the window keeps its start.
    assert sacct.next_start(start, R0, R0 - 9 * hour, 3600) == R0 - 2 * hour
    # Nothing returned at all: the same start again.
    assert sacct.next_start(start, R0, None, 3600) == R0 - 2 * hour
    # A stored cursor in the future (written by the old rule): back to the clock's.
    assert sacct.next_start(f"{R0 + 5 * hour:{_FMT}}", R0, None, 3600) == R0 - hour
