"""A runaway job (slurmdbd lost its end: `sacctmgr show runawayjobs`) that an operator fixes.

`sacctmgr show runawayjobs` -> fix sets the job's end to GREATEST(start, eligible, submit)
and its state to COMPLETED (Slurm's as_mysql_fix_runaway_jobs.c): the end lands hours or
days in the past. The incremental ingest reads `-S cursor -E now` windows, so it never read
the fixed row again: the job stayed open (end NULL, RUNNING) in the historian for ever, and
every later telemetry sample of its nodes counted as inside it (day rollups left them out,
failslow kept comparing them with that job's peers).

Now each incremental run re-reads, by job id (`sacct -j`), the jobs the historian still has
open from before the window that the window did not return (a job still running is always
in it). slurmdbd is played by a `sacct` on PATH that answers -S/-E windows, and -j, from a
list of jobs the way slurmdbd does; the parsing and the load are the real ones."""

from __future__ import annotations

import json
import os
import stat
import sys
from datetime import datetime, timedelta

from sqlalchemy import select

from rsc_health.historian import schema
from rsc_health.historian.failslow.load import membership
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
ids = set(args[args.index("-j") + 1].split(",")) if "-j" in args else None
if ids is not None and os.environ.get("FAKE_REFUSE_J"):
    sys.exit("sacct: error: this slurmdbd refuses -j")
fields = next(a for a in args if a.startswith("--format=")).split("=", 1)[1].split(",")
with open(os.environ["FAKE_SLURMDBD"]) as fh:
    world = json.load(fh)
with open(os.environ["FAKE_SLURMDBD"] + ".log", "a") as fh:
    fh.write(" ".join(a for a in args if not a.startswith("--")) + "\n")
print("\x1f".join(fields))
for job in world["jobs"]:
    submit, began, ended = (datetime.strptime(job[k], fmt) if job.get(k) else None
                            for k in ("submit", "start", "end"))
    if ids is not None and job["id"] not in ids:
        continue
    if submit > end or (ended is not None and ended < start):
        continue
    state = job["state"] if ended else "RUNNING"
    row = {"JobIDRaw": job["id"], "JobID": job["id"], "JobName": "train", "User": "alice",
           "Partition": "gpu", "State": state, "ExitCode": "0:0",
           "Submit": job["submit"], "Eligible": job["submit"],
           "Start": f"{began:{fmt}}", "End": f"{ended:{fmt}}" if ended else "Unknown",
           "NNodes": "2", "NodeList": job["nodes"],
           "AllocTRES": "cpu=192,gres/gpu=16,node=2", "Cluster": "c1"}
    print("\x1f".join(row[f] for f in fields))
