"""Input at the historian's boundaries, on SQLite and PostgreSQL alike: node names longer than
the columns keep (VARCHAR(128)), NUL bytes (PostgreSQL text cannot hold them), a 10 MB line,
CRLF, Latin-1, empty and header-only files. One bad row is reported with its line and the rest
lands; never a traceback, never a whole load (or a node's whole spool) lost to one row.

PostgreSQL refused the whole transaction for one such value while SQLite stored it: a ticket
CSV, a checks or exclusions import lost every row, and one spool record with a NUL in a site
check's text (or a 200-character name) failed every later flush of its node for ever."""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from rsc_health import spool
from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.ingest import (
    MALFORMED_CSV,
    NOT_A_NAME,
    checks,
    events,
    exclusions,
    inventory,
    tickets,
)
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.model import Finding, Severity, Status

LONG = "n" * 200
TEN_MB = "z" * (10 * 1024 * 1024)


def _count(engine, table, **where) -> int:
    q = select(func.count()).select_from(table)
    for col, value in where.items():
        q = q.where(table.c[col] == value)
    with engine.connect() as conn:
        return conn.execute(q).scalar()


# -- the node spool ---------------------------------------------------------------------------


def _recent() -> datetime:
    return datetime.now(UTC) - timedelta(minutes=5)


def _good(t: datetime) -> list[dict]:
    return spool.check_records([Finding("ecc", "gpu0", Status.OK, Severity.NONE, "clean")],
                               node="good", source="sweep", time=t, job_id=None)


@pytest.mark.parametrize("bad", [
    pytest.param(lambda t: spool.check_records(
        [Finding("gpu", "gpu0", Status.FAIL, Severity.DRAIN_NOW, "x")], node=LONG,
        source="sweep", time=t, job_id=None), id="node-200-chars"),
    pytest.param(lambda t: [spool.record("job_start", "n1", t, job_id="1",
                                         excluded=["gpu1", LONG])], id="excluded-200-chars"),
    pytest.param(lambda t: [spool.record("job_start", "n1", t, job_id="9" * 40,
                                         excluded=["gpu1"])], id="job-id-40-chars"),
    pytest.param(lambda t: [spool.record("action", "n1", t, action="drain_now", reason="r",
                                         job_id="9" * 40)], id="action-job-id-40-chars"),
])
def test_a_spool_record_too_long_for_a_column_is_quarantined_not_retried_for_ever(
        historian, tmp_path, bad):
    t = _recent()
    spool.append(tmp_path, bad(t) + _good(t))
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == len(bad(t))
    assert "longer than" in report.quarantined[0][1].message
    assert not list(tmp_path.glob("batch-*"))  # the batch is done, the node's flush goes on
    assert _count(historian, schema.check_results, node="good") == 1


def test_a_nul_in_a_spool_record_becomes_a_replacement_character(historian, tmp_path):
    """A site check's text with a NUL byte reaches the spool as \\u0000."""
    t = _recent()
    records = spool.check_records(
        [Finding("site", "probe", Status.FAIL, Severity.DRAIN_AFTER_JOB, "bad\x00output")],
        node="n1", source="sweep", time=t, job_id=None)
    records.append(spool.record("heartbeat", "n1", t, source="sweep", level="ok",
                                version="1.0\x00"))
    spool.append(tmp_path, records + _good(t))
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 0 and not list(tmp_path.glob("batch-*"))
    with historian.connect() as conn:
        c = schema.check_results
        reason = conn.execute(select(c.c.reason).where(c.c.node == "n1")).scalar_one()
    assert reason == "bad\ufffdoutput"
    assert _count(historian, schema.check_results, node="good") == 1


def test_a_spool_record_whose_time_leaves_the_calendar_in_utc_is_quarantined(
        historian, tmp_path):
    """Year 1 at +01:00 is year 0 in UTC: no datetime holds it (OverflowError, not ValueError)."""
    t = _recent()
    spool.append(tmp_path, _good(t))
    bad = _good(t)[0] | {"time": "0001-01-01T00:00:00+01:00", "node": "bad", "id": "x1"}
    with (tmp_path / spool.PENDING).open("a") as fh:
        fh.write(json.dumps(bad) + "\n")
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 1 and not list(tmp_path.glob("batch-*"))
    assert _count(historian, schema.check_results, node="good") == 1


