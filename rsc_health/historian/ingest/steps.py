"""Per-rank step times jobs report, into `step_times` (docs/failslow.md): per job, node,
stage and step the historian keeps the node's slowest rank, what the detector judges.

Two forms, told apart line by line (JSON Lines; a `.json` file may hold one report):

- the drop file: one object per rank per step (or per window of steps):
  {"job_id": "4242", "rank": 17, "node": "gpu042", "stage": "3", "step": 1200,
   "seconds": 0.512, "time": "2026-11-26T10:05:00Z"}    (stage optional)
- NVIDIA Resiliency Extension's straggler report (nvidia_resiliency_ext.attribution.straggler
  .Report from NVRx 0.4, src/nvidia_resiliency_ext/attribution/straggler/reporting.py): its
  relative scores and rank_to_node (rank keys as strings), plus the job_id, step and time the
  report was made; rsc_health/nvrx_lines.py writes one such line per node (a real report's
  local summaries are keyed by an Enum, so `json.dumps(dataclasses.asdict(report))` fails, and
  one line of every rank outgrows a line here at ~500 ranks). Each relative performance score
  (0..1: the fastest rank's median time / this rank's) becomes a relative time 1/score, unit
  "rel", stage "section:NAME" per section and "gpu" for the GPU score; individual scores (a rank
  against its own past) are not peer comparisons and are not kept.

The files come from jobs, so from users: every value is checked (finite, positive, bounded),
lines longer than [failslow] steps_max_line_bytes and files longer than steps_max_lines are
cut and said, and a file is opened only as a regular file (no symlink followed, no FIFO
waited on: durable.open_regular); a directory is read one level deep, its symlinks and
non-files refused by name.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from rsc_health.durable import open_regular
from rsc_health.historian import schema
from rsc_health.historian.db import first_line, writer
from rsc_health.historian.freshness import CLOCK_FLOOR, believable
from rsc_health.historian.ingest import (
    BATCH_ROWS,
    IngestReport,
    RowError,
    db_time,
    key_text,
    parse_time,
)
from rsc_health.spool import without_lone_surrogates

COLUMNS = ("job_id", "rank", "stage", "step", "node", "time", "seconds", "unit")
KEY = ("job_id", "node", "stage", "step")
MAX_RANK = 10_000_000
MAX_STEP = 2**53
MAX_SECONDS = 86_400.0
MAX_BAD_LISTED = 1000  # bad lines listed per load; the rest counted (IngestReport.max_bad)
SUFFIXES = (".jsonl", ".json", ".ndjson")
NVRX_SECTIONS = "section_relative_perf_scores"
NVRX_GPU = "gpu_relative_perf_scores"


class StepsError(Exception):
    """The path given cannot be read as step files at all (missing, not a file or directory)."""


@dataclass(frozen=True)
class Limits:
    max_line_bytes: int
    max_lines: int
    max_files: int
    owner_must_match: bool = True
    # Lines one pass reads in all (files x lines is users' to make); what it leaves is said.
    max_lines_per_pass: int = 20_000_000

    @classmethod
    def from_config(cls, cfg: Any) -> Limits:
        return cls(int(cfg.get("failslow.steps_max_line_bytes")),
                   int(cfg.get("failslow.steps_max_lines")),
                   int(cfg.get("failslow.steps_max_files")),
                   bool(cfg.get("failslow.steps_owner_must_match")),
                   int(cfg.get("failslow.steps_max_lines_per_pass")))


# How far past an over-long line's cut is read for its end: further, the file is refused from
# there (a sparse file of zeros terabytes long was read to its end, hours a pass).
MAX_SKIP_BYTES = 16 << 20


class _Budget:
    """The lines a pass may still read (Limits.max_lines_per_pass), shared by its files; with
    `parent`, one owner's share of it (both spent by each line, the smaller one binding)."""

    def __init__(self, lines: int, parent: _Budget | None = None):
        self._left = lines
        self.parent = parent
        self.spent_in: str | None = None  # where it ran out

    @property
    def left(self) -> int:
        return self._left if self.parent is None else min(self._left, self.parent.left)

    def spend(self) -> None:
        self._left -= 1
        if self.parent is not None:
            self.parent.spend()


