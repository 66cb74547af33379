"""Per-rank step times: `healthctl ingest steps` on the drop file and NVRx straggler reports,
as untrusted input, and `failslow.detect` judging them from the historian (docs/failslow.md)."""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import insert, inspect, select, text

from rsc_health.cli import cli
from rsc_health.config import load_config
from rsc_health.historian import db, schema
from rsc_health.historian.failslow import detect
from rsc_health.historian.ingest import steps
from tests.historian.job_rows import add_job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "failslow"
LIMITS = steps.Limits.from_config(load_config(None))


def _rows(engine, where: str = "") -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(text(
            f"SELECT job_id, rank, stage, step, node, seconds, unit FROM step_times {where} "
            "ORDER BY job_id, stage, rank, step")).all()


def test_the_drop_file_keeps_each_nodes_slowest_rank_per_step_and_reloads_to_the_same(
        historian):
    report = steps.ingest_path(historian, FIXTURES / "steps-drop.jsonl", LIMITS)
    assert (report.read, report.written, report.bad) == (64, 64, [])
    first = _rows(historian)
    # 16 ranks on 4 nodes, 4 windows: one row per node and window, its slowest rank's
    assert len(first) == 16 and first[0] == ("7002", 2, "", 100, "gpu201", 0.52, "s")
    assert {r[1] for r in first if r[4] == "gpu203"} == {8}  # 8 and 11 tie: the first read stays
    steps.ingest_path(historian, FIXTURES / "steps-drop.jsonl", LIMITS)
    assert _rows(historian) == first


def test_a_slower_rank_read_later_replaces_the_nodes_row_a_faster_one_does_not(historian):
    line = {"job_id": "9", "node": "n1", "stage": "", "step": 5, "time": "2026-01-01T00:00:00Z"}
    for rank, seconds in ((0, 1.0), (1, 1.5), (2, 1.2)):
        steps.ingest_stream(historian, io.BytesIO(
            (json.dumps({**line, "rank": rank, "seconds": seconds}) + "\n").encode()), LIMITS)
    assert _rows(historian) == [("9", 1, "", 5, "n1", 1.5, "s")]


def test_an_nvrx_report_becomes_relative_times_per_section_and_gpu(historian):
    report = steps.ingest_path(historian, FIXTURES / "nvrx-report.jsonl", LIMITS)
    assert report.bad == [] and report.read == 3
    rows = _rows(historian, "WHERE step = 1000")
    assert {r[2] for r in rows} == {"gpu", "section:fwd_bwd"}
    # 4 nodes x (the GPU score, one section) per report; rank 5's NaN fwd_bwd is skipped
    assert len(rows) == 8
    slow = [r for r in rows if r[4] == "gpu103"]
    assert {r[1] for r in slow} == {19} and all(r[6] == "rel" for r in slow)
    assert sorted(round(r[5], 3) for r in slow) == [round(1 / 0.64, 3), round(1 / 0.61, 3)]


class _Statistic(enum.Enum):
    """NVRx's own (nvidia_resiliency_ext/attribution/straggler/statistics.py, commit d8686d9):
    a plain Enum, the keys of a Report's local summaries."""

    MIN = enum.auto()
    MAX = enum.auto()
    MED = enum.auto()
    AVG = enum.auto()
    STD = enum.auto()
    NUM = enum.auto()


@dataclasses.dataclass(frozen=True)
class _Report:
    """NVRx's Report (reporting.py, commit d8686d9): its fields, in its order."""

    gpu_relative_perf_scores: dict
    section_relative_perf_scores: dict
    gpu_individual_perf_scores: dict
    section_individual_perf_scores: dict
    rank_to_node: dict
    local_section_summaries: dict
    local_kernel_summaries: dict
    generate_report_elapsed_time: float
    gather_on_rank0: bool
    rank: int | None