'''


def _job(job_id: str, nodes: str, start: datetime, end: datetime | None = None) -> dict:
    return {"id": job_id, "nodes": nodes, "submit": f"{start - timedelta(minutes=1):{_FMT}}",
            "start": f"{start:{_FMT}}", "end": f"{end:{_FMT}}" if end else "",
            "state": "COMPLETED"}


def test_a_runaway_job_slurm_fixed_is_closed_not_left_running_for_ever(historian, tmp_path,
                                                                       monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sacct"
    fake.write_text(FAKE_SACCT.replace("PYTHON", sys.executable, 1))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    world_file = tmp_path / "slurmdbd.json"
    monkeypatch.setenv("FAKE_SLURMDBD", str(world_file))
    log = tmp_path / "slurmdbd.json.log"
    runaway = _job("300", "gpu[001-002]", R0 - timedelta(days=3))  # slurmdbd lost its end
    running = _job("301", "gpu[003-004]", R0 - timedelta(days=2))  # really still running
    done = _job("302", "gpu[005-006]", R0 - timedelta(hours=5), R0 - timedelta(hours=4))
    jobs = [runaway, running, done]

    def run_at(now: datetime, since: str | None = None) -> list[str]:
        world_file.write_text(json.dumps({"jobs": jobs}))
        log.write_text("")
        monkeypatch.setattr(sacct, "_utcnow", lambda: now)
        sacct.ingest_incremental(historian, since=since, form="parsable", overlap_s=3600,
                                 acct=Accounting(timeout_s=600))
        return log.read_text().splitlines()

    def rows() -> dict:
        J = schema.jobs
        with historian.connect() as conn:
            return {j: (s, e) for j, s, e in conn.execute(select(J.c.job_id, J.c.state,
                                                                 J.c.end))}

    run_at(R0, since=f"{R0 - timedelta(days=4):{_FMT}}")
    assert rows() == {"300": ("RUNNING", None), "301": ("RUNNING", None),
                      "302": ("COMPLETED", R0 - timedelta(hours=4))}
    # An hour later nothing changed: both open jobs are in the window, no second sacct.
    assert len(run_at(R0 + timedelta(hours=1))) == 1
    # The operator runs `sacctmgr show runawayjobs` and fixes 300: end = its start.
    runaway["end"] = runaway["start"]
    calls = run_at(R0 + timedelta(hours=2))
    assert rows()["300"] == ("COMPLETED", R0 - timedelta(days=3)), calls
    assert rows()["301"] == ("RUNNING", None)
    # The window, then one re-read of the job it no longer returned, by id.
    assert len(calls) == 2 and calls[1].split()[-2:] == ["-j", "300"], calls
    # Its nodes are no longer in a job now (failslow's membership of the last hour).
    since = R0 + timedelta(hours=1)
    members = membership(historian, since, R0 + timedelta(hours=2))
    assert sorted(members["node"]) == ["gpu003", "gpu004"], members
    # And the next run has nothing left to re-read.
    assert len(run_at(R0 + timedelta(hours=3))) == 1


def test_a_re_read_by_id_that_fails_keeps_the_window_and_says_so(historian, tmp_path,
                                                                 monkeypatch):
    """sacct -j refused (an old slurmdbd, a timeout): the window's jobs and the cursor are
    kept, the run ends normally (the timer's next run tries again), and the report says
    which re-read failed and how many jobs stay open."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sacct"
    fake.write_text(FAKE_SACCT.replace("PYTHON", sys.executable, 1))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    world_file = tmp_path / "slurmdbd.json"
    monkeypatch.setenv("FAKE_SLURMDBD", str(world_file))
    monkeypatch.setenv("FAKE_REFUSE_J", "1")
    runaway = _job("300", "gpu[001-002]", R0 - timedelta(days=3))
    recent = _job("299", "gpu[005-006]", R0 - timedelta(hours=2), R0 - timedelta(minutes=30))
    world_file.write_text(json.dumps({"jobs": [runaway, recent]}))
    monkeypatch.setattr(sacct, "_utcnow", lambda: R0)
    sacct.ingest_incremental(historian, since=f"{R0 - timedelta(days=4):{_FMT}}",
                             form="parsable", acct=Accounting(timeout_s=600))
    runaway["end"] = runaway["start"]
    later = _job("301", "gpu[003-004]", R0 + timedelta(hours=1), R0 + timedelta(hours=2))
    world_file.write_text(json.dumps({"jobs": [runaway, recent, later]}))
    monkeypatch.setattr(sacct, "_utcnow", lambda: R0 + timedelta(hours=3))
    report = sacct.ingest_incremental(historian, form="parsable",
                                      acct=Accounting(timeout_s=600))
    J = schema.jobs
    with historian.connect() as conn:
        got = dict(conn.execute(select(J.c.job_id, J.c.state)).all())
    assert got == {"299": "COMPLETED", "300": "RUNNING", "301": "COMPLETED"}
    assert sacct.get_cursor(historian) > f"{R0:{_FMT}}"
    (cause, n), = [(c, n) for c, n in report.noted.items() if "refuses -j" in c]
    assert n == 1 and cause.startswith(sacct.REREAD_FAILED), report.noted