def _int(value: object, name: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise RowError(f"{name} is not an integer")
    try:
        number = int(value)
    except ValueError as exc:
        raise RowError(f"{name} {str(value)[:32]!r} is not an integer") from exc
    if not 0 <= number <= limit:
        raise RowError(f"{name} {number} is out of range 0..{limit}")
    return number


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RowError(f"{name} is not a number")
    try:
        number = float(value)
    except OverflowError as exc:  # a JSON integer has no bound: 10**400 is no float
        raise RowError(f"{name} {str(value)[:32]}... is not in (0, {MAX_SECONDS:g}]") from exc
    if not math.isfinite(number) or number <= 0 or number > MAX_SECONDS:
        raise RowError(f"{name} {str(value)[:32]} is not in (0, {MAX_SECONDS:g}]")
    return number


def _name(value: object, name: str, limit: int) -> str:
    """A job id, node or stage: JSON text or an integer (a job id written as a number), never an
    object, list, float or boolean, whose Python spelling would be kept as a name."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RowError(f"{name} is not a string")
    return key_text(value, name, limit)


def _time(value: object, received: datetime) -> str:
    """A step's time, believable as the historian's clock judges a node's (freshness: from
    CLOCK_FLOOR to a few minutes ahead): a row stamped in 9999 would sit outside every
    window and never be pruned, so a user could grow the table without end."""
    try:
        when = parse_time(str(value)[:64])
    except ValueError as exc:
        raise RowError(f"time {str(value)[:64]!r} is not ISO 8601") from exc
    if not believable(when, received):
        raise RowError(f"time {when:%Y-%m-%d %H:%M} is before {CLOCK_FLOOR:%Y} or ahead of "
                       "the historian's clock")
    return db_time(when) or ""


def drop_row(obj: dict, received: datetime) -> tuple:
    """One drop-file line as a step_times row (RowError when it cannot be kept)."""
    missing = [k for k in ("job_id", "rank", "node", "step", "seconds", "time")
               if obj.get(k) in (None, "")]
    if missing:
        raise RowError(f"missing {', '.join(missing)}")
    stage = obj.get("stage")
    stage = "" if stage is None else _name(stage, "stage", 64)
    if stage.startswith("section:") or stage == "gpu":
        raise RowError(f"stage {stage[:32]!r} is reserved for NVRx reports")
    return (_name(obj["job_id"], "job_id", 32), _int(obj["rank"], "rank", MAX_RANK),
            stage, _int(obj["step"], "step", MAX_STEP),
            _name(obj["node"], "node", 128), _time(obj["time"], received),
            _positive(obj["seconds"], "seconds"), "s")


def nvrx_rows(obj: dict, received: datetime) -> list[tuple]:
    """An NVRx straggler report's relative scores as step_times rows (unit "rel")."""
    missing = [k for k in ("job_id", "step", "time", "rank_to_node") if obj.get(k) in (None, "")]
    if missing:
        raise RowError(f"NVRx report: missing {', '.join(missing)}")
    job = _name(obj["job_id"], "job_id", 32)
    step = _int(obj["step"], "step", MAX_STEP)
    when = _time(obj["time"], received)
    nodes = obj["rank_to_node"]
    if not isinstance(nodes, dict):
        raise RowError("NVRx report: rank_to_node is not an object")
    groups: list[tuple[str, object]] = [("gpu", obj.get(NVRX_GPU) or {})]
    sections = obj.get(NVRX_SECTIONS) or {}
    if not isinstance(sections, dict):
        raise RowError(f"NVRx report: {NVRX_SECTIONS} is not an object")
    groups += [(f"section:{name}", scores) for name, scores in sections.items()]
    rows = []
    for stage, scores in groups:
        if not isinstance(scores, dict):
            raise RowError(f"NVRx report: the scores of {stage[:40]!r} are not an object")
        stage = key_text(stage, "stage", 64)
        for rank, score in scores.items():
            if isinstance(score, float) and math.isnan(score):
                continue  # NVRx's "no result for this rank" (reporting.py: NaN)
            value = _positive(score, f"score of rank {str(rank)[:16]}")
            if value > 1.0 + 1e-9:
                raise RowError(f"score {value:g} of rank {str(rank)[:16]} is above 1")
            if value < 1.0 / MAX_SECONDS:
                # its relative time 1/score would be past any step's (5e-324: infinite), and
                # would win every later upsert of its key
                raise RowError(f"score {value:g} of rank {str(rank)[:16]} is under "
                               f"{1.0 / MAX_SECONDS:g}")
            r = _int(rank, "rank", MAX_RANK)
            node = nodes.get(str(r), nodes.get(r))
            if node in (None, "", "<unk>"):
                raise RowError(f"NVRx report: rank {r} has no node in rank_to_node")
            rows.append((job, r, stage, step, _name(node, "node", 128), when,
                         1.0 / value, "rel"))
    return rows