def _nvrx_report(nodes: int, per_node: int, slow_rank: int) -> _Report:
    """Rank 0's report of a 'gather_on_rank0' job as ReportGenerator.generate_report builds
    it: int rank keys, a section per name, NaN where a rank has no result, rank 0's own
    summaries keyed by Statistic."""
    ranks = range(nodes * per_node)
    gpu = {r: (0.58 if r == slow_rank else 0.96 + (r % 5) / 100) for r in ranks}
    sections = {"fwd_bwd": {r: (0.61 if r == slow_rank else 0.95 + (r % 4) / 100)
                            for r in ranks},
                "optimizer": {r: (float("nan") if r == 3 else 0.97) for r in ranks}}
    summary = {_Statistic.MIN: 0.1, _Statistic.MAX: 0.2, _Statistic.MED: 0.15,
               _Statistic.AVG: 0.15, _Statistic.STD: 0.01, _Statistic.NUM: 40}
    return _Report(gpu, sections, {r: 0.99 for r in ranks},
                   {s: {r: 0.99 for r in ranks} for s in sections},
                   {r: f"gpu{r // per_node:04d}" for r in ranks},
                   {"fwd_bwd": summary, "optimizer": summary},
                   {"sm90_xmma_gemm_kernel": summary}, 0.04, True, 0)


def test_a_report_as_nvrx_builds_it_reaches_the_historian_through_the_job_side_writer(
        tmp_path, historian):
    """A real report cannot be written as docs/failslow.md said (json.dumps of asdict: its local
    summaries are keyed by an Enum), and one line of all 1,024 ranks outgrows the line the
    historian reads. rsc_health.nvrx_lines writes one line per node that the reader keeps."""
    report = _nvrx_report(nodes=128, per_node=8, slow_rank=613)
    with pytest.raises(TypeError, match="keys must be"):
        json.dumps(dataclasses.asdict(report))
    whole = json.dumps({k: v for k, v in dataclasses.asdict(report).items()
                        if not k.startswith("local_")})
    assert len(whole) > LIMITS.max_line_bytes  # one line per report: refused as too long

    from rsc_health.nvrx_lines import report_lines

    lines = report_lines(report, step=4200, job_id="8800",
                         when=datetime(2026, 1, 5, 10, 0, tzinfo=UTC))
    assert len(lines) == 128 and max(map(len, lines)) < 2000
    path = tmp_path / "8800.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    loaded = steps.ingest_path(historian, path, LIMITS)
    assert (loaded.read, loaded.bad) == (128, [])
    rows = _rows(historian)
    # per node and stage, its slowest rank: 128 nodes x (gpu, fwd_bwd, optimizer)
    assert len(rows) == 128 * 3 and {r[2] for r in rows} == {
        "gpu", "section:fwd_bwd", "section:optimizer"}
    slow = {(r[2], r[1], round(r[5], 4)) for r in rows if r[4] == "gpu0076"}
    assert slow == {("gpu", 613, round(1 / 0.58, 4)), ("section:fwd_bwd", 613, round(1 / 0.61, 4)),
                    ("section:optimizer", 608, round(1 / 0.97, 4))}
    # rank 3's NaN optimizer score is no row: gpu0000's optimizer row is another rank's
    assert [r[1] for r in rows if r[4] == "gpu0000" and r[2] == "section:optimizer"] == [0]


def test_the_job_side_writer_leaves_out_what_the_reader_would_refuse():
    """Ranks whose node NVRx never learned ('<unk>'), NaN or infinite scores, and a job with
    no id are not written: a refused line would cost the node's other ranks."""
    from rsc_health.nvrx_lines import report_lines

    report = {"rank_to_node": {0: "n1", 1: "<unk>", 2: "n2", 3: "n2"},
              "gpu_relative_perf_scores": {0: 0.9, 1: 0.8, 2: float("nan"), 3: float("inf")},
              "section_relative_perf_scores": {"s": {0: 1.0, 1: 0.5, 2: True, 3: 0.7}}}
    lines = [json.loads(line) for line in report_lines(report, 1, job_id="5",
                                                       when=datetime(2026, 1, 1))]
    assert [(x["rank_to_node"], x["gpu_relative_perf_scores"], x["section_relative_perf_scores"])
            for x in lines] == [({"0": "n1"}, {"0": 0.9}, {"s": {"0": 1.0}}),
                                ({"2": "n2", "3": "n2"}, {}, {"s": {"3": 0.7}})]
    assert lines[0]["time"] == "2026-01-01T00:00:00.000000Z"
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "environ", env)
        with pytest.raises(ValueError, match="SLURM_JOB_ID"):
            report_lines(report, 1)