@pytest.mark.parametrize("line", ["[" * 100_000, '{"n": ' + "9" * 5000 + "}"],
                         ids=["nested-100k-deep", "integer-of-5000-digits"])
def test_a_spool_line_json_cannot_read_is_quarantined(historian, tmp_path, line):
    """An integer past Python's 4,300 digits raises ValueError, not JSONDecodeError."""
    t = _recent()
    spool.append(tmp_path, _good(t))
    with (tmp_path / spool.PENDING).open("a") as fh:
        fh.write(line + "\n")
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 1 and not list(tmp_path.glob("batch-*"))
    assert _count(historian, schema.check_results, node="good") == 1


@pytest.mark.parametrize(("leaf", "why"), [('"\\ud800"', "not a JSON object"),
                                           ('"\\u0000"', "nested too deep")],
                         ids=["lone-surrogate", "nul"])
def test_a_spool_record_nested_deeper_than_its_mending_walks_is_quarantined(
        historian, tmp_path, leaf, why):
    """Valid JSON 600 levels deep decodes (the decoder stops near 1,000), but mending a lone
    surrogate or a NUL in it walks the record in Python, two frames a level: RecursionError,
    which nothing caught. The flush failed, the batch stayed claimed, and every later flush of
    that node failed on the same line."""
    depth = sys.getrecursionlimit() * 6 // 10
    t = _recent()
    spool.append(tmp_path, _good(t))
    deep = dict(_good(t)[0], id="deep", node="deep")
    line = json.dumps(deep)[:-1] + ', "data": ' + "[" * depth + leaf + "]" * depth + "}"
    assert json.loads(line)["node"] == "deep"  # valid JSON, not the decoder's own limit
    with (tmp_path / spool.PENDING).open("a") as fh:
        fh.write(line + "\n")

    report = deliver(historian, tmp_path)

    assert report.quarantined_count == 1 and not list(tmp_path.glob("batch-*"))
    assert why in report.quarantined[0][1].message
    assert _count(historian, schema.check_results, node="good") == 1
    assert _count(historian, schema.check_results, node="deep") == 0


# -- imports ----------------------------------------------------------------------------------


def _tickets_csv(*rows: str) -> str:
    return "node,opened,closed,reason\n" + "".join(r + "\n" for r in rows)


@pytest.mark.parametrize(("row", "why"), [
    (f"{LONG},2024-03-01T08:00:00,,psu", "longer than"),
    ("gpu\x009,2024-03-01T08:00:00,,psu", "NUL"),
    (f"gpu009,2024-03-01T08:00:00,,{TEN_MB}", "larger than"),
    ("gpu009,9999-12-31T23:59:59-01:00,,psu", "out of range"),
], ids=["node-200-chars", "nul-in-node", "10mb-reason", "time-past-year-9999-in-utc"])
def test_one_bad_ticket_row_costs_only_itself(historian, tmp_path, row, why):
    path = tmp_path / "tickets.csv"
    path.write_text(_tickets_csv("gpu001,2024-03-01T08:00:00,,fan", row,
                                 "gpu002,2024-03-02T08:00:00,,psu"))
    report = tickets.import_csv(historian, path)
    assert [b.line for b in report.bad] == [3], report.bad
    assert why in report.bad[0].message and len(report.bad[0].message) < 300
    assert sorted(t.node for t in tickets.list_tickets(historian)) == ["gpu001", "gpu002"]


def test_a_nul_in_a_ticket_reason_lands_as_a_replacement_character(historian, tmp_path):
    path = tmp_path / "tickets.csv"
    path.write_text(_tickets_csv("gpu001,2024-03-01T08:00:00,,fan\x00noise"))
    report = tickets.import_csv(historian, path)
    assert report.bad == [] and report.replaced == 1
    assert [t.reason for t in tickets.list_tickets(historian)] == ["fan\ufffdnoise"]


def _excl(job_id, node) -> str:
    return json.dumps({"job_id": job_id, "node": node, "time": "2024-03-01T08:00:00"})


