"""Ingest: sacct, sacctmgr events, check results, tickets -- idempotent, with bad rows reported."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select

from rsc_health.historian import schema
from rsc_health.historian.db import table_counts
from rsc_health.historian.ingest import checks, events, exclusions, sacct, tickets

FIXTURES = Path(__file__).parent / "fixtures"
J = schema.jobs
SACCT = FIXTURES / "sacct_small.txt"


def _jobs(engine) -> dict[str, list]:
    with engine.connect() as conn:
        rows = conn.execute(select(J).order_by(J.c.job_id, J.c.start)).all()
    out: dict[str, list] = {}
    for row in rows:
        out.setdefault(row.job_id, []).append(row)
    return out


def _nodes(engine, job_pk: int) -> list[str]:
    with engine.connect() as conn:
        q = select(schema.job_nodes.c.node).where(schema.job_nodes.c.job_pk == job_pk)
        return sorted(conn.execute(q).scalars())


def test_sacct_rows_land_as_job_instances(historian):
    report = sacct.ingest_text(historian, SACCT, gpus_per_node=8)
    assert report.bad == []
    assert report.skipped == 1  # the PENDING job: not an instance until it starts
    jobs = _jobs(historian)
    assert "1014" not in jobs
    # requeued: two instances of one JobIDRaw, the first ended NODE_FAIL
    first, second = jobs["1003"]
    assert (first.state, second.state) == ("NODE_FAIL", "COMPLETED")
    assert first.end == datetime(2024, 3, 1, 11, 30)
    assert _nodes(historian, first.id) == ["gpu004", "gpu005", "gpu006", "gpu007"]
    assert first.gpus == 32 and first.nnodes == 4
    # "CANCELLED by 0" keeps only the state word
    assert jobs["1004"][0].state == "CANCELLED"
    # no gres/gpu in AllocTRES: nodes x gpus_per_node
    assert jobs["1004"][0].gpus == 8
    # typed GPU gres only
    assert jobs["1012"][0].gpus == 8
    # array task: JobIDRaw is the key, JobID the display form
    assert jobs["1012"][0].job_id_display == "1010_7"
    # still running: End Unknown -> NULL
    assert jobs["1013"][0].end is None
    # cancelled before it started: Start None -> NULL, no nodes
    cancelled = jobs["1015"][0]
    assert cancelled.start is None and _nodes(historian, cancelled.id) == []
    assert cancelled.instance_key == "1015:2024-03-01T09:00:00:"
    assert jobs["1001"][0].instance_key == "1001:2024-03-01T08:00:00:2024-03-01T08:00:05"


def test_reingesting_sacct_changes_nothing(historian):
    sacct.ingest_text(historian, SACCT)
    before = table_counts(historian)
    with historian.connect() as conn:
        rows_before = conn.execute(select(J).order_by(J.c.id)).all()
    sacct.ingest_text(historian, SACCT)
    assert table_counts(historian) == before
    with historian.connect() as conn:
        assert conn.execute(select(J).order_by(J.c.id)).all() == rows_before


def test_a_running_job_read_again_gets_its_end(historian):
    sacct.ingest_text(historian, SACCT)
    finished = SACCT.read_text().replace(
        "1013|1013|serve|frank|gpu|RUNNING|0:0|2024-03-01T13:00:00|2024-03-01T13:00:00|"
        "2024-03-01T13:00:02|Unknown|",
        "1013|1013|serve|frank|gpu|FAILED|1:0|2024-03-01T13:00:00|2024-03-01T13:00:00|"
        "2024-03-01T13:00:02|2024-03-01T15:00:00|",
    )
    sacct.ingest_text(historian, finished)
    (row,) = _jobs(historian)["1013"]
    assert (row.state, row.end, row.exit_code) == ("FAILED", datetime(2024, 3, 1, 15), "1:0")
    assert _nodes(historian, row.id) == ["gpu013"]


def test_an_export_from_while_a_job_ran_read_after_it_ended_does_not_bring_it_back(historian):
    """A backfill of last week's export after the incremental runs: its RUNNING row (End
    Unknown) of an instance stored FAILED wrote RUNNING, no end and exit 0:0 over it. The
    failed job vanished from r_f, the triage and the lemon features, and read as running."""
    finished = SACCT.read_text().replace(
        "1013|1013|serve|frank|gpu|RUNNING|0:0|2024-03-01T13:00:00|2024-03-01T13:00:00|"
        "2024-03-01T13:00:02|Unknown|",
        "1013|1013|serve|frank|gpu|FAILED|1:0|2024-03-01T13:00:00|2024-03-01T13:00:00|"
        "2024-03-01T13:00:02|2024-03-01T15:00:00|",
    )
    assert finished != SACCT.read_text()
    sacct.ingest_text(historian, finished)
    sacct.ingest_text(historian, SACCT)  # the older export, read later
    (row,) = _jobs(historian)["1013"]
    assert (row.state, row.end, row.exit_code) == ("FAILED", datetime(2024, 3, 1, 15), "1:0")


def test_an_instance_twice_in_one_file_lands_once_with_its_last_state(historian):
    """Two sacct outputs concatenated: the running row, then the same instance finished. The
    bulk paths (executemany on SQLite, COPY + INSERT ... SELECT on PostgreSQL) must both act
    like row-by-row upserts: one row, the later state, nodes written once."""
    lines = SACCT.read_text().splitlines()
    finished = [
        ln.replace("|RUNNING|0:0|", "|FAILED|1:0|").replace(
            "2024-03-01T13:00:02|Unknown|", "2024-03-01T13:00:02|2024-03-01T15:00:00|"
        )
        for ln in lines[1:]
        if ln.startswith("1013|")
    ]
    report = sacct.ingest_text(historian, "\n".join([*lines, *finished]) + "\n")
    assert report.bad == []
    (row,) = _jobs(historian)["1013"]
    assert (row.state, row.end, row.exit_code) == ("FAILED", datetime(2024, 3, 1, 15), "1:0")
    assert _nodes(historian, row.id) == ["gpu013"]
    first, second = _jobs(historian)["1003"]
    assert _nodes(historian, first.id) == ["gpu004", "gpu005", "gpu006", "gpu007"]
    assert _nodes(historian, second.id) == ["gpu008", "gpu009", "gpu010", "gpu011"]


def _booted(state: str, start: str, end: str, submit: str = "2024-03-01T08:00:00",
            nodes: str = "gpu[001-002]") -> str:
    """A row of job 501, whose nodes booted for it (power saving, --reboot)."""
    return (f"501|501|train|alice|gpu|{state}|0:0|{submit}|{submit}|{start}|{end}|2|{nodes}|"
            "cpu=8,gres/gpu=16,node=2")


def _sacct_text(*rows: str) -> str:
    return "\n".join([SACCT.read_text().splitlines()[0], *rows]) + "\n"


def test_an_instance_whose_start_slurm_reset_after_its_nodes_booted_is_not_left_running(
        historian):
    """A job whose nodes boot for it runs with Start at its allocation; once they are up
    slurmctld resets Start and slurmdbd rewrites the same record. The instance key
    (JobIDRaw:Submit:Start) changed with it, so the row read while the nodes booted stayed
    RUNNING for ever: its nodes "in a job" for the telemetry rollups and the fail-slow
    placements, and the re-read of open jobs never asked for it (its job id was in the
    window). The later row is the same instance: the open one it supersedes is dropped."""
    sacct.ingest_text(historian, _sacct_text(_booted("RUNNING", "2024-03-01T08:00:05", "Unknown")))
    report = sacct.ingest_text(historian, _sacct_text(
        _booted("COMPLETED", "2024-03-01T08:07:40", "2024-03-01T10:00:00")))
    (row,) = _jobs(historian)["501"]
    assert (row.state, row.start, row.end) == ("COMPLETED", datetime(2024, 3, 1, 8, 7, 40),
                                               datetime(2024, 3, 1, 10))
    assert report.noted == {sacct.SUPERSEDED: 1}
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.job_nodes)).scalar() == 2
    # an export from while the nodes booted, read after, brings nothing back
    sacct.ingest_text(historian, _sacct_text(_booted("RUNNING", "2024-03-01T08:00:05", "Unknown")))
    assert [r.start for r in _jobs(historian)["501"]] == [datetime(2024, 3, 1, 8, 7, 40)]


def test_both_reads_of_a_reset_start_in_one_first_load_land_as_one_instance(historian):
    """Two exports concatenated into a first backfill (SQLite's bulk path, PostgreSQL's COPY):
    the row from while the nodes booted is not left open beside the instance's own."""
    report = sacct.ingest_text(historian, _sacct_text(
        _booted("RUNNING", "2024-03-01T08:00:05", "Unknown"),
        _booted("RUNNING", "2024-03-01T08:07:40", "Unknown")))
    assert report.noted == {sacct.SUPERSEDED: 1}
    assert [(r.state, r.start) for r in _jobs(historian)["501"]] == [
        ("RUNNING", datetime(2024, 3, 1, 8, 7, 40))]