HOSTILE = [
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": -0.5,
      "time": "2026-01-01T00:00:00Z"}, "seconds"),
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": 1e400,
      "time": "2026-01-01T00:00:00Z"}, "seconds"),
    ({"job_id": "1", "rank": True, "node": "n1", "step": 1, "seconds": 1,
      "time": "2026-01-01T00:00:00Z"}, "rank"),
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 2**80, "seconds": 1,
      "time": "2026-01-01T00:00:00Z"}, "step"),
    ({"job_id": "1", "rank": 0, "node": "n\x001", "step": 1, "seconds": 1,
      "time": "2026-01-01T00:00:00Z"}, "NUL"),
    ({"job_id": "1" * 40, "rank": 0, "node": "n1", "step": 1, "seconds": 1,
      "time": "2026-01-01T00:00:00Z"}, "longer"),
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": "fast",
      "time": "2026-01-01T00:00:00Z"}, "number"),
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": 1, "time": "yesterday"},
     "ISO"),
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": 1,
      "time": "2026-01-01T00:00:00Z", "stage": "gpu"}, "reserved"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "gpu_relative_perf_scores": {"0": 3.5}}, "above 1"),
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": 1,
      "time": "9999-01-01T00:00:00Z"}, "ahead of the historian's clock"),
    ({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": 1,
      "time": "1970-01-01T00:00:00Z"}, "before 2020"),
    ({"job_id": "1", "step": 1, "time": "3000-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "gpu_relative_perf_scores": {"0": 0.5}}, "ahead of the historian's clock"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {},
      "gpu_relative_perf_scores": {"0": 0.5}}, "no node"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n"},
      "section_relative_perf_scores": ["x"]}, "not an object"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "gpu_relative_perf_scores": {"0": -0.5}}, "not in (0,"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "section_relative_perf_scores": {"s": {"0": 0}}}, "not in (0,"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "gpu_relative_perf_scores": {"0": float("inf")}}, "not in (0,"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "gpu_relative_perf_scores": {"0": "0.5"}}, "not a number"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "gpu_relative_perf_scores": {"0": True}}, "not a number"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"x": "n1"},
      "gpu_relative_perf_scores": {"x": 0.5}}, "rank 'x' is not an integer"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z",
      "rank_to_node": {"0": {"name": "n1"}}, "gpu_relative_perf_scores": {"0": 0.5}},
     "node is not a string"),
    ({"job_id": "1", "rank": 0, "node": ["n1", "n2"], "step": 1, "seconds": 1,
      "time": "2026-01-01T00:00:00Z"}, "node is not a string"),
    ({"job_id": {"id": 1}, "rank": 0, "node": "n1", "step": 1, "seconds": 1,
      "time": "2026-01-01T00:00:00Z"}, "job_id is not a string"),
    ({"job_id": "1", "rank": 0, "node": "n1", "stage": 1.5, "step": 1, "seconds": 1,
      "time": "2026-01-01T00:00:00Z"}, "stage is not a string"),
    ({"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z", "rank_to_node": {"0": "n1"},
      "section_relative_perf_scores": {"s" * 80: {"0": 0.5}}}, "stage"),
    ([1, 2, 3], "not a JSON object"),
]


def test_hostile_lines_are_reported_by_number_and_the_good_ones_kept(tmp_path, historian):
    good = {"job_id": "1", "rank": 3, "node": "n1", "step": 7, "seconds": 0.25,
            "time": "2026-01-01T00:00:00+02:00"}
    # Nested too deep for the decoder and under the 64 KiB line limit (100,000 was refused
    # for its length, before any JSON was read).
    deep = "[" * 60_000
    assert len(deep) < LIMITS.max_line_bytes
    lines = [json.dumps(obj) for obj, _ in HOSTILE] + ["{not json", deep, json.dumps(good)]
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = steps.ingest_path(historian, path, LIMITS)
    assert report.written == 1 and len(report.bad) == len(HOSTILE) + 2
    for bad, (_, why) in zip(report.bad, HOSTILE, strict=False):
        assert why in bad.message, (bad, why)
    assert "not JSON: maximum recursion depth" in report.bad[-1].message
    with historian.connect() as conn:
        row = conn.execute(select(schema.step_times)).one()
    assert row.time == datetime(2025, 12, 31, 22, 0, 0)  # offset read, stored as UTC