def parse_line(line: str, received: datetime) -> list[tuple]:
    """The step_times rows of one JSON line (RowError when it has none to keep); `received`:
    now, naive UTC, what the line's time is judged against."""
    try:
        obj = without_lone_surrogates(json.loads(line))
    except (ValueError, RecursionError) as exc:  # ValueError: an integer past 4,300 digits
        raise RowError(f"not JSON: {str(exc)[:200]}") from exc
    if not isinstance(obj, dict):
        raise RowError("not a JSON object")
    if NVRX_SECTIONS in obj or NVRX_GPU in obj:
        return nvrx_rows(obj, received)
    return [drop_row(obj, received)]


def _write(conn, rows: list[tuple]) -> int:
    """Keep, per (job, node, stage, step), the slowest rank: a row replaces the stored one
    only when it is slower (so a file read twice, or its ranks in any order, end the same)."""
    if not rows:
        return 0
    quote = conn.dialect.identifier_preparer.quote
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    table = quote(schema.step_times.name)
    sql = (f"INSERT INTO {table} ({', '.join(quote(c) for c in COLUMNS)}) "
           f"VALUES ({', '.join([mark] * len(COLUMNS))}) "
           f"ON CONFLICT ({', '.join(quote(c) for c in KEY)}) DO UPDATE SET "
           + ", ".join(f"{quote(c)} = excluded.{quote(c)}"
                       for c in ("rank", "time", "seconds", "unit"))
           + f" WHERE excluded.{quote('seconds')} > {table}.{quote('seconds')}")
    for start in range(0, len(rows), BATCH_ROWS):
        conn.exec_driver_sql(sql, rows[start:start + BATCH_ROWS])
    return len(rows)


def _bounded_lines(fh: IO[bytes], limits: Limits, report: IngestReport,
                   where: str, budget: _Budget | None = None) -> Iterator[tuple[int, str]]:
    """(line number, text) of at most max_lines lines, each cut at max_line_bytes: a longer
    line is reported and skipped (its tail read and dropped in blocks, never held). `budget`:
    the pass's lines left; this file stops where it runs out."""
    lineno = 0
    while True:
        if budget is not None and budget.left <= 0:
            if fh.readline(1):  # more was there: the pass's budget, not the file, ended it
                spent = budget if budget.parent is None or budget.parent.left > 0 \
                    else budget.parent
                spent.spent_in = where.rstrip(": ") or "the input"
                if spent is budget and budget.parent is not None:
                    report.add_bad(0, f"{where}its owner's share of the pass's lines spent: "
                                      "the rest was not read (the next pass reads it again)")
            return
        raw = fh.readline(limits.max_line_bytes + 1)
        if not raw:
            return
        if budget is not None:
            budget.spend()
        lineno += 1
        if lineno > limits.max_lines:
            report.add_bad(lineno, f"{where}more than {limits.max_lines} lines: the rest "
                                   "was not read")
            return
        if len(raw) > limits.max_line_bytes and not raw.endswith(b"\n"):
            skipped = len(raw)
            while raw and not raw.endswith(b"\n") and skipped <= MAX_SKIP_BYTES:
                raw = fh.readline(1 << 16)
                skipped += len(raw)
            if raw and not raw.endswith(b"\n"):
                # no line end in sight (a sparse file of zeros, terabytes long): the file, not
                # the line, is refused; read past, it took every pass hours
                report.add_bad(lineno, f"{where}no line end within {skipped} bytes: the rest "
                                       "of the file was not read")
                return
            report.add_bad(lineno, f"{where}longer than {limits.max_line_bytes} bytes")
            continue
        text = raw.decode("utf-8", errors="replace")
        report.replaced += text.count("\ufffd")
        yield lineno, text


ANOTHER_USERS_JOB = "another user's job"
JOB_NOT_KNOWN_YET = "job not known yet"
OWNER_UNKNOWN = "file owner has no name here"
WRITABLE_BY_OTHERS = "file others may write"


