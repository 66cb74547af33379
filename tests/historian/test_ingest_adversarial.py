"""sacct input as an adversary writes it: delimiters, newlines and bytes that are not UTF-8 in
job names, absurd numbers and hostlists, kilobyte-long fields, the JSON form, concurrent loads
and a database that goes away. One bad row never costs another job, and nothing raises past
SacctError's one line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text

from rsc_health.historian import schema
from rsc_health.historian.db import connect, table_counts
from rsc_health.historian.ingest import sacct, sacct_parse
from rsc_health.slurm.accounting import Accounting

FIELDS = list(sacct_parse.FIELDS)


def _row(job_id: str, name: str = "train", **over: str) -> dict[str, str]:
    row = {
        "JobIDRaw": job_id, "JobID": job_id, "JobName": name, "User": "alice",
        "Partition": "gpu", "State": "COMPLETED", "ExitCode": "0:0",
        "Submit": "2024-03-01T08:00:00", "Eligible": "2024-03-01T08:00:00",
        "Start": "2024-03-01T08:00:05", "End": "2024-03-01T09:00:05", "NNodes": "2",
        "NodeList": "gpu[001-002]", "AllocTRES": "cpu=8,gres/gpu=16,node=2",
    }
    row.update(over)
    return row


def _parsable(rows: list[dict[str, str]], delimiter: str = "|") -> str:
    lines = [delimiter.join(FIELDS)]
    lines += [delimiter.join(r[f] for f in FIELDS) for r in rows]
    return "\n".join(lines) + "\n"


def _names(engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(schema.jobs.c.job_id, schema.jobs.c.name)).all())


WEIRD_NAMES = {
    "1": "sweep|lr=3e-4",
    "2": "two\nlines",
    "3": "a|b\nc|d\n\ne",
    "4": "fake ExcNodeList=node0[1-6] Requeue=0",
    "5": "x" * 10_000,
    "6": 'quoted "name", with, commas',
}


@pytest.mark.parametrize("delimiter", ["|", "\x1f"])
def test_names_with_the_delimiter_newlines_and_10kb_land_whole(historian, delimiter):
    rows = [_row(job_id, name) for job_id, name in WEIRD_NAMES.items()]
    rows.append(_row("7", "plain"))
    report = sacct.ingest_text(historian, _parsable(rows, delimiter))
    assert report.bad == []
    assert _names(historian) == {**WEIRD_NAMES, "7": "plain"}
    with historian.connect() as conn:
        nodes = conn.execute(select(schema.job_nodes.c.node).distinct()).scalars().all()
    assert sorted(nodes) == ["gpu001", "gpu002"]


def test_a_nul_byte_in_a_name_never_stops_the_load(historian, tmp_path):
    """PostgreSQL text cannot hold NUL: it becomes a replacement character (counted), on both
    databases alike, and the other jobs land."""
    path = tmp_path / "sacct.txt"
    body = _parsable([_row("1", "a@b"), _row("2", "plain")]).encode().replace(b"@", b"\x00")
    path.write_bytes(body)
    report = sacct.ingest_text(historian, path)
    assert report.bad == [] and report.replaced == 1
    assert _names(historian) == {"1": "a\ufffdb", "2": "plain"}


def test_latin1_bytes_become_replacement_characters_and_are_counted(historian, tmp_path):
    path = tmp_path / "sacct.txt"
    body = _parsable([_row("1", "caf@"), _row("2", "plain")]).encode().replace(b"@", b"\xe9")
    path.write_bytes(body)
    report = sacct.ingest_text(historian, path)
    assert (report.bad, report.replaced) == ([], 1)
    assert "1 undecodable bytes replaced" in report.summary()
    assert _names(historian) == {"1": "caf\ufffd", "2": "plain"}
    # the same bytes on stdin (a text stream whose buffer holds them)
    stdin = io.TextIOWrapper(io.BytesIO(body.replace(b"1|1|", b"8|8|")), encoding="utf-8")
    assert sacct.ingest_text(historian, stdin).replaced == 1


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("AllocTRES", "gres/gpu=10000000000000000000000", "AllocTRES GPU count"),
        ("AllocTRES", "gres/gpu:a100=4294967296,gres/gpu:h100=1", "AllocTRES GPU count"),
        ("NodeList", "n[1-100000000]", "more than"),
        ("NodeList", "r[1-10000]n[1-10000]", "more than"),
        ("NodeList", "n[1-2" + "]" * 3, "not a hostlist"),
        ("NodeList", "h" * 200, "longer than 128"),
        # One host by count, 3,000 brackets deep: it took the whole load down (RecursionError).
        ("NodeList", "n" + "[1]" * 3000, "longer than 128"),
        ("NNodes", "1e30", "NNodes"),
        ("NNodes", "-4", "NNodes"),
        ("JobIDRaw", "9" * 40, "JobIDRaw is longer than 32"),
        ("User", "u" * 65, "User is longer"),
        ("Submit", "99999-01-01T00:00:00", "Submit is not a time"),
    ],
)
def test_an_absurd_value_costs_only_its_row(historian, field, value, why):
    rows = [_row("1"), _row("2", **{field: value}), _row("3")]
    started = time.monotonic()
    report = sacct.ingest_text(historian, _parsable(rows))
    assert time.monotonic() - started < 10  # nothing was expanded
    assert [b.line for b in report.bad] == [3]
    assert why in report.bad[0].message
    assert len(report.bad[0].message) < 300
    assert set(_names(historian)) == {"1", "3"}


def test_a_row_that_cannot_be_put_back_is_reported_and_the_rest_lands(historian):
    text = _parsable([_row("1"), _row("2")]).splitlines()
    text.insert(2, "garbage|with|too|few|fields")
    text.insert(3, "")
    report = sacct.ingest_text(historian, "\n".join(text) + "\n")
    assert [b.line for b in report.bad] == [3]
    assert "lines 3-4 joined" in report.bad[0].message
    assert set(_names(historian)) == {"1", "2"}


def _json_job(job_id: int, name: str, **over) -> dict:
    job = {
        "job_id": job_id, "name": name, "user": "bob", "partition": "gpu",
        "cluster": "alpha", "allocation_nodes": 2, "nodes": "gpu[003-004]",
        "state": {"current": "FAILED", "reason": "None"},
        "exit_code": {"status": "FAILED", "return_code": 3},
        "array": {"job_id": 0, "task_id": None}, "het": {"job_id": 0, "job_offset": None},
        "time": {"submission": 1709280000, "eligible": 1709280000, "start": 1709280005,
                 "end": 1709283605},
        "tres": {"allocated": [{"type": "cpu", "name": None, "count": 8},
                               {"type": "gres", "name": "gpu", "count": 16}]},
        "steps": [{"step": {"name": "batch"}}],
    }
    job.update(over)
    return job


def test_a_nul_in_sacct_json_never_stops_the_load(historian):
    doc = {"meta": {}, "errors": [], "jobs": [_json_job(21, "a\x00b"), _json_job(22, "ok")]}
    report = sacct.ingest_text(historian, json.dumps(doc).encode())  # "\u0000" on the wire
    assert report.bad == [] and report.replaced == 1
    assert _names(historian) == {"21": "a\ufffdb", "22": "ok"}


def test_an_escaped_lone_surrogate_in_sacct_json_lands_as_a_replacement(historian):
    doc = {"meta": {}, "errors": [],
           "jobs": [_json_job(31, "caf\udce9"), _json_job(32, "emoji \U0001F600")]}
    report = sacct.ingest_text(historian, json.dumps(doc).encode())  # "\udce9", "\ud83d\ude00"
    assert report.bad == []
    assert _names(historian) == {"31": "caf\ufffd", "32": "emoji \U0001F600"}


def test_sacct_json_lands_with_the_same_columns(historian):
    doc = {"meta": {}, "errors": [], "jobs": [
        _json_job(11, "sweep|lr=3e-4\nsecond line"),
        _json_job(12, "array task", array={"job_id": 10, "task_id": 7}),
        _json_job(13, "running", time={"submission": 1709280000, "eligible": 1709280000,
                                       "start": 1709280005, "end": 0},
                  state={"current": "RUNNING"}),
        _json_job(14, "absurd", tres={"allocated": [{"type": "gres", "name": "gpu",
                                                      "count": 10**22}]}),
        {"job_id": "not a number"},
    ]}
    raw = json.dumps(doc).encode().replace(b"array task", b"arr\xffy task")
    report = sacct.ingest_text(historian, raw)
    assert [b.line for b in report.bad] == [4, 5]
    assert report.replaced == 1
    with historian.connect() as conn:
        jobs = {r.job_id: r for r in conn.execute(select(schema.jobs))}
    assert set(jobs) == {"11", "12", "13"}
    first = jobs["11"]
    assert first.name == "sweep|lr=3e-4\nsecond line"
    assert (first.state, first.exit_code, first.gpus, first.nnodes) == ("FAILED", "3:0", 16, 2)
    assert first.instance_key == "11:2024-03-01T08:00:00:2024-03-01T08:00:05"
    assert jobs["12"].job_id_display == "10_7" and jobs["12"].name == "arr\ufffdy task"
    assert jobs["13"].end is None


def test_sacct_json_of_23_02_and_later_keeps_the_signal_that_ended_a_job(historian):
    """23.02 and later (data_parser v0.0.39 on, 24.05 alike) write a job's signal as
    {"id": {"set": true, "number": 9}, "name": "KILL"}, where 22.05 wrote "signal_id": only
    the older key was read, so a `--file` import of a newer release's JSON stored 0:0 for
    a job a SIGSEGV or SIGKILL ended, and triage could not tell a crash from a node."""
    def newer(job_id: int, signal: int | None) -> dict:
        return _json_job(job_id, f"killed by {signal}", state={"current": ["FAILED"]},
                         exit_code={"status": ["SIGNALED"] if signal else ["FAILED"],
                                    "return_code": {"set": True, "infinite": False,
                                                    "number": 0 if signal else 2},
                                    "signal": {"id": {"set": bool(signal), "infinite": False,
                                                      "number": signal or 0},
                                               "name": "SEGV" if signal == 11 else ""}})
    older = _json_job(44, "22.05", exit_code={"status": "SIGNALED", "return_code": 0,
                                              "signal": {"signal_id": 9, "name": "KILL"}})
    doc = {"meta": {}, "errors": [], "jobs": [newer(41, 11), newer(42, 9), newer(43, None),
                                              older]}
    report = sacct.ingest_text(historian, json.dumps(doc).encode())
    assert report.bad == [] and report.written == 4
    with historian.connect() as conn:
        codes = dict(conn.execute(select(schema.jobs.c.job_id, schema.jobs.c.exit_code)).all())
    assert codes == {"41": "0:11", "42": "0:9", "43": "2:0", "44": "0:9"}


def test_a_requeued_instance_in_sacct_json_of_23_02_and_later_lands_requeued(historian):
    """slurmdbd stores a requeued instance's state as JOB_REQUEUE, a flag over the base state
    PENDING; 23.02 and later write it ["PENDING", "REQUEUED"] (base first, then flags), where
    --parsable2 and 22.05's JSON print REQUEUED. Read by its first word, the instance was
    skipped as not yet started (its failure in no attribution, r_f or goodput) and the
    RUNNING row read before stayed open."""
    def instance(state: list[str], start: int, end: int, nodes: str) -> dict:
        return _json_job(7, "pretrain", state={"current": state, "reason": "None"}, nodes=nodes,
                         time={"submission": 1709280000, "eligible": 1709280000,
                               "start": start, "end": end})
    running = {"jobs": [instance(["RUNNING"], 1709280005, 0, "gpu[001-002]")]}
    sacct.ingest_text(historian, json.dumps(running).encode())
    requeued = {"jobs": [instance(["PENDING", "REQUEUED"], 1709280005, 1709283605, "gpu[001-002]"),
                         instance(["RUNNING"], 1709283700, 0, "gpu[003-004]")]}
    report = sacct.ingest_text(historian, json.dumps(requeued).encode())
    assert report.written == 2, report.summary()
    J = schema.jobs
    with historian.connect() as conn:
        rows = conn.execute(select(J.c.state, J.c.start, J.c.end).order_by(J.c.start)).all()
    assert [tuple(r) for r in rows] == [
        ("REQUEUED", datetime(2024, 3, 1, 8, 0, 5), datetime(2024, 3, 1, 9, 0, 5)),
        ("RUNNING", datetime(2024, 3, 1, 9, 1, 40), None),
    ]


@pytest.mark.parametrize("flags, shown", [
    (["PENDING", "REQUEUED"], "REQUEUED"),
    (["FAILED", "REQUEUED"], "REQUEUED"),  # the flag wins over any base state
    (["RUNNING", "COMPLETING", "REQUEUED"], "COMPLETING"),  # job_state_string's order
    (["CANCELLED", "LAUNCH_FAILED"], "CANCELLED"),  # a flag sacct's text never names
    (["TIMEOUT"], "TIMEOUT"),
])
def test_a_json_state_with_flags_reads_as_sacct_text_prints_it(flags, shown):
    assert sacct_parse._json_row(_json_job(8, "x", state={"current": flags}))["State"] == shown


def test_three_loads_into_one_sqlite_file_at_once_all_land(tmp_path):
    """Three `ingest sacct` processes on one SQLite file: each waits for the write lock (busy
    timeout) instead of failing with "database is locked". (Separate processes, as the CLI
    runs them: in one process the first-load ADBC path beside a sqlite3 load is the two-library
    hazard sqlite_bulk describes.)"""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    connect(url, create_missing=True).dispose()
    bodies = [
        _parsable([_row(str(i), NodeList=f"gpu{i % 50:03d}", NNodes="1")
                   for i in range(1, 3001)]),
        _parsable([_row(str(i)) for i in range(5001, 5011)]),
        _parsable([_row(str(i), NodeList=f"gpu{i % 50:03d}", NNodes="1")
                   for i in range(1, 3001)]),
    ]
    procs = []
    for k, body in enumerate(bodies):
        path = tmp_path / f"sacct{k}.txt"
        path.write_text(body)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "rsc_health.cli", "--db", url, "ingest", "sacct",
             "--file", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        ))
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    assert table_counts(connect(url, create_missing=True))["jobs"] == 3010


@pytest.mark.postgres
def test_a_statement_past_its_timeout_ends_the_load_in_one_line(pg_url):
    engine = connect(pg_url, create_missing=True)
    with pytest.raises(sacct.SacctError) as caught:
        sacct.ingest_text(engine, _parsable([_row(str(i)) for i in range(1, 200)]),
                          statement_timeout_s=0.000001)
    # PostgreSQL says "canceling statement due to statement timeout" (or, when the cancel it
    # sends itself wins the race under load, "... due to user request"): one line either way.
    message = str(caught.value)
    assert "\n" not in message and ("timeout" in message or "canceling statement" in message)
    assert table_counts(engine)["jobs"] == 0


class _KillsTheServerMidway(io.RawIOBase):
    """sacct text that, half way through, has every other connection to its database ended
    (what a PostgreSQL restart does to the load)."""

    def __init__(self, body: bytes, admin_url: str, database: str):
        self.body, self.pos = body, 0
        self.admin_url, self.database = admin_url, database

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.pos and self.pos >= len(self.body) // 2 and self.admin_url:
            admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": self.database})
            admin.dispose()
            self.admin_url = ""
        n = min(len(buffer), 4096, len(self.body) - self.pos)
        buffer[:n] = self.body[self.pos : self.pos + n]
        self.pos += n
        return n


@pytest.mark.postgres
def test_postgresql_going_away_mid_load_is_one_line(pg_url, monkeypatch):
    from tests.historian.conftest import PG_ADMIN_URL

    monkeypatch.setattr(sacct_parse, "BLOCK_BYTES", 4096)
    engine = connect(pg_url, create_missing=True)
    body = _parsable([_row(str(i)) for i in range(1, 400)]).encode()
    source = io.BufferedReader(
        _KillsTheServerMidway(body, PG_ADMIN_URL, engine.url.database)
    )
    with pytest.raises(sacct.SacctError) as caught:
        sacct.ingest_text(engine, source)
    assert "\n" not in str(caught.value)
    assert "nothing of it was kept" in str(caught.value)
    engine.dispose()
    assert table_counts(connect(pg_url, create_missing=True))["jobs"] == 0


def test_the_sacct_argv_of_the_parsable_form_cannot_be_shifted():
    argv = sacct.sacct_argv("2024-01-01T00:00:00", "2024-01-02T00:00:00")
    assert "--delimiter=\x1f" in argv and "--parsable2" in argv
    assert Path(argv[0]).name == "sacct"


def test_json_exit_codes_come_from_the_side_query_when_given(historian):
    """22.05's --json says return code 0 for a job that exited 3; the side query of columns
    without user text (JobIDRaw, Submit, Start, ExitCode) wins."""
    job = _json_job(21, "lost exit", exit_code={"status": "SUCCESS", "return_code": 0})
    side = (b"JobIDRaw\x1fSubmit\x1fStart\x1fExitCode\n"
            b"21\x1f2024-03-01T08:00:00\x1f2024-03-01T08:00:05\x1f3:0\n")
    codes = sacct_parse.exit_codes(side)
    sacct.ingest_text(historian, json.dumps({"jobs": [job]}).encode(), exit_codes=codes)
    with historian.connect() as conn:
        assert conn.execute(select(schema.jobs.c.exit_code)).scalar() == "3:0"


def test_an_event_reason_with_the_delimiter_and_latin1_bytes_lands(historian, tmp_path):
    from rsc_health.historian.ingest import events

    path = tmp_path / "events.txt"
    path.write_bytes(
        b"NodeName|TimeStart|TimeEnd|State|Reason|User\n"
        b"gpu001|2024-03-01T08:00:00|Unknown|DRAIN|bob: PSU|RMA 12 caf\xe9|root(0)\n"
        b"gpu002|2024-03-01T08:00:00|2024-03-01T09:00:00|DOWN|Not responding|slurm(64030)\n"
    )
    report = events.ingest_file(historian, path)
    assert report.bad == [] and report.written == 2
    with historian.connect() as conn:
        reasons = dict(conn.execute(select(schema.node_events.c.node,
                                           schema.node_events.c.reason)).all())
    assert reasons["gpu001"] == "bob: PSU|RMA 12 caf\ufffd"


def test_an_unknown_sacct_format_is_one_line():
    with pytest.raises(sacct.SacctError, match="sacct_format"):
        sacct.run_sacct("2024-01-01", "2024-01-02", Accounting(timeout_s=5), form="xml")


def test_an_absurd_event_row_costs_only_itself(historian):
    from rsc_health.historian.ingest import events

    text = ("NodeName|TimeStart|TimeEnd|State|Reason\n"
            f"{'n' * 300}|2024-03-01T08:00:00|Unknown|DRAIN|x\n"
            "gpu001|2024-03-01T08:00:00|Unknown|" + "S" * 40 + "|x\n"
            "gpu002|2024-03-01T08:00:00|99999-01-01T00:00:00|DOWN|x\n"
            "gpu003|2024-03-01T08:00:00|Unknown|DRAIN|" + "r" * 10_000 + "\n")
    report = events.ingest_text(historian, text)
    assert [b.line for b in report.bad] == [2, 3, 4]
    assert report.written == 1


@pytest.mark.postgres
def test_events_into_a_database_that_went_away_is_one_line(pg_url):
    from rsc_health.historian.ingest import events
    from tests.historian.conftest import PG_ADMIN_URL

    engine = connect(pg_url, create_missing=True)
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with engine.connect():  # a pooled connection, then the server drops it
        pass
    with admin.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = :db AND pid <> pg_backend_pid()"),
                     {"db": engine.url.database})
    admin.dispose()
    engine.pool.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{engine.url.database}" ALLOW_CONNECTIONS false'))
    try:
        with pytest.raises(events.EventsError) as caught:
            events.ingest_text(engine, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                                       "gpu001|2024-03-01T08:00:00|Unknown|DRAIN|x\n")
        assert "\n" not in str(caught.value)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{engine.url.database}" ALLOW_CONNECTIONS true'))
        admin.dispose()


def test_step_rows_and_extra_columns_of_real_sacct_output_are_not_jobs(historian):
    """`sacct` without -X prints each job's steps under it; and a site may ask for more
    columns: the steps are skipped, the other columns ignored, the jobs land."""
    fields = [*FIELDS, "Comment", "WorkDir"]
    rows = []
    for job_id in ("1", "2"):
        job = _row(job_id)
        for suffix in ("", ".batch", ".extern", ".0"):
            row = {**job, "JobIDRaw": job_id + suffix, "JobID": job_id + suffix}
            rows.append("|".join([*(row[f] for f in FIELDS), "a comment", "/home/x"]))
    report = sacct.ingest_text(historian, "|".join(fields) + "\n" + "\n".join(rows) + "\n")
    assert report.bad == [] and report.skipped == 6
    assert set(_names(historian)) == {"1", "2"}


def test_an_older_export_read_after_an_event_closed_does_not_reopen_it(historian):
    """An incremental run stored gpu042's DOWN period closed; a backfill of an export made
    while it was still open (End Unknown) wrote NULL over the stored end: the node was out of
    service again, for ever, in every report, metric and lemon feature after it."""
    from sqlalchemy import select

    from rsc_health.historian import schema
    from rsc_health.historian.ingest import events

    head = "NodeName|TimeStart|TimeEnd|State|Reason\n"
    events.ingest_text(historian, head + "gpu042|2026-11-20T10:00:00|2026-11-20T14:00:00|DOWN|"
                                         "Not responding\n")
    events.ingest_text(historian, head + "gpu042|2026-11-20T10:00:00|Unknown|DOWN|"
                                         "Not responding\n")
    with historian.connect() as conn:
        [end] = conn.execute(select(schema.node_events.c.end)).scalars().all()
    assert end is not None and end.hour == 14