def test_a_number_or_time_past_what_a_float_or_a_date_holds_costs_only_its_line(
        tmp_path, historian):
    """JSON integers have no bound (10**400 is no float: OverflowError, not ValueError), and a
    time at an offset can leave the calendar in UTC: each costs its own line, never the file
    or the other users' files of the directory."""
    good = {"job_id": "1", "rank": 3, "node": "n1", "step": 7, "seconds": 0.25,
            "time": "2026-01-01T00:00:00Z"}
    nvrx = {"job_id": "1", "step": 1, "time": "2026-01-01T00:00:00Z",
            "rank_to_node": {"0": "n1"}}
    lines = ['{"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": 1' + "0" * 400
             + ', "time": "2026-01-01T00:00:00Z"}',
             json.dumps(nvrx)[:-1] + ', "gpu_relative_perf_scores": {"0": 1' + "0" * 400 + "}}",
             json.dumps({**good, "time": "0001-01-01T00:00:00+01:00"}),
             json.dumps({**good, "time": "9999-12-31T23:59:59-01:00"}),
             '{"job_id": "1", "rank": ' + "1" * 5000 + "}",  # past int's 4,300 digits
             json.dumps(good)]
    (tmp_path / "a-hostile.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b-other-user.jsonl").write_text(json.dumps({**good, "node": "n2"}) + "\n")
    report = steps.ingest_path(historian, tmp_path, LIMITS)
    assert [b.line for b in report.bad] == [1, 2, 3, 4, 5], report.bad
    assert "seconds" in report.bad[0].message and "score" in report.bad[1].message
    assert all("ISO 8601" in b.message for b in report.bad[2:4])
    assert "not JSON" in report.bad[4].message
    assert {r[4] for r in _rows(historian)} == {"n1", "n2"}


def test_a_flood_of_garbage_lines_is_counted_not_listed_line_by_line(tmp_path, historian):
    """2M garbage lines held 2M BadRow objects (522 MB measured); a directory of such files
    could exhaust the historian's memory. The first MAX_BAD_LISTED are listed, all counted."""
    path = tmp_path / "flood.jsonl"
    n = steps.MAX_BAD_LISTED * 3
    path.write_text("x\n" * n + json.dumps({"job_id": "1", "rank": 0, "node": "n1", "step": 1,
                                            "seconds": 1, "time": "2026-01-01T00:00:00Z"}))
    report = steps.ingest_path(historian, path, LIMITS)
    assert len(report.bad) == steps.MAX_BAD_LISTED and report.written == 1
    assert report.bad_not_listed == n - steps.MAX_BAD_LISTED
    assert sum(report.dropped.values()) == n and report.read == n + 1
    url = historian.url.render_as_string(hide_password=False)
    out = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", "--json", str(path)])
    assert out.exit_code == 0, out.output
    said = json.loads(out.output)
    assert len(said["bad"]) == steps.MAX_BAD_LISTED
    assert said["bad_not_listed"] == n - steps.MAX_BAD_LISTED