def test_a_requeued_instance_still_open_is_not_taken_for_a_reset_start(historian):
    """A requeued job's next instance has a Submit of its own (slurmctld stamps a new one):
    the earlier instance, open until a read gives it its end, is another instance, kept."""
    sacct.ingest_text(historian, _sacct_text(_booted("RUNNING", "2024-03-01T08:00:05", "Unknown")))
    sacct.ingest_text(historian, _sacct_text(
        _booted("RUNNING", "2024-03-01T09:10:00", "Unknown", submit="2024-03-01T09:05:00",
                nodes="gpu[003-004]")))
    assert [(r.start, r.end) for r in _jobs(historian)["501"]] == [
        (datetime(2024, 3, 1, 8, 0, 5), None), (datetime(2024, 3, 1, 9, 10), None)]


def test_sacct_columns_in_any_order(historian):
    lines = SACCT.read_text().splitlines()
    header = lines[0].split("|")
    order = list(reversed(range(len(header))))
    shuffled = ["|".join(line.split("|")[i] for i in order) for line in lines]
    sacct.ingest_text(historian, "\n".join(shuffled) + "\n")
    assert _jobs(historian)["1002"][0].state == "FAILED"
    assert sorted(_jobs(historian)) == sorted(_jobs_from_fixture())


def _jobs_from_fixture() -> set[str]:
    rows = SACCT.read_text().splitlines()[1:]
    return {r.split("|")[0] for r in rows if "|PENDING|" not in r}