@pytest.mark.parametrize(("line", "why"), [
    (_excl("7", LONG), "longer than"),
    (_excl("9" * 40, "gpu003"), "longer than"),
    (_excl("7", "gpu\x00003"), "NUL"),
    ("[1, 2]", "not a JSON object"),
    (_excl("7", None), "missing node"),
    ("[" * 100_000, "not JSON"),
    (json.dumps({"job_id": "7", "node": "gpu003", "time": "0001-01-01T00:00:00+01:00"}),
     "ISO 8601"),
    ('{"job_id": ' + "7" * 5000 + "}", "not JSON"),
], ids=["node-200-chars", "job-id-40-chars", "nul-in-node", "array", "null-node",
        "nested-100k-deep",
        "time-before-year-1-in-utc", "integer-of-5000-digits"])
def test_one_bad_exclusion_line_costs_only_itself(historian, tmp_path, line, why):
    path = tmp_path / "exclusions.jsonl"
    path.write_text("\r\n".join([_excl("1", "gpu001"), line, _excl("2", "gpu002")]) + "\r\n")
    report = exclusions.ingest_file(historian, path)
    assert [b.line for b in report.bad] == [2], report.bad
    assert why in report.bad[0].message
    assert _count(historian, schema.job_exclusions) == 2


def _check(**over) -> str:
    obj = {"time": "2024-03-01T08:00:00", "node": "gpu001", "check": "gpu", "status": "fail"}
    obj.update(over)
    return json.dumps(obj)


@pytest.mark.parametrize("over", [
    {"node": LONG}, {"check": "c" * 40}, {"component": "c" * 100}, {"code": "c" * 40},
    {"job_id": "9" * 40}, {"node": "gpu\x00001"},
    {"time": "0001-01-01T00:00:00+01:00"}, {"last_seen": "9999-12-31T23:59:59-01:00"},
], ids=["node", "check", "component", "code", "job_id", "nul-node",
        "time-before-year-1-in-utc", "last-seen-past-year-9999-in-utc"])
def test_one_bad_check_line_costs_only_itself(historian, tmp_path, over):
    path = tmp_path / "checks.jsonl"
    path.write_text("\n".join([_check(node="gpu001"), _check(**over),
                               _check(node="gpu002")]) + "\n")
    report = checks.ingest_file(historian, path)
    assert [b.line for b in report.bad] == [2], report.bad
    assert _count(historian, schema.check_results) == 2


def test_a_check_line_with_an_integer_past_5000_digits_costs_only_itself(historian, tmp_path):
    path = tmp_path / "checks.jsonl"
    path.write_text("\n".join([_check(node="gpu001"), '{"code": ' + "4" * 5000 + "}",
                               _check(node="gpu002")]) + "\n")
    report = checks.ingest_file(historian, path)
    assert [b.line for b in report.bad] == [2], report.bad
    assert _count(historian, schema.check_results) == 2


def test_a_nul_in_a_check_detail_lands_as_a_replacement_character(historian, tmp_path):
    path = tmp_path / "checks.jsonl"
    path.write_text(_check(detail="bad\x00text") + "\n")
    report = checks.ingest_file(historian, path)
    assert report.bad == [] and report.replaced == 1
    with historian.connect() as conn:
        assert conn.execute(select(schema.check_results.c.reason)).scalar() == "bad\ufffdtext"


def test_a_nul_in_an_event_reason_lands_as_a_replacement_character(historian):
    text = ("NodeName|TimeStart|TimeEnd|State|Reason\n"
            "gpu001|2024-03-01T08:00:00|Unknown|DRAIN|psu\x00swap\n"
            "gpu002|2024-03-01T08:00:00|Unknown|DRAIN|fan\n")
    report = events.ingest_text(historian, text)
    assert report.bad == [] and report.written == 2 and report.replaced == 1
    with historian.connect() as conn:
        reasons = dict(conn.execute(select(schema.node_events.c.node,
                                           schema.node_events.c.reason)).all())
    assert reasons["gpu001"] == "psu\ufffdswap"


@pytest.mark.parametrize(("argv", "body"), [
    (["ticket", "import"], ""),
    (["ticket", "import"], "node,opened,closed,reason\r\n"),
    (["ticket", "import"], TEN_MB),
    (["ingest", "checks"], ""),
    (["ingest", "exclusions"], ""),
    (["ingest", "events"], ""),
    (["ingest", "events"], "NodeName|TimeStart|TimeEnd|State|Reason\r\n"),
], ids=["tickets-empty", "tickets-header", "tickets-one-10mb-line", "checks-empty",
        "exclusions-empty", "events-empty", "events-header"])