def test_one_users_flood_of_files_cannot_push_another_users_file_past_the_limit(
        tmp_path, historian):
    """The directory is read to max_files files; by name alone, 'a*.jsonl' files of one user
    kept 'z.jsonl' of another out of every load. Each owner's files are taken in turn."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the files two owners")
    line = {"job_id": "1", "rank": 0, "step": 1, "seconds": 1, "time": "2026-01-01T00:00:00Z"}
    for i in range(5):
        path = tmp_path / f"a{i}.jsonl"
        path.write_text(json.dumps({**line, "node": f"flood{i}"}) + "\n")
        os.chown(path, 4242, 4242)
    (tmp_path / "z.jsonl").write_text(json.dumps({**line, "node": "victim"}) + "\n")
    limits = steps.Limits(max_line_bytes=1024, max_lines=10, max_files=3,
                          owner_must_match=False)  # the order alone (owners: the next test)
    report = steps.ingest_path(historian, tmp_path, limits)
    assert "victim" in {r[4] for r in _rows(historian)} and report.written == 3
    assert "3 were not read" in report.bad[-1].message


def test_a_users_step_file_counts_only_for_that_users_own_jobs(tmp_path, historian):
    """Anyone may write the shared drop directory and name any running job (squeue shows
    them): a line for another user's job would make that job's nodes suspects. A user's file
    is read for that user's jobs (sacct's User); a job not ingested yet waits for a later
    pass; an owner with no name here is refused; root's and the historian's own files are
    taken at their word."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root to give the files other owners")
    user = pwd.getpwnam("nobody")
    with historian.begin() as conn:
        for job_id, owner, nodes in (("501", "nobody", ["own-job-node", "nameless"]),
                                     ("502", "alice", ["victim", "roots-word"])):
            pk = conn.execute(insert(schema.jobs).values(
                job_id=job_id, job_id_display=job_id, user=owner, state="RUNNING",
                submit=datetime(2026, 1, 1), instance_key=f"{job_id}:x:", nnodes=4)
                .returning(schema.jobs.c.id)).scalar_one()
            conn.execute(insert(schema.job_nodes), [{"job_pk": pk, "node": n} for n in nodes])
    line = {"rank": 0, "step": 1, "seconds": 1, "time": "2026-01-01T00:00:00Z"}

    def drop(name, uid, job_id, node):
        path = tmp_path / name
        path.write_text(json.dumps({**line, "job_id": job_id, "node": node}) + "\n")
        os.chown(path, uid, 0)

    drop("own.jsonl", user.pw_uid, "501", "own-job-node")
    drop("forged.jsonl", user.pw_uid, "502", "victim")
    drop("early.jsonl", user.pw_uid, "999", "not-yet")
    drop("nameless.jsonl", 54321, "501", "nameless")
    drop("root.jsonl", 0, "502", "roots-word")
    report = steps.ingest_path(historian, tmp_path, LIMITS)
    assert {r[4] for r in _rows(historian)} == {"own-job-node", "roots-word"}
    assert report.dropped == {steps.ANOTHER_USERS_JOB: 1, steps.JOB_NOT_KNOWN_YET: 1,
                              steps.OWNER_UNKNOWN: 1}
    assert report.written == 2 and report.read == 5
    # The site that turns it off takes every line at its word.
    off = steps.Limits(LIMITS.max_line_bytes, LIMITS.max_lines, LIMITS.max_files, False)
    steps.ingest_path(historian, tmp_path, off)
    assert {r[4] for r in _rows(historian)} >= {"victim", "not-yet", "nameless"}


def test_a_year_before_1000_is_stored_zero_padded_so_text_order_is_time_order(historian):
    """db_time's text is what both dialects compare: '999-...' sorts after '2026-...' as text,
    so such a row would sit outside every window and never be pruned."""
    from rsc_health.historian.ingest import db_time

    assert db_time(datetime(999, 12, 31, 23, 59, 59)) == "0999-12-31 23:59:59.000000"
    assert db_time(datetime(999, 1, 1)) < db_time(datetime(2026, 1, 1))


def test_a_line_over_the_limit_is_skipped_and_a_file_over_the_count_is_cut(tmp_path, historian):
    ok = json.dumps({"job_id": "1", "rank": 0, "node": "n1", "step": 1, "seconds": 1,
                     "time": "2026-01-01T00:00:00Z"})
    path = tmp_path / "long.jsonl"
    path.write_text(ok + "\n" + '{"pad": "' + "x" * 300_000 + '"}\n' + ok.replace(
        '"step": 1', '"step": 2') + "\n" + ok.replace('"step": 1', '"step": 3') + "\n")
    limits = steps.Limits(max_line_bytes=1024, max_lines=3, max_files=10)
    report = steps.ingest_path(historian, path, limits)
    assert report.written == 2
    assert [b.line for b in report.bad] == [2, 4]
    assert "longer than 1024 bytes" in report.bad[0].message
    assert "more than 3 lines" in report.bad[1].message