def test_bad_sacct_rows_are_reported_by_line_and_the_rest_lands(historian):
    text = SACCT.read_text().splitlines()
    text.insert(3, "2001|2001|x|u|gpu|FAILED|1:0|2024-03-01T09:00:00|a|b|c|d|e|f|g|h")  # line 4
    text.insert(
        5, "2002|2002|x|u|gpu|FAILED|1:0|yesterday|2024-03-01T09:00:00|Unknown|Unknown|1|gpu001|"
    )  # line 6
    text.insert(
        7,
        "2003|2003|x|u|gpu|FAILED|1:0|2024-03-01T09:00:00|2024-03-01T09:00:00|"
        "2024-03-01T09:00:00|2024-03-01T09:10:00|x|gpu001|",
    )  # line 8
    text.insert(
        9,
        "2004|2004|x|u|gpu|FAILED|1:0|2024-03-01T09:00:00|2024-03-01T09:00:00|"
        "2024-03-01T09:00:00|2024-03-01T09:10:00|1|gpu[001|",
    )  # line 10
    report = sacct.ingest_text(historian, "\n".join(text) + "\n")
    assert [b.line for b in report.bad] == [4, 6, 8, 10]
    assert "Submit" in report.bad[1].message and "NNodes" in report.bad[2].message
    assert "hostlist" in report.bad[3].message
    jobs = _jobs(historian)
    assert not {"2001", "2002", "2003", "2004"} & set(jobs)
    assert set(jobs) == _jobs_from_fixture()