class _OwnerFilter:
    """Keeps the rows of `owner`'s own jobs (sacct's User), for one file: a row's job is the
    job with its id that ran on its node (job_nodes), the one the detector judges it in. By
    the id alone, a user whose job 502 ran on one cluster of the historian could write step
    times for another user's job 502 on another cluster (or an older job 502 of theirs, for
    a later one's): the nodes of someone else's job made suspects. The users of each (job id,
    node) are asked once a load; a job id with no job on the row's node yet (sacct brings
    running jobs an ingest later) waits for a later pass, as an unknown one does."""

    def __init__(self, owner: str | None, users: dict[tuple[str, str], set[str]],
                 refused: str = OWNER_UNKNOWN):
        self.owner, self.users, self.refused = owner, users, refused

    def __call__(self, conn, rows: list[tuple], report: IngestReport) -> list[tuple]:
        if self.owner is None:
            report.skip(self.refused, len(rows))
            return []
        j, jn = schema.jobs, schema.job_nodes
        asked = {k[0] for k in self.users}
        ask = sorted({r[0] for r in rows} - asked)
        for start in range(0, len(ask), 500):
            part = ask[start:start + 500]
            for k in part:
                self.users[(k, "")] = set()  # asked: its (job, node) pairs follow
            q = (select(j.c.job_id, jn.c.node, j.c.user)
                 .select_from(j.join(jn, jn.c.job_pk == j.c.id)).where(j.c.job_id.in_(part)))
            for job_id, node, user in conn.execute(q):
                self.users.setdefault((job_id, node), set()).add(user)
        kept = []
        for row in rows:
            users = self.users.get((row[0], row[4]))
            if not users:
                report.skip(JOB_NOT_KNOWN_YET)
            elif self.owner not in users:
                report.skip(ANOTHER_USERS_JOB)
            else:
                kept.append(row)
        return kept


def _others_may_write(st: os.stat_result, trusted: set[int]) -> bool:
    """A file anyone may write (o+w), or root's or the historian's own that a group of users
    may write (g+w, its group not root's nor the historian's): whose words it holds, its owner
    cannot say. A world-writable file is how a job's prolog might hand root's drop file to a
    job; every other user can then append lines naming any job."""
    if st.st_mode & stat.S_IWOTH:
        return True
    return (st.st_uid in trusted and bool(st.st_mode & stat.S_IWGRP)
            and st.st_gid not in (0, os.getegid()))