def test_symlinks_and_fifos_are_refused_without_blocking(tmp_path, historian):
    src = FIXTURES / "steps-drop.jsonl"
    d = tmp_path / "drops"
    d.mkdir()
    (d / "a.jsonl").write_bytes(src.read_bytes())
    os.symlink(src, d / "b.jsonl")
    os.mkfifo(d / "c.jsonl")
    (d / "notes.txt").write_text("not a step file")
    done = threading.Event()

    def run():
        run.report = steps.ingest_path(historian, d, LIMITS)
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    assert done.wait(30), "a FIFO in the drop directory blocked the load"
    report = run.report
    assert report.written == 64
    assert sorted(b.message for b in report.bad) == [
        "b.jsonl: not a regular file: refused", "c.jsonl: not a regular file: refused"]
    with pytest.raises(steps.StepsError, match="symlink"):
        steps.ingest_path(historian, d / "b.jsonl", LIMITS)
    with pytest.raises(steps.StepsError, match="not a regular file or a directory"):
        steps.ingest_path(historian, d / "c.jsonl", LIMITS)


def test_healthctl_ingest_steps_reads_a_directory_and_says_what_it_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    d = tmp_path / "drops"
    d.mkdir()
    for name in ("steps-drop.jsonl", "nvrx-report.jsonl"):
        (d / name).write_bytes((FIXTURES / name).read_bytes())
    result = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", str(d), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["read"], out["written"], out["bad"]) == (67, 64 + 3 * 63, [])
    missing = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", str(tmp_path / "none")])
    assert missing.exit_code != 0 and "none" in missing.output
    piped = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", "-"],
                               input=(FIXTURES / "steps-drop.jsonl").read_text())
    assert piped.exit_code == 0 and "steps: read 64, written 64" in piped.output


def _job(engine, job_id: str, nodes: list[str], start: datetime, end: datetime | None):
    add_job(engine, job_id, start, nodes, end=end)


def test_detect_judges_the_historians_step_times_of_a_running_job(historian):
    steps.ingest_path(historian, FIXTURES / "steps-drop.jsonl", LIMITS)
    _job(historian, "7002", ["gpu201", "gpu202", "gpu203", "gpu204"],
         datetime(2026, 11, 26, 9, 55), None)
    found = detect(historian, datetime(2026, 11, 26, 10, 20), load_config(None))
    assert [(e.node, e.source, e.job_ids) for e in found] == [("gpu203", "steps", ("7002",))]
    assert found[0].value / found[0].peer_median == pytest.approx(1.4, rel=0.02)
    # an hour later the window holds none of it
    assert detect(historian, datetime(2026, 11, 26, 11, 30), load_config(None)) == []


def test_detect_reads_nvrx_scores_as_relative_times(historian):
    steps.ingest_path(historian, FIXTURES / "nvrx-report.jsonl", LIMITS)
    _job(historian, "7001", [f"gpu{n}" for n in (101, 102, 103, 104)],
         datetime(2026, 11, 26, 9, 50), datetime(2026, 11, 26, 12, 0))
    found = detect(historian, datetime(2026, 11, 26, 10, 15), load_config(None))
    assert {(e.node, e.source) for e in found} == {("gpu103", "steps")}
    assert all("stage gpu" in e.detail or "stage section:fwd_bwd" in e.detail for e in found)


def test_upgrade_to_11_adds_step_times_as_a_new_database_has_them(tmp_path):
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    for mig in db.migrations("sqlite"):
        if mig.version <= 8:
            (old_dir / mig.path.name).write_text(mig.path.read_text())
    old = db.engine_for(f"sqlite:///{tmp_path / 'old.db'}")
    new = db.engine_for(f"sqlite:///{tmp_path / 'new.db'}")
    try:
        assert db.migrate(old, 0, old_dir)[-1] == 8
        assert 11 in db.migrate(old, 8)
        db.create(new)

        def shape(engine):
            insp = inspect(engine)
            return (sorted((c["name"], c["nullable"]) for c in insp.get_columns("step_times")),
                    sorted(i["name"] for i in insp.get_indexes("step_times")),
                    insp.get_pk_constraint("step_times")["constrained_columns"])

        assert shape(old) == shape(new)
    finally:
        old.dispose()
        new.dispose()