def test_empty_and_header_only_files_are_one_line_never_a_traceback(
        historian_url, tmp_path, argv, body):
    path = tmp_path / "input"
    path.write_text(body)
    result = CliRunner().invoke(cli, ["--db", historian_url, *argv, "--file", str(path)])
    assert "Traceback" not in result.output and result.exception is None or \
        isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    assert lines and all(len(line) < 300 for line in lines), result.output


# -- values that are not names ----------------------------------------------------------------
# A JSON object, list, boolean or number with a fraction where a name was expected was stored
# under its Python spelling (str(["n1", "n2"]) -> "['n1', 'n2']") as a node name or job id; a
# name with a control character (a newline, a terminal escape), a space, or bytes that were not
# UTF-8 (an escaped lone surrogate, U+FFFD) was stored as though a node had that name. Each
# now costs its own line (reported with its number, quarantined in a spool), never a name.

NOT_NODE_NAMES = [
    pytest.param(["gpu001", "gpu002"], "a JSON list", id="node-list"),
    pytest.param({"name": "gpu001"}, "a JSON object", id="node-object"),
    pytest.param(True, "a boolean", id="node-bool"),
    pytest.param(1.5, "a number", id="node-float"),
    pytest.param(42, "a number", id="node-integer"),  # a node name is text
    pytest.param("gpu\n001", "control", id="node-newline"),
    pytest.param("gpu\x1b[31m001", "control", id="node-terminal-escape"),
    pytest.param("gpu\u2028001", "control", id="node-line-separator"),
    pytest.param("gpu\u202e100", "control", id="node-bidi-override"),
    pytest.param("gpu 001", "space", id="node-space"),
    pytest.param("gpu\udce9", "not UTF-8", id="node-lone-surrogate"),
    pytest.param("gpu\ufffd", "not UTF-8", id="node-replacement-character"),
]
NOT_JOB_IDS = [
    pytest.param(["7", "8"], "a JSON list", id="job-list"),
    pytest.param({"id": 7}, "a JSON object", id="job-object"),
    pytest.param(False, "a boolean", id="job-bool"),
    pytest.param(7.5, "a number", id="job-float"),
    pytest.param("7\r\n8", "control", id="job-crlf"),
    pytest.param("7 8", "space", id="job-space"),
    pytest.param("7\udce9", "not UTF-8", id="job-lone-surrogate"),
]
WIDE = "\U0001F600"  # json.dumps writes it as a surrogate pair: 12 characters, 4 UTF-8 bytes


# Every case of the three tests below runs on SQLite; on PostgreSQL, one of each class (a JSON
# type, a control character, bytes that were not UTF-8, and the cases that are not about a
# name): a name is judged in Python before any row is written, so the other 80-odd cases would
# ask PostgreSQL the same question again (each in a database of its own: 2 s a case on a loaded
# CI machine, a sixth of the suite's PostgreSQL time).
PG_NAME_CASES = {"node-list", "node-terminal-escape", "node-lone-surrogate", "job-crlf",
                 "job-lone-surrogate"}


def _on_sqlite_and_some_on_pg(cases):
    """(historian_url, *values) params: each case on SQLite; on PostgreSQL the class
    representatives (PG_NAME_CASES) and every case that is not one of the names above."""
    names = {p.id for p in NOT_NODE_NAMES + NOT_JOB_IDS}
    out = [pytest.param("sqlite", *p.values, id=f"sqlite-{p.id}") for p in cases]
    out += [pytest.param("postgresql", *p.values, id=f"postgresql-{p.id}",
                         marks=pytest.mark.postgres)
            for p in cases if p.id.endswith(tuple(PG_NAME_CASES))
            or not p.id.endswith(tuple(names))]
    return out


def _stored(engine, table, *cols) -> set[tuple]:
    with engine.connect() as conn:
        return set(conn.execute(select(*(table.c[c] for c in cols))).all())


def _field_cases(field, cases):
    return [pytest.param(field, *p.values, id=p.id) for p in cases]