def test_events_from_sacctmgr_output(historian):
    report = events.ingest_file(historian, FIXTURES / "sacctmgr_events.txt")
    assert report.bad == [] and report.skipped == 1  # the cluster event has no node
    with historian.connect() as conn:
        rows = conn.execute(select(schema.node_events).order_by(schema.node_events.c.node)).all()
    assert [(r.node, r.state, r.end) for r in rows] == [
        ("gpu003", "DRAIN", None),
        ("gpu005", "DOWN", datetime(2024, 3, 1, 14)),
    ]
    # read again after the drain ended: same row, now closed
    closed = (
        (FIXTURES / "sacctmgr_events.txt")
        .read_text()
        .replace("2024-03-01T09:58:00|Unknown", "2024-03-01T09:58:00|2024-03-02T08:00:00")
    )
    events.ingest_text(historian, closed)
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.node_events)).scalar() == 2
        end = conn.execute(
            select(schema.node_events.c.end).where(schema.node_events.c.node == "gpu003")
        ).scalar()
    assert end == datetime(2024, 3, 2, 8)


def test_events_accept_the_requested_field_names(historian):
    text = "NodeName|Start|End|State|Reason|User\ngpu001|2024-03-01T01:00:00|Unknown|DOWN|x|root\n"
    assert events.ingest_text(historian, text).written == 1


def test_checks_jsonl_import_is_idempotent_and_reports_bad_lines(historian):
    report = checks.ingest_file(historian, FIXTURES / "checks.jsonl")
    assert [b.line for b in report.bad] == [4, 5, 6]
    assert report.written == 4
    checks.ingest_file(historian, FIXTURES / "checks.jsonl")
    with historian.connect() as conn:
        rows = conn.execute(
            select(schema.check_results).order_by(schema.check_results.c.time)
        ).all()
    assert len(rows) == 4
    xid = rows[0]
    assert (xid.node, xid.check, xid.severity, xid.code, xid.source) == (
        "gpu003",
        "xid",
        "drain_now",
        "xid79",
        "import",
    )
    assert xid.time == datetime(2024, 3, 1, 9, 55)
    assert xid.reason == "Xid 79: GPU has fallen off the bus"
    # a failing check from a tool that does not grade: counted as a drain request
    assert rows[-1].severity == "drain_after_job" and rows[-1].reason == "port down"


def test_tickets_open_close_list_and_csv_import(historian):
    tid = tickets.open_ticket(historian, "gpu007", "nvlink down", when=datetime(2024, 3, 5))
    assert [t.node for t in tickets.list_tickets(historian, open_only=True)] == ["gpu007"]
    tickets.close_ticket(historian, tid, when=datetime(2024, 3, 6))
    assert tickets.list_tickets(historian, open_only=True) == []
    report = tickets.import_csv(historian, FIXTURES / "tickets.csv")
    assert [b.line for b in report.bad] == [4, 5]
    tickets.import_csv(historian, FIXTURES / "tickets.csv")
    listed = tickets.list_tickets(historian)
    assert [(t.node, t.closed) for t in listed] == [
        ("gpu003", datetime(2024, 3, 4, 16)),
        ("gpu005", None),
        ("gpu007", datetime(2024, 3, 6)),
    ]