def _owner_name(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def _load(engine: Engine, lines: Iterable[tuple[int, str]], report: IngestReport, where: str,
          keep: _OwnerFilter | None = None) -> None:
    """Parse outside any transaction; write each batch in its own (the upsert keeps the
    slowest rank, so a pass cut short is finished by the next): one pass over millions of
    lines held SQLite's write lock for its whole read, and the suspects pass's writes failed
    with "database is locked"."""
    batch: list[tuple] = []
    received = datetime.now(UTC).replace(tzinfo=None)

    def flush() -> None:
        nonlocal batch
        if not batch:
            return
        try:
            with writer(engine).begin() as conn:
                rows = keep(conn, batch, report) if keep is not None else batch
                report.written += _write(conn, rows)
        except SQLAlchemyError as exc:
            # the batches before are kept (each its own transaction): said, never silent
            raise StepsError(f"{where}the historian failed after {report.written} rows of "
                             f"this pass were written (kept; the next pass reads the rest "
                             f"again): {first_line(exc)}") from exc
        batch = []

    for lineno, line in lines:
        if not line.strip():
            continue
        report.read += 1
        try:
            batch.extend(parse_line(line, received))
        except RowError as exc:
            report.add_bad(lineno, f"{where}{exc}")
            continue
        if len(batch) >= BATCH_ROWS:
            flush()
    flush()


def step_files(path: Path, limits: Limits, report: IngestReport) -> list[Path]:
    """The files to read: `path` itself, or the regular *.jsonl/*.json/*.ndjson files in the
    directory (one level; by name within each owner, the owners in turn; symlinks and
    anything else refused by name)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StepsError(f"{path}: {exc.strerror or 'cannot stat'}") from exc
    if stat.S_ISREG(st.st_mode):
        return [path]
    if stat.S_ISLNK(st.st_mode):
        raise StepsError(f"{path}: a symlink, not a file: refused")
    if not stat.S_ISDIR(st.st_mode):
        raise StepsError(f"{path}: not a regular file or a directory")
    by_owner: dict[int, list[Path]] = {}
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if not entry.name.endswith(SUFFIXES):
                continue
            if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                report.add_bad(0, f"{entry.name}: not a regular file: refused")
                continue
            try:
                owner = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue  # gone since the listing
            by_owner.setdefault(owner, []).append(Path(entry.path))
    # Each owner's files in turn (the first of each, then the second, ...): a user who floods
    # the shared directory with max_files files of their own cannot push every other user's
    # files past the limit.
    queues = [by_owner[uid] for uid in sorted(by_owner)]
    files = [f for turn in itertools.zip_longest(*queues) for f in turn if f is not None]
    if len(files) > limits.max_files:
        report.add_bad(0, f"{path}: more than {limits.max_files} step files: "
                          f"{len(files) - limits.max_files} were not read (each owner's "
                          "files in turn)")
        files = files[:limits.max_files]
    return files


def ingest_path(engine: Engine, path: Path | str, limits: Limits) -> IngestReport:
    """Every step file at `path` (a file or a directory of them); each batch of lines is
    written in its own transaction (_load), the pass's lines shared fairly among the owners."""
    report = IngestReport("steps", max_bad=MAX_BAD_LISTED)
    files = step_files(Path(path), limits, report)
    trusted = {0, os.geteuid()}
    users: dict[tuple[str, str], set[str]] = {}
    budget = _Budget(limits.max_lines_per_pass)
    # Each owner a fair share of the pass (max-min): the owners with the least to read first,
    # each taking at most what is left over the owners still to come. Spent first-come in the
    # same order every pass, one user's files of garbage kept another's later files unread
    # for good; what a small owner leaves goes to the others.
    by_owner: dict[int, list[Path]] = {}
    size: dict[int, int] = {}
    for file in files:
        try:
            st0 = os.lstat(file)
        except OSError as exc:
            report.add_bad(0, f"{file.name}: {exc.strerror or exc} (gone since the listing?)")
            continue
        by_owner.setdefault(st0.st_uid, []).append(file)
        size[st0.st_uid] = size.get(st0.st_uid, 0) + st0.st_size
    order = sorted(by_owner, key=lambda u: (size[u], u))
    files = [f for u in order for f in by_owner[u]]
    shares: dict[int, _Budget] = {}
    unread = 0
    for file in files:
        if budget.left <= 0:
            unread += 1
            continue
        where = f"{file.name}: " if len(files) > 1 or file != Path(path) else ""
        try:
            fd = open_regular(file)
        except OSError as exc:
            report.add_bad(0, f"{file.name}: {exc.strerror or exc}")
            continue
        st = os.fstat(fd)
        uid = st.st_uid
        if uid not in shares:
            later = len(by_owner) - len(shares)  # this owner and those still to come
            shares[uid] = _Budget(max(1, budget.left // max(1, later)), budget)
        mine = shares[uid] if len(by_owner) > 1 else budget
        if mine.left <= 0:
            os.close(fd)
            unread += 1
            continue
        keep = (_OwnerFilter(_owner_name(uid), users)
                if limits.owner_must_match and uid not in trusted else None)
        if limits.owner_must_match and _others_may_write(st, trusted):
            # Its owner's word no more: anyone (or a group of users) may have written it.
            keep = _OwnerFilter(None, users, WRITABLE_BY_OTHERS)
        with open(fd, "rb") as fh:
            _load(engine, _bounded_lines(fh, limits, report, where, mine), report, where,
                  keep)
    _said_budget(report, limits, budget, unread)
    return report


def _said_budget(report: IngestReport, limits: Limits, budget: _Budget, unread: int) -> None:
    if budget.spent_in is None and not unread:
        return
    what = (f"the rest of {budget.spent_in}" if budget.spent_in else "") + (
        f"{' and ' if budget.spent_in else ''}{unread} more files" if unread else "")
    report.add_bad(0, f"budget of {limits.max_lines_per_pass} lines per pass (each owner a "
                      f"fair share) spent: {what} were not read (the next pass reads them "
                      "again)")


def ingest_stream(engine: Engine, fh: IO[bytes], limits: Limits) -> IngestReport:
    """JSON Lines from an open binary stream (`PATH` '-': stdin), bounded as a file is."""
    report = IngestReport("steps", max_bad=MAX_BAD_LISTED)
    budget = _Budget(limits.max_lines_per_pass)
    _load(engine, _bounded_lines(fh, limits, report, "", budget), report, "")
    _said_budget(report, limits, budget, 0)
    return report