@pytest.mark.parametrize(("historian_url", "field", "value", "why"), _on_sqlite_and_some_on_pg(
    _field_cases("node", NOT_NODE_NAMES) + _field_cases("job_id", NOT_JOB_IDS)),
    indirect=["historian_url"])
def test_an_exclusion_whose_name_is_not_a_name_costs_only_its_line(
        historian, tmp_path, field, value, why):
    bad = {"job_id": "7", "node": "gpu003", "time": "2024-03-01T08:00:00", field: value}
    path = tmp_path / "exclusions.jsonl"
    path.write_text("\n".join([_excl("1", "gpu001"), json.dumps(bad), _excl("2", "gpu002")])
                    + "\n")
    report = exclusions.ingest_file(historian, path)
    assert [b.line for b in report.bad] == [2], report.bad
    assert why in report.bad[0].message and report.dropped == {NOT_A_NAME: 1}
    assert report.bad[0].message.isprintable()  # the hostile value is not echoed raw
    assert _stored(historian, schema.job_exclusions, "job_id", "node") == {
        ("1", "gpu001"), ("2", "gpu002")}


def test_an_exclusion_node_name_with_latin1_bytes_costs_only_its_line(historian, tmp_path):
    """A file written in Latin-1: the byte reads as U+FFFD, which is not the node's name."""
    path = tmp_path / "exclusions.jsonl"
    path.write_bytes(b'{"job_id": "1", "node": "gpu001", "time": "2024-03-01T08:00:00"}\n'
                     b'{"job_id": "7", "node": "gpu\xe9", "time": "2024-03-01T08:00:00"}\n')
    report = exclusions.ingest_file(historian, path)
    assert [b.line for b in report.bad] == [2] and "not UTF-8" in report.bad[0].message
    assert _stored(historian, schema.job_exclusions, "node") == {("gpu001",)}


def test_integer_job_ids_and_names_of_128_wide_characters_land(historian):
    """A job id may be a JSON integer (its decimal text is kept); the length limit counts the
    decoded characters, not the escaped JSON, UTF-16 units or UTF-8 bytes: 128 characters
    outside the BMP land whole on both databases, 129 are refused, never cut."""
    lines = [json.dumps({"job_id": 7, "node": WIDE * 128, "time": "2024-03-01T08:00:00"}),
             json.dumps({"job_id": 8, "node": WIDE * 129, "time": "2024-03-01T08:00:00"})]
    assert "\\ud83d\\ude00" in lines[0]
    report = exclusions.ingest_lines(historian, lines)
    assert [b.line for b in report.bad] == [2] and "longer than 128" in report.bad[0].message
    assert _stored(historian, schema.job_exclusions, "job_id", "node") == {("7", WIDE * 128)}


@pytest.mark.parametrize(("historian_url", "over", "why"), _on_sqlite_and_some_on_pg([
    *[pytest.param({"node": p.values[0]}, p.values[1], id=p.id) for p in NOT_NODE_NAMES],
    *[pytest.param({"job_id": p.values[0]}, p.values[1], id=p.id) for p in NOT_JOB_IDS],
    pytest.param({"check": ["gpu"]}, "a JSON list", id="check-list"),
    pytest.param({"check": True}, "a boolean", id="check-bool"),
    pytest.param({"component": {"gpu": 0}}, "a JSON object", id="component-object"),
    pytest.param({"code": [79]}, "a JSON list", id="code-list"),
    pytest.param({"id": ["x1"]}, "a JSON list", id="id-list"),
    pytest.param({"id": 1.5}, "a number", id="id-float"),
    pytest.param({"source": ["sweep"]}, "a JSON list", id="source-list"),
]), indirect=["historian_url"])
def test_a_check_line_whose_name_is_not_a_name_costs_only_itself(historian, tmp_path, over, why):
    path = tmp_path / "checks.jsonl"
    path.write_text("\n".join([_check(node="gpu001"), _check(**over), _check(node="gpu002")])
                    + "\n")
    report = checks.ingest_file(historian, path)
    assert [b.line for b in report.bad] == [2], report.bad
    assert why in report.bad[0].message and report.bad[0].message.isprintable()
    assert report.dropped == {NOT_A_NAME: 1}
    c = schema.check_results
    assert _stored(historian, c, "node", "job_id", "check", "component", "code", "source") == {
        ("gpu001", None, "gpu", "*", "", "import"), ("gpu002", None, "gpu", "*", "", "import")}