@pytest.mark.postgres
def test_postgresql_migration_0011_builds_what_schema_py_builds(pg_url, tmp_path):
    engine = db.engine_for(pg_url)
    try:
        db.migrate(engine, 0)
        insp = inspect(engine)
        cols = {c["name"]: str(c["type"]) for c in insp.get_columns("step_times")}
        assert cols["step"] == "BIGINT" and cols["seconds"].startswith(("FLOAT", "DOUBLE"))
        assert insp.get_pk_constraint("step_times")["constrained_columns"] == [
            "job_id", "node", "stage", "step"]
    finally:
        engine.dispose()


def test_a_historian_that_cannot_be_read_is_an_error_never_no_suspects(tmp_path):
    from rsc_health.historian.db import HistorianUnavailable

    gone = db.engine_for(f"sqlite:///{tmp_path / 'gone' / 'h.db'}")
    try:
        with pytest.raises(HistorianUnavailable, match="could not be read for fail-slow"):
            detect(gone, datetime(2026, 11, 26, 10, 20), load_config(None))
    finally:
        gone.dispose()


def test_the_labs_drop_files_go_through_ingest_and_detect(tmp_path):
    """The simulator's step files, as a job would leave them, through `healthctl ingest steps`
    and `detect`: the injected nodes that slow their ranks are found from steps alone."""
    import pandas as pd

    from rsc_health.sim.failslow import FailSlowConfig, simulate_failslow, write_failslow

    fleet = simulate_failslow(FailSlowConfig(jobs=6, seed=11, fault_share=1.0,
                                             imbalance_share=0.0, steps_share=1.0,
                                             sizes=(8,), size_weights=(1.0,), sweeps=(14, 14),
                                             kinds=("hw_slowdown",)))
    write_failslow(fleet, tmp_path / "lab")
    url = f"sqlite:///{tmp_path / 'h.db'}"
    result = CliRunner().invoke(cli, ["--db", url, "ingest", "steps", str(tmp_path / "lab" /
                                                                           "steps"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["written"] == len(fleet.steps)
    engine = db.connect(url, create_missing=True)
    try:
        for job, rows in fleet.membership.groupby("job_id"):
            _job(engine, job, list(rows["node"]), rows["start"].iloc[0].to_pydatetime(),
                 rows["end"].iloc[0].to_pydatetime())
        cfg = load_config(None)
        found = set()
        for _, row in fleet.jobs.iterrows():
            end = pd.Timestamp(row["end"]).to_pydatetime()
            found |= {(e.job_ids, e.node) for e in detect(engine, end, cfg)
                      if e.source == "steps"}
    finally:
        engine.dispose()
    truth = {((r.job_id,), r.node) for r in fleet.truth.itertuples()}
    assert truth and found == truth


def test_prune_forgets_step_times_after_their_retention(historian):
    from rsc_health.historian.retention import Retention, prune

    now = datetime(2026, 11, 26, 12, 0)
    rows = [{"job_id": "1", "node": "n1", "stage": "", "step": d, "rank": 0,
             "time": datetime(2026, 11, 26 - d, 11, 0), "seconds": 1.0, "unit": "s"}
            for d in range(0, 20)]
    with historian.begin() as conn:
        conn.execute(insert(schema.step_times), rows)
    retention = Retention(days=400, steps_days=7)
    # days 7 (7 days and 1 hour ago) to 19 go
    assert prune(historian, now, retention, dry_run=True)["step_times"] == 13
    assert prune(historian, now, retention)["step_times"] == 13
    with historian.connect() as conn:
        left = sorted(conn.execute(select(schema.step_times.c.step)).scalars())
    assert left == list(range(0, 7))
    assert "step_times" not in prune(historian, now, Retention(days=400, steps_days=0))


SACCT_HEADER = ("JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|"
                "End|NNodes|NodeList|AllocTRES")


def _running(engine, cluster: str, job_id: str, nodes: str, user: str = "carol",
             start: str = "09:55:00") -> None:
    """A job sacct lists as running, as `healthctl ingest sacct` loads it for `cluster`."""
    from rsc_health.historian.ingest import sacct

    line = (f"{job_id}|{job_id}|train|{user}|gpu|RUNNING|0:0|2026-11-26T09:50:00|"
            f"2026-11-26T09:50:00|2026-11-26T{start}|Unknown|4|{nodes}|"
            "billing=32,cpu=384,gres/gpu=32,mem=4000G,node=4")
    report = sacct.ingest_text(engine, f"{SACCT_HEADER}\n{line}\n", cluster=cluster)
    assert report.bad == [] and report.written == 1, report


def _drop_lines(job_id: str, seconds: dict[str, float]) -> str:
    """Two ranks a node, four five-minute windows of steps, each node at its own pace."""
    lines = []
    for w in range(4):
        for rank, (node, s) in enumerate((n, s) for n, s in seconds.items() for _ in range(2)):
            lines.append(json.dumps({
                "job_id": job_id, "rank": rank, "node": node, "stage": "",
                "step": 100 * (w + 1), "seconds": s + 0.002 * (rank % 2),
                "time": f"2026-11-26T10:{5 * w:02d}:30Z"}))
    return "\n".join(lines) + "\n"


def test_a_job_id_of_another_cluster_is_another_job_to_the_detector(historian):
    """Two clusters in one historian both count job ids from their own start: alpha's job
    7000 (its node a3 40% slow) and beta's job 7000 (other GPUs, another workload, twice the
    step time) ran at once. Their nodes were judged as one job's peers: a3, below the pooled
    median, was no suspect. A job is (cluster, job id) to the detector now; evidence names
    a job id two clusters share as ID@CLUSTER."""
    _running(historian, "alpha", "7000", "a[1-4]")
    _running(historian, "beta", "7000", "b[1-4]", start="09:57:12")
    alpha = {"a1": 0.5, "a2": 0.5, "a3": 0.7, "a4": 0.5}
    beta = {f"b{i}": 1.0 for i in range(1, 5)}
    text = _drop_lines("7000", alpha) + _drop_lines("7000", beta)
    report = steps.ingest_stream(historian, io.BytesIO(text.encode()), LIMITS)
    assert report.written == 64 and report.bad == []
    found = detect(historian, datetime(2026, 11, 26, 10, 20), load_config(None))
    assert [(e.node, e.source, e.job_ids) for e in found] == [("a3", "steps", ("7000@alpha",))]
    assert found[0].value / found[0].peer_median == pytest.approx(1.4, rel=0.02)


def test_a_users_job_on_one_cluster_lends_no_right_to_the_same_id_on_another(tmp_path,
                                                                            historian):
    """The owner check asked whose job 502 was by the id alone: nobody's job 502 on cluster
    beta let nobody's file write step times for alice's job 502 on alpha, slow ones for
    alpha's nodes (suspects made of another user's job). A row's job is the one with its id
    that ran on its node now."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root to give the file another owner")
    user = pwd.getpwnam("nobody")
    _running(historian, "alpha", "502", "a[1-4]", user="alice")
    _running(historian, "beta", "502", "b[1-4]", user="nobody", start="09:57:12")
    forged = _drop_lines("502", {"a1": 0.5, "a2": 0.5, "a3": 3.0, "a4": 0.5})
    own = _drop_lines("502", {"b1": 0.5, "b2": 0.5, "b3": 0.5, "b4": 0.5})
    path = tmp_path / "nobody.jsonl"
    path.write_text(forged + own)
    os.chown(path, user.pw_uid, 0)
    report = steps.ingest_path(historian, path, LIMITS)
    assert {r[4] for r in _rows(historian)} == {"b1", "b2", "b3", "b4"}
    assert report.dropped == {steps.ANOTHER_USERS_JOB: 32} and report.written == 32
    assert detect(historian, datetime(2026, 11, 26, 10, 20), load_config(None)) == []