def test_an_export_read_again_never_reopens_a_ticket_closed_since(historian, historian_url,
                                                                  tmp_path):
    """Last night's export listed gpu005's ticket open (closed empty); the operator closed it
    this morning when the node came back; the timer read the same export again (or one made
    before the close): the empty `closed` overwrote the close and the ticket was open again,
    the node's repair counted open in the lemon history. An import keeps a close now, says
    so, and a later `closed` still replaces it; `healthctl ticket reopen` reopens."""
    from click.testing import CliRunner

    from rsc_health.cli import cli

    def run(*args):
        result = CliRunner().invoke(cli, ["--db", historian_url, *args])
        assert result.exit_code == 0, result.output
        return result.output

    tickets.import_csv(historian, FIXTURES / "tickets.csv")
    (gpu005,) = tickets.list_tickets(historian, open_only=True)
    tickets.close_ticket(historian, gpu005.id, when=datetime(2024, 3, 3, 9))
    out = run("ticket", "import", "--file", str(FIXTURES / "tickets.csv"))
    assert tickets.list_tickets(historian, open_only=True) == []
    assert "closed since, kept closed" in out
    assert tickets.list_tickets(historian, node="gpu005")[0].closed == datetime(2024, 3, 3, 9)
    # the ticket system's later export closes it at its own time: that one stands
    later = tmp_path / "later.csv"
    later.write_text("node,opened,closed,reason\n"
                     "gpu005,2024-03-01T12:00:00,2024-03-03T10:30:00,node unresponsive\n")
    tickets.import_csv(historian, later)
    assert tickets.list_tickets(historian, node="gpu005")[0].closed == datetime(2024, 3, 3,
                                                                                10, 30)
    # reopening is said in so many words, and an import leaves it open
    assert f"ticket {gpu005.id} for gpu005 reopened" in run("ticket", "reopen",
                                                            str(gpu005.id))
    tickets.import_csv(historian, FIXTURES / "tickets.csv")
    assert [t.node for t in tickets.list_tickets(historian, open_only=True)] == ["gpu005"]


def test_exclusions_jsonl(historian, tmp_path):
    path = tmp_path / "exclusions.jsonl"
    path.write_text(
        '{"job_id": "1003", "node": "gpu005", "time": "2024-03-01T11:35:00"}\n{"job_id": 1}\n'
    )
    report = exclusions.ingest_file(historian, path)
    assert report.written == 1 and [b.line for b in report.bad] == [2]


def _indexes_and_keys(engine) -> tuple[set, list]:
    from sqlalchemy import inspect

    with engine.connect() as conn:
        insp = inspect(conn)
        names = {ix["name"] for table in ("jobs", "job_nodes") for ix in insp.get_indexes(table)}
        fks = [
            (fk["name"], fk["constrained_columns"], fk["referred_table"], fk["options"])
            for fk in insp.get_foreign_keys("job_nodes")
        ]
        pk = insp.get_pk_constraint("job_nodes")["constrained_columns"]
    return names, fks, pk


def test_a_first_load_leaves_every_index_and_key_in_place(historian):
    import pytest
    from sqlalchemy.exc import IntegrityError

    before = _indexes_and_keys(historian)
    assert set(sacct.DEFERRABLE_INDEXES) <= before[0] and len(before[1]) == 1
    assert before[2] == ["job_pk", "node"]
    with pytest.raises(sacct.SacctError):  # a failed first load
        sacct.ingest_text(historian, "JobIDRaw|JobID\n1|1\n")
    assert _indexes_and_keys(historian) == before
    sacct.ingest_text(historian, SACCT)
    assert _indexes_and_keys(historian) == before
    with pytest.raises(IntegrityError), historian.begin() as conn:  # still enforced
        conn.execute(schema.job_nodes.insert().values(job_pk=999_999, node="gpu001"))
    with historian.connect() as conn:
        pk, node = conn.execute(select(schema.job_nodes)).first()
    with pytest.raises(IntegrityError), historian.begin() as conn:
        conn.execute(schema.job_nodes.insert().values(job_pk=pk, node=node))