def test_a_check_line_with_integer_ids_and_code_lands_with_their_text(historian):
    """A foreign tool's numbers (a job id, an XID code, a record id) are kept as their text."""
    report = checks.ingest_lines(historian, [_check(job_id=7, code=79, id=12345)])
    assert report.bad == [] and report.written == 1
    assert _stored(historian, schema.check_results, "id", "job_id", "code") == {
        ("12345", "7", "79")}


def _spool_line(tmp_path, rec: dict) -> None:
    with (tmp_path / spool.PENDING).open("a") as fh:
        fh.write(json.dumps(rec) + "\n")


def _delivered_names(engine) -> dict[str, set]:
    """Every node name and job id the historian holds after a delivery."""
    return {
        "nodes": {n for t in (schema.check_results, schema.job_exclusions, schema.node_actions,
                              schema.node_runs, schema.telemetry_samples)
                  for (n,) in _stored(engine, t, "node")},
        "jobs": {j for t in (schema.check_results, schema.job_exclusions, schema.node_actions)
                 for (j,) in _stored(engine, t, "job_id")},
    }


def _spool_case(kind: str, t: datetime, **over) -> dict:
    fields = {"check": {"check": "gpu", "component": "gpu0", "status": "fail",
                        "severity": "drain_now", "code": "x", "reason": "r", "source": "sweep",
                        "job_id": "5"},
              "job_start": {"job_id": "5", "excluded": ["gpu9"]},
              "action": {"action": "drain_now", "reason": "r", "job_id": "5"},
              "heartbeat": {"source": "sweep", "level": "ok", "version": "1.0"},
              "telemetry": {"source": "sweep", "metrics": {"gpu_temp_c": {"value": 60.0}}},
              }[kind]
    return spool.record(kind, "n1", t, **fields) | over


SPOOL_NOT_NAMES = [
    *[pytest.param("heartbeat", {"node": p.values[0]}, p.values[1], id=p.id)
      for p in NOT_NODE_NAMES],
    *[pytest.param("job_start", {"excluded": ["gpu8", p.values[0]]}, p.values[1],
                   id=f"excluded-{p.id}") for p in NOT_NODE_NAMES],
    pytest.param("job_start", {"excluded": ["gpu8", None]}, "null", id="excluded-null"),
    pytest.param("job_start", {"excluded": ["gpu8", ""]}, "empty", id="excluded-empty"),
    *[pytest.param(kind, {"job_id": p.values[0]}, p.values[1], id=f"{kind}-{p.id}")
      for kind in ("check", "job_start", "action") for p in NOT_JOB_IDS],
    pytest.param("check", {"job_id": "9" * 40}, "longer than 32", id="check-job-id-40-chars"),
    pytest.param("check", {"check": ["gpu"]}, "a JSON list", id="check-family-list"),
    pytest.param("check", {"component": {"gpu": 0}}, "a JSON object", id="check-component"),
    pytest.param("check", {"code": [79]}, "a JSON list", id="check-code-list"),
    pytest.param("check", {"source": ["sweep"]}, "a JSON list", id="check-source-list"),
    pytest.param("action", {"action": ["drain_now"]}, "a JSON list", id="action-list"),
    pytest.param("heartbeat", {"source": {"s": 1}}, "a JSON object", id="heartbeat-source"),
    pytest.param("action", {"id": ["x"]}, "a JSON list", id="action-id-list"),
    pytest.param("telemetry", {"metrics": {"gpu_temp_c": {"value": 60.0, "component": ["gpu0"]}}},
                 "a JSON list", id="telemetry-component-list"),
]


@pytest.mark.parametrize(("historian_url", "kind", "over", "why"),
                         _on_sqlite_and_some_on_pg(SPOOL_NOT_NAMES), indirect=["historian_url"])
def test_a_spool_record_whose_name_is_not_a_name_is_quarantined(
        historian, tmp_path, kind, over, why):
    t = _recent()
    spool.append(tmp_path, _good(t))
    _spool_line(tmp_path, _spool_case(kind, t, **over))
    spool.append(tmp_path, _good(t))
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 1, report.quarantined
    (_, bad), = report.quarantined
    assert bad.line == 2 and why in bad.message and bad.message.isprintable()
    assert not list(tmp_path.glob("batch-*"))  # done: the node's next flush goes on
    (quarantined,) = (tmp_path / "quarantine").iterdir()
    assert json.loads(quarantined.read_text())["line"] == 2
    assert _delivered_names(historian) == {"nodes": {"good"}, "jobs": {None}}


def test_spool_records_with_integer_job_ids_and_wide_names_land(historian, tmp_path):
    """The escaped surrogate pairs of a wide character are one character, never mended."""
    t = _recent()
    spool.append(tmp_path, [_spool_case("job_start", t, job_id=7, excluded=[WIDE * 128]),
                            _spool_case("check", t, job_id=8, node="n" + WIDE)])
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 0, report.quarantined
    assert _stored(historian, schema.job_exclusions, "job_id", "node") == {("7", WIDE * 128)}
    assert _stored(historian, schema.check_results, "job_id", "node") == {("8", "n" + WIDE)}


def test_a_heartbeat_with_an_infinite_error_count_is_quarantined_not_a_stuck_flush(
        historian, tmp_path):
    """int(inf) raised OverflowError, which no handler caught: every later flush of the node
    failed on the same batch for ever."""
    t = _recent()
    spool.append(tmp_path, _good(t))
    _spool_line(tmp_path, _spool_case("heartbeat", t, checker_errors=float("inf")))
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 1 and "not numbers" in report.quarantined[0][1].message
    assert not list(tmp_path.glob("batch-*"))
    assert _count(historian, schema.check_results, node="good") == 1


def test_a_heartbeat_gpu_index_of_unicode_digits_is_left_out_not_a_stuck_flush(
        historian, tmp_path):
    """"²".isdigit() is true and int("²") a ValueError, which no handler caught."""
    t = _recent()
    _spool_line(tmp_path, _spool_case("heartbeat", t, gpus={
        "\u00b2": "00000000:1A:00.0", "\u0661": "00000000:1B:00.0", "1": "00000000:1C:00.0"}))
    report = deliver(historian, tmp_path)
    assert report.quarantined_count == 0 and report.delivered == {"heartbeat": 1}
    assert _stored(historian, schema.gpu_names, "node", "idx", "bus_id") == {
        ("n1", 1, "0000:1c:00.0")}


# The text imports (sacctmgr events, the ticket system's CSV, the node inventory CSV) kept
# such a name as a node of its own: "gpu\x1b[31m001" or "gpu\ufffd" (a Latin-1 export) was a
# node no job ran on, with the outage, ticket or service period the real node lacked, in the
# lemon features and the fleet's exposure. A name there is held to the spool's rule too.
TEXT_NOT_NODE_NAMES = [p for p in NOT_NODE_NAMES if isinstance(p.values[0], str)
                       and p.values[0] != "gpu\n001"]  # a newline ends the line of text


@pytest.mark.parametrize(("value", "why"), [p.values for p in TEXT_NOT_NODE_NAMES],
                         ids=[p.id for p in TEXT_NOT_NODE_NAMES])
def test_an_event_ticket_or_inventory_node_that_is_not_a_name_costs_only_its_line(
        historian, value, why):
    ev = events.ingest_text(historian, "NodeName|TimeStart|TimeEnd|State|Reason\n"
                            "gpu001|2024-03-01T08:00:00|Unknown|DOWN|Not responding\n"
                            f"{value}|2024-03-01T08:00:00|Unknown|DOWN|Not responding\n")
    tk = tickets.import_lines(historian, io.StringIO(
        "node,opened,closed,reason\ngpu001,2024-03-01T08:00:00,,bad\n"
        f"{value},2024-03-01T08:00:00,,bad\n"), name="tickets.csv")
    inv = inventory.import_lines(historian, io.StringIO(
        "node,cluster,partition,from,to\ngpu001,c,p,2024-03-01T00:00:00,\n"
        f"{value},c,p,2024-03-01T00:00:00,\n"))
    for report in (ev, tk, inv):
        assert [b.line for b in report.bad] == [3], (report.source, report.bad)
        assert why in report.bad[0].message and report.bad[0].message.isprintable()
        assert report.dropped == {NOT_A_NAME: 1} and report.written == 1
    assert _stored(historian, schema.node_events, "node") == {("gpu001",)}
    assert _stored(historian, schema.tickets, "node") == {("gpu001",)}
    assert _stored(historian, schema.node_inventory, "node") == {("gpu001",)}
    with pytest.raises(tickets.TicketError, match=why):
        tickets.open_ticket(historian, value, "by hand")


def test_a_csv_with_a_byte_order_mark_lands_as_without_one(historian, tmp_path):
    """Excel's "CSV UTF-8" export begins with a byte-order mark: the header's first name read
    "\ufeffnode", and the tickets, inventory and GPU imports refused the whole file ("CSV
    lacks column(s) node") for a column that was there."""
    bom = b"\xef\xbb\xbf"
    files = {
        "tickets.csv": b"node,opened,closed,reason\r\ngpu001,2024-03-01T08:00:00,,HBM\r\n",
        "inventory.csv": b"node,cluster,partition,from,to\r\ngpu001,c,p,2024-03-01T00:00:00,\r\n",
        "gpus.csv": b"serial,node,slot,from,to\r\nS1,gpu001,0,2024-03-01T00:00:00,\r\n",
    }
    for name, body in files.items():
        (tmp_path / name).write_bytes(bom + body)
    reports = [tickets.import_csv(historian, tmp_path / "tickets.csv"),
               inventory.import_csv(historian, tmp_path / "inventory.csv"),
               inventory.import_gpus_csv(historian, tmp_path / "gpus.csv")]
    assert [(r.written, r.bad) for r in reports] == [(1, [])] * 3
    assert _stored(historian, schema.tickets, "node", "reason") == {("gpu001", "HBM")}
    assert _stored(historian, schema.node_inventory, "node") == {("gpu001",)}
    assert _stored(historian, schema.gpu_inventory, "serial", "node") == {("S1", "gpu001")}


def test_a_ticket_reason_whose_quote_never_closes_is_reported_not_a_silent_end(historian):
    """A quoted reason may span lines, so a quote the export never closed took every line
    after it into that one reason: read 2, written 2, and the tickets of the lines after it
    were gone without a word. Now the row is reported, with the line its quote opened on."""
    text = ("node,opened,closed,reason\n"
            "gpu001,2024-03-01T08:00:00,,\"HBM\nreplaced\"\n"
            "gpu002,2024-03-02T08:00:00,,\"fan broke, loud\n"
            "gpu003,2024-03-03T08:00:00,,psu\n"
            "gpu004,2024-03-04T08:00:00,,nvlink\n")
    report = tickets.import_lines(historian, io.StringIO(text, newline=""))
    assert _stored(historian, schema.tickets, "node", "reason") == {("gpu001", "HBM\nreplaced")}
    assert [b.line for b in report.bad] == [4] and report.dropped == {MALFORMED_CSV: 1}
    assert "line 4" in report.bad[0].message and "never closed" in report.bad[0].message
    assert "lines 4-6" in report.bad[0].message


def test_an_event_reason_holding_a_newline_is_one_event(historian):
    """A person's drain reason may hold a newline (`scontrol update ... reason="$(...)"`), and
    `sacctmgr -P` prints it as it is: two physical lines, each with the wrong number of
    fields, both reported and the outage lost. The lines are joined back as sacct's are."""
    text = ("Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User\n"
            "c|gpu001|2024-03-01T08:00:00|2024-03-01T09:00:00|DRAIN|PSU swap\n"
            "see ticket 42|root(0)\n"
            "c|gpu002|2024-03-01T08:00:00|Unknown|DOWN|three\nlines\nhere|slurm(64030)\n"
            "c|gpu003|2024-03-01T08:00:00|Unknown|DOWN|Not responding|slurm(64030)\n"
            "c|gpu004|2024-03-01T08:00:00|Unknown|DOWN|cut short\n")  # never completed
    report = events.ingest_text(historian, text)
    assert _stored(historian, schema.node_events, "node", "reason") == {
        ("gpu001", "PSU swap\nsee ticket 42"), ("gpu002", "three\nlines\nhere"),
        ("gpu003", "Not responding")}
    assert [b.line for b in report.bad] == [8] and report.written == 3
    assert report.read == 4  # events, not physical lines: read = written + dropped
