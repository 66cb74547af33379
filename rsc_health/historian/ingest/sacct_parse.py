"""Reading sacct output into validated job-instance columns (Arrow).

Two forms are read, told apart by their first byte:
- `sacct --json` (what `ingest sacct` runs where the release has it): structured, so no
  delimiter or newline in a job name can shift a field. Its "line" numbers are record numbers.
- `sacct -a -X -D --parsable2`, with `|` or the unit separator (`--delimiter=$'\x1f'`) as
  delimiter, columns matched by header name. sacct never quotes, so a name holding the
  delimiter has surplus fields, and a name holding a newline is printed as two physical lines:
  rows of the wrong width are put back together afterwards (physical lines joined until the
  width is right; surplus fields are the job name's, the only free text). What cannot be put
  back is reported with its line.

Bytes that are not UTF-8 become U+FFFD and are counted (`BlockProblems.replaced`): a Latin-1
job name must not stop a nightly load. Values too long for their column, counts past any
real cluster (an AllocTRES of 10^22 GPUs) and NodeLists naming more than MAX_HOSTS hosts make
their row bad, reported with its line, without expanding anything.

The parsable file is read by Arrow's CSV reader in blocks and every check and transform is an
Arrow compute kernel, or one Python call per distinct value for the columns that have few
(State, NNodes, AllocTRES, NodeList).

The reader runs on one thread: only then does Arrow say on which line a row with the wrong
number of fields was (and Arrow's single-threaded parse is still several times faster than
pandas').
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from rsc_health import hostlist
from rsc_health.spool import without_lone_surrogates

FIELDS = (
    "JobIDRaw",
    "JobID",
    "JobName",
    "User",
    "Partition",
    "State",
    "ExitCode",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "NNodes",
    "NodeList",
    "AllocTRES",
)
JOB_COLUMNS = (
    "job_id",
    "job_id_display",
    "name",
    "user",
    "partition",
    "state",
    "exit_code",
    "submit",
    "eligible",
    "start",
    "end",
    "nnodes",
    "gpus",
    "nodelist",
    "instance_key",
    "cluster",
)
# Optional columns read when present.
OPTIONAL_FIELDS = ("Cluster",)
# About 85,000 sacct rows a block: the first is parsed soon, and memory stays bounded.
BLOCK_BYTES = 16 << 20
NULL_TIMES = ("Unknown", "None", "")
NO_NODES = ("", "None assigned", "(null)", "None")  # what hostlist.expand reads as no host
# A NodeList (or NNodes) naming more hosts than this is garbage, reported, and never expanded
# (the bound the operator's hostlists have too).
MAX_HOSTS = hostlist.MAX_HOSTS
# The jobs table's integer columns are 32-bit on both databases.
MAX_COUNT = 2**31 - 1
# GPUs a job can hold: more than any cluster has (16.7 M). A count near 2**31 fit the column
# but not the metrics' arithmetic on it (the size bucket, ((gpus + 7) // 8) * 8, overflowed
# PostgreSQL's integer: `healthctl mttf` and the whole Prometheus export failed on one row).
MAX_GPUS = 2**24
# Longest value each text column holds (schema.jobs); a longer one makes its row bad rather
# than failing the whole load on PostgreSQL.
MAX_WIDTH = {"JobIDRaw": 32, "JobID": 64, "User": 64, "Partition": 64, "ExitCode": 16}
MAX_STATE = 24
MAX_HOST_NAME = 128
# Wrong-width rows kept for putting back together; past this many bytes of them, the rest are
# reported without being kept (a file that is all garbage must not fill memory).
MAX_DROPPED_BYTES = 64 << 20
# A job instance that ran longer than this is a wrong clock's (Slurm's largest time limits
# are days or weeks; a year is none).
MAX_RUNTIME_DAYS = 366
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
_TIME_SHAPE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$"
_DELIMITERS = ("\x1f", "|")
_UTF8_REPLACEMENT = "\ufffd".encode()


class SacctError(RuntimeError):
    pass


@dataclass
class Block:
    """The job instances of one block that parsed, in JOB_COLUMNS order (`cluster` is ''
    where the input names none); the hosts of each NodeList they name (no-node markers
    left out); and the same as job_nodes rows: `row` (the job's row in `jobs`) and `node`."""

    jobs: pa.Table
    hosts: dict[str, list[str]]
    job_nodes: pa.Table
    # submit, eligible, start, end as parsed while checking them (timestamp[s], null for no
    # time), in the rows of `jobs`: what PostgreSQL's binary COPY sends, without parsing the
    # text form in `jobs` a second time.
    times: dict[str, pa.Array] = field(default_factory=dict)

    def hosts_json(self) -> dict[str, str]:
        """NodeList -> its hosts as a JSON array, for the database to expand."""
        return {nodelist: json.dumps(hosts) for nodelist, hosts in self.hosts.items()}


@dataclass
class BlockProblems:
    """What one block could not take: (line, message) pairs, rows skipped as pending, and
    undecodable bytes replaced by U+FFFD."""

    bad: list[tuple[int, str]] = field(default_factory=list)
    pending: int = 0
    steps: int = 0  # of `pending`, the job steps (`1234.batch`)
    read: int = 0
    replaced: int = 0


def blocks(
    source: io.IOBase | Path | str | bytes,
    *,
    gpus_per_node: int,
    hosts_cache: dict[str, list[str] | str],
    exit_codes: dict[str, str] | None = None,
    text_times: bool = True,
) -> Iterator[tuple[Block, BlockProblems]]:
    """Parse sacct output (a path, an open file, the text or the bytes) block by block.

    `hosts_cache` maps NodeList -> its hosts (a str: why it is not a usable hostlist) across
    blocks; the caller keeps it for the whole load, so each distinct NodeList is expanded once.
    `exit_codes` (instance key -> ExitCode, see `exit_codes`) overrides what --json says.
    `text_times`: the times in `Block.jobs` as the text SQLite stores; False, only as
    `Block.times` (PostgreSQL's COPY sends those; building the text would be wasted)."""
    raw = _open_bytes(source)
    validate = partial(_validate, gpus_per_node=gpus_per_node, hosts_cache=hosts_cache,
                       text_times=text_times)
    try:
        if _starts_json(raw):
            yield from _json_blocks(raw.read(), validate, exit_codes or {})
            return
        yield from _parsable_blocks(raw, validate)
    finally:
        if not isinstance(source, io.IOBase):
            raw.close()


def _starts_json(raw: io.BufferedReader) -> bool:
    return raw.peek(4096)[:4096].lstrip()[:1] in (b"{", b"[")


def _open_bytes(source) -> io.BufferedReader:
    """A buffered binary reader over any of the accepted sources (stdin: its bytes, so a
    Latin-1 name is replaced here rather than failing Python's strict decoding)."""
    if isinstance(source, Path):
        return open(source, "rb")  # noqa: SIM115 -- closed by blocks()
    if isinstance(source, bytes):
        return io.BufferedReader(io.BytesIO(source))
    if isinstance(source, str):
        try:
            data = source.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = source.encode("utf-8", "replace")
        return io.BufferedReader(io.BytesIO(data))
    buffer = getattr(source, "buffer", None)
    if buffer is not None:
        return buffer if hasattr(buffer, "peek") else io.BufferedReader(buffer)
    if isinstance(source, io.TextIOBase):
        return _open_bytes(source.read())
    return source if hasattr(source, "peek") else io.BufferedReader(source)


class _Utf8Repair(io.RawIOBase):
    """What Arrow reads: the input's bytes, whole lines at a time, with bytes that are not
    UTF-8 replaced by U+FFFD and counted. Clean input costs one validating decode per chunk."""

    def __init__(self, raw: io.BufferedReader, prefix: bytes = b"", chunk: int = 4 << 20):
        self.raw, self.chunk = raw, chunk
        self.pending = prefix
        self.out = b""
        self.replaced = 0
        self.eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.out and not (self.eof and not self.pending):
            self._fill()
        n = min(len(buffer), len(self.out))
        buffer[:n] = self.out[:n]
        self.out = self.out[n:]
        return n

    def _fill(self) -> None:
        data = self.pending + (b"" if self.eof else self.raw.read(self.chunk))
        if not self.eof and len(data) == len(self.pending):
            self.eof = True
        cut = len(data) if self.eof else data.rfind(b"\n") + 1
        if cut == 0:  # no newline yet: keep reading (a kilobyte-long line is fine)
            self.pending = data
            return
        piece, self.pending = data[:cut], data[cut:]
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            fixed = piece.decode("utf-8", "replace").encode()
            self.replaced += fixed.count(_UTF8_REPLACEMENT) - piece.count(_UTF8_REPLACEMENT)
            piece = fixed
        if b"\x00" in piece:
            # PostgreSQL text cannot hold NUL: replaced (and counted) on every database alike.
            self.replaced += piece.count(b"\x00")
            piece = piece.replace(b"\x00", _UTF8_REPLACEMENT)
        self.out = piece


def _parsable_blocks(raw, validate: Callable[..., Block]):
    header_bytes = raw.readline()
    header_text = header_bytes.decode("utf-8", "replace").rstrip("\r\n")
    delimiter = next((d for d in _DELIMITERS if d in header_text), "|")
    header = header_text.split(delimiter)
    missing = [f for f in FIELDS if f not in header]
    if missing:
        raise SacctError(f"sacct output lacks column(s) {', '.join(missing)}")
    wanted = [*FIELDS, *(f for f in OPTIONAL_FIELDS if f in header)]
    # Rows the reader dropped for their width, by line: numbering the rows kept needs them,
    # and they are put back together (or reported) after the last block.
    dropped: dict[int, str] = {}
    texts: dict[int, str | None] = {}  # every dropped line: its text; None past the cap
    kept_bytes = 0

    def wrong_width(row) -> str:
        nonlocal kept_bytes
        dropped[row.number] = ""
        texts[row.number] = row.text if kept_bytes < MAX_DROPPED_BYTES else None
        kept_bytes += len(row.text)
        return "skip"

    data = _Utf8Repair(raw, prefix=header_bytes)
    try:
        reader = pcsv.open_csv(
            data,
            read_options=pcsv.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
            parse_options=pcsv.ParseOptions(
                delimiter=delimiter,
                quote_char=False,  # sacct never quotes; a '"' in a job name is literal
                ignore_empty_lines=False,  # a blank line may be part of a job name
                invalid_row_handler=wrong_width,
            ),
            convert_options=pcsv.ConvertOptions(
                column_types={name: pa.string() for name in wanted},
                strings_can_be_null=False,
                include_columns=wanted,  # other columns are not even converted
            ),
        )
    except pa.ArrowInvalid as exc:
        raise SacctError(f"sacct output is not readable: {exc}") from exc
    next_line = 2  # line 1 is the header
    replaced = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as exc:  # not expected once the bytes are repaired
            raise SacctError(
                f"sacct output from line {next_line} on is not readable ({exc})"
            ) from exc
        lines, next_line, mine = _line_numbers(next_line, batch.num_rows, dropped)
        for line in mine:
            dropped.pop(line)
        # Arrow reads a blank line as a row of empty fields; it may be part of a job name
        # (sacct prints "a\n\nb" as three lines), so it joins the rows put back together.
        blank = _blank_rows(batch)
        if blank.any():
            texts.update(dict.fromkeys(lines[blank].tolist(), ""))
            batch, lines = batch.filter(pa.array(~blank)), lines[~blank]
        problems = BlockProblems(read=batch.num_rows, replaced=data.replaced - replaced)
        replaced = data.replaced
        yield validate(batch, lines, problems), problems
    if texts:
        names = header
        records, bad = _reassemble(texts, names, delimiter)
        problems = BlockProblems(bad=bad, read=len(records) + len(bad),
                                 replaced=data.replaced - replaced)
        batch = pa.RecordBatch.from_pydict(
            {name: pa.array([r[names.index(name)] for _, r in records], pa.string())
             for name in wanted}
        )
        lines = np.array([line for line, _ in records], dtype=np.int64)
        yield validate(batch, lines, problems), problems


def _blank_rows(batch: pa.RecordBatch) -> np.ndarray:
    blank = pc.equal(pc.utf8_length(batch.column(0)), 0)
    for column in batch.columns[1:]:
        blank = pc.and_(blank, pc.equal(pc.utf8_length(column), 0))
    return _np(blank)


def _reassemble(
    texts: dict[int, str | None], header: list[str], delimiter: str
) -> tuple[list[tuple[int, list[str]]], list[tuple[int, str]]]:
    """Rows of the wrong width -> (records put back together, (line, why) for the rest).

    Consecutive physical lines are joined with the newline sacct printed until the fields
    add up; surplus fields go into JobName, the one free-text column (when the header has
    another free-text column, surplus cannot be placed and the row is reported)."""
    width = len(header)
    name_at = header.index("JobName")
    free_text = [h for h in header if h in _FREE_TEXT]
    records: list[tuple[int, list[str]]] = []
    bad: list[tuple[int, str]] = []
    lines = sorted(texts)
    i = 0
    while i < len(lines):
        first = lines[i]
        text = texts[first]
        if text is None:
            bad.append((first, "a row of the wrong width, past the bytes kept for repair"))
            i += 1
            continue
        j = i
        while text.count(delimiter) + 1 < width and j + 1 < len(lines) \
                and lines[j + 1] == lines[j] + 1 and texts[lines[j + 1]] is not None:
            j += 1
            text = text + "\n" + texts[lines[j]]
        fields = text.split(delimiter)
        if len(fields) > width and free_text == ["JobName"]:
            surplus = len(fields) - width
            fields = [*fields[:name_at], delimiter.join(fields[name_at : name_at + surplus + 1]),
                      *fields[name_at + surplus + 1 :]]
        if len(fields) == width:
            records.append((first, fields))
        else:
            span = f"lines {first}-{lines[j]}" if j > i else ""
            bad.append((first, f"expected {width} fields, saw {len(fields)}"
                               + (f" ({span} joined)" if span else "")))
        i = j + 1
    return records, bad


# sacct columns that hold a user's text (the rest are ids, names Slurm checks, times, numbers).
_FREE_TEXT = {"JobName", "Comment", "AdminComment", "SystemComment", "Reason", "WorkDir",
              "Constraints", "WCKey", "Reservation", "SubmitLine", "Container"}


def exit_codes(data: bytes) -> dict[str, str]:
    """`sacct -n --parsable2 --format=JobIDRaw,Submit,Start,ExitCode` (any delimiter of
    _DELIMITERS) -> instance key -> ExitCode."""
    out: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        delimiter = next((d for d in _DELIMITERS if d in line), "|")
        fields = line.split(delimiter)
        if len(fields) != 4 or fields[0] == "JobIDRaw":
            continue
        job_id, submit, start, code = fields
        start = start if re.fullmatch(_TIME_SHAPE[1:-1], start) else ""
        out[f"{job_id}:{submit}:{start}"] = code
    return out


def _json_blocks(data: bytes, validate: Callable[..., Block], codes: dict[str, str]):
    """`sacct --json` (data_parser v0.0.38 of 22.05 and the later forms) -> one block."""
    try:
        text = data.decode("utf-8")
        replaced = 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", "replace")
        replaced = text.count("\ufffd") - data.count(_UTF8_REPLACEMENT)
    if "\\u0000" in text or "\x00" in text:
        # NUL, escaped or raw: PostgreSQL text cannot hold it (replaced and counted).
        replaced += text.count("\\u0000") + text.count("\x00")
        text = text.replace("\\u0000", "\\ufffd").replace("\x00", "\ufffd")
    try:
        document = json.loads(text)
        if "\\ud" in text or "\\uD" in text:
            # Escaped lone surrogates no database can store (a valid pair is one character
            # once loaded and stays).
            document = without_lone_surrogates(document)
    except (ValueError, RecursionError) as exc:
        raise SacctError(f"sacct --json output is not JSON: {str(exc)[:200]}") from exc
    jobs = document.get("jobs") if isinstance(document, dict) else document
    if not isinstance(jobs, list):
        raise SacctError("sacct --json output has no list of jobs")
    problems = BlockProblems(read=len(jobs), replaced=replaced)
    columns: dict[str, list[str]] = {name: [] for name in (*FIELDS, *OPTIONAL_FIELDS)}
    lines = []
    for number, job in enumerate(jobs, 1):
        try:
            row = _json_row(job)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
            problems.bad.append((number, f"job record {number}: {type(exc).__name__}: {exc}"[:300]))
            continue
        start = row["Start"] if re.fullmatch(_TIME_SHAPE[1:-1], row["Start"]) else ""
        row["ExitCode"] = codes.get(f"{row['JobIDRaw']}:{row['Submit']}:{start}",
                                    row["ExitCode"])
        for name in columns:
            columns[name].append(row[name])
        lines.append(number)
    batch = pa.RecordBatch.from_pydict({k: pa.array(v, pa.string()) for k, v in columns.items()})
    yield validate(batch, np.array(lines, dtype=np.int64), problems), problems


# The one word sacct's text prints for a state with flags, as Slurm's job_state_string()
# (src/common/slurm_protocol_defs.c) picks it: the first of these flags set, in this order,
# else the base state. A requeued instance is stored as JOB_REQUEUE over base state PENDING:
# 23.02's JSON says ["PENDING", "REQUEUED"] where --parsable2 (and 22.05's JSON) say REQUEUED.
_SHOWN_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED",
                "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED",
                "RESV_DEL_HOLD", "SIGNALING")


def _json_row(job: dict) -> dict[str, str]:
    """One job of `sacct --json` as the text sacct --parsable2 would print for it."""
    array = job.get("array") or {}
    het = job.get("het") or {}
    job_id = str(_number(job["job_id"]))
    task = _number(array.get("task_id"))
    offset = _number(het.get("job_offset"))
    if task is not None:
        display = f"{_number(array.get('job_id'))}_{task}"
    elif offset is not None and _number(het.get("job_id")):
        display = f"{_number(het.get('job_id'))}+{offset}"
    else:
        display = job_id
    state = job.get("state") or {}
    current = state.get("current") if isinstance(state, dict) else state
    if isinstance(current, list):  # 23.02 on: the base state, then any flags set
        current = next((f for f in _SHOWN_FLAGS if f in current), current[0] if current else "")
    exit_code = job.get("exit_code") or {}
    times = job.get("time") or {}
    tres = (job.get("tres") or {}).get("allocated") or []
    nodes = job.get("nodes")
    return {
        "JobIDRaw": job_id,
        "JobID": display,
        "JobName": str(job.get("name") or ""),
        "User": str(job.get("user") or ""),
        "Partition": str(job.get("partition") or ""),
        "State": str(current or ""),
        "ExitCode": _exit_code(exit_code),
        "Submit": _json_time(times.get("submission")),
        "Eligible": _json_time(times.get("eligible")),
        "Start": _json_time(times.get("start")),
        "End": _json_time(times.get("end")),
        "NNodes": str(_number(job.get("allocation_nodes")) or 0),
        "NodeList": str(nodes) if nodes not in (None, "") else "None assigned",
        "AllocTRES": ",".join(
            f"{t.get('type')}/{t['name']}={_number(t.get('count'))}" if t.get("name")
            else f"{t.get('type')}={_number(t.get('count'))}"
            for t in tres if _number(t.get("count")) is not None
        ),
        "Cluster": str(job.get("cluster") or ""),
    }


def _number(value):
    """An int from the JSON's number forms: 5, or {"set": true, "number": 5} (later releases);
    None when unset."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    return int(value)


def _exit_code(code) -> str:
    """--json's exit code as sacct's "code:signal". The signal is {"signal_id": 9} in 22.05,
    {"id": {"set": true, "number": 9}} from 23.02 on."""
    if not isinstance(code, dict):
        return str(code or "")
    signal = code.get("signal") or {}
    if isinstance(signal, dict):
        signal = signal.get("signal_id", signal.get("id"))
    sig = _number(signal) or 0
    return f"{_number(code.get('return_code')) or 0}:{sig}"


def _json_time(value) -> str:
    """Epoch seconds -> sacct's UTC text; 0 or unset -> Unknown; out of range -> the number
    itself, which the time check then reports."""
    seconds = _number(value)
    if not seconds:
        return "Unknown"
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime(_SACCT_TIME)
    except (OverflowError, OSError, ValueError):
        return str(seconds)


def _line_numbers(
    first: int, rows: int, dropped: dict[int, str]
) -> tuple[np.ndarray, int, list[int]]:
    """(the line of each of `rows` rows from line `first` on, skipping dropped lines; the
    line after them and any dropped lines right after; the dropped lines passed)."""
    later = sorted(line for line in dropped if line >= first)
    span = np.arange(first, first + rows + len(later) + 1)
    lines = span[~np.isin(span, later)][:rows]
    after = int(lines[-1]) + 1 if rows else first
    while after in dropped:
        after += 1
    return lines, after, [line for line in later if line < after]


def _validate(
    batch: pa.RecordBatch,
    lines: np.ndarray,
    problems: BlockProblems,
    *,
    gpus_per_node: int,
    hosts_cache: dict[str, list[str] | str],
    text_times: bool = True,
) -> Block:
    raw = {name: batch.column(name) for name in FIELDS}
    n = batch.num_rows
    state = _per_distinct(raw["State"], lambda text: text.split(" ", 1)[0], pa.string())
    # In order of precedence: a row is reported for the first thing wrong with it.
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = [
        (_np(pc.equal(raw["JobIDRaw"], "")), lambda i: "no JobIDRaw")
    ]
    for name, limit in MAX_WIDTH.items():
        checks.append((_np(pc.greater(pc.utf8_length(raw[name]), limit)),
                       lambda i, name=name, limit=limit: f"{name} is longer than {limit} "
                       f"characters: {_short(raw[name][i].as_py())}"))
    checks.append((_np(pc.greater(pc.utf8_length(state), MAX_STATE)),
                   lambda i: f"State is longer than {MAX_STATE} characters"))
    times: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    parsed: dict[str, pa.Array] = {}
    for name in ("Submit", "Eligible", "Start", "End"):
        is_time, is_null, parsed[name] = _time_masks(raw[name])
        times[name] = (is_time, is_null)
        checks.append((~is_time & ~is_null, lambda i, name=name:
                       f"{name} is not a time: {_short(raw[name][i].as_py())}"))
        if name == "Submit":
            checks.append((is_null, lambda i: "no Submit time"))
    # Times slurmctld stamped while its clock was wrong: an End before its Start (the clock
    # stepped back while the job ran), a run longer than MAX_RUNTIME_DAYS (a Start from a
    # clock reset to a far past, an End from the clock put right). Either would be node-days
    # no job ran: one 32-node job from a clock reset to 2000 took r_f to 0.01.
    both = times["Start"][0] & times["End"][0]
    secs = {name: pc.fill_null(pc.cast(parsed[name], pa.int64()), 0).to_numpy(
        zero_copy_only=False) for name in ("Start", "End")}
    ran = np.where(both, secs["End"] - secs["Start"], 0)
    checks.append((ran < 0, lambda i: f"End is before Start by {-int(ran[i])} s: slurmctld's "
                                      "clock stepped back while the job ran"))
    checks.append((ran > MAX_RUNTIME_DAYS * 86400, lambda i: f"ran {int(ran[i]) // 86400} "
                   f"days (more than {MAX_RUNTIME_DAYS}): a Start or End from a clock that was "
                   "reset"))
    nnodes = _per_distinct(raw["NNodes"], _count, pa.int64())
    checks.append((_np(pc.is_null(nnodes)), lambda i:
                   f"NNodes is not a number of nodes (0 to {MAX_HOSTS}): "
                   f"{_short(raw['NNodes'][i].as_py())}"))
    tres_gpus = _per_distinct(raw["AllocTRES"], _gpus_or_flag, pa.int64())
    checks.append((_np(pc.fill_null(pc.equal(tres_gpus, -1), False)), lambda i:
                   f"AllocTRES GPU count is out of range: {_short(raw['AllocTRES'][i].as_py())}"))

    bad = np.zeros(n, dtype=bool)
    for mask, _ in checks:
        bad |= mask
    for i in np.flatnonzero(bad).tolist():
        problems.bad.append((int(lines[i]), next(why(i) for mask, why in checks if mask[i])))
    pending = _np(pc.equal(state, "PENDING"))  # not an instance yet; read again once it starts
    # A step (`1234.batch`, `1234.0`: sacct without -X) is part of its job's instance, not one.
    step = _np(pc.match_substring(raw["JobIDRaw"], "."))
    pending |= step
    problems.pending += int((~bad & pending).sum())
    problems.steps += int((~bad & step).sum())
    keep = ~bad & ~pending

    # Expand each distinct NodeList once; one that is not a usable hostlist makes its rows bad.
    nodelists = raw["NodeList"]
    distinct = pc.unique(nodelists.filter(pa.array(keep))).to_pylist()
    for nodelist in distinct:
        if nodelist not in hosts_cache:
            hosts_cache[nodelist] = expand_nodelist(nodelist)
    broken = [n for n in distinct if isinstance(hosts_cache[n], str)]
    if broken:
        wrong = keep & _np(pc.is_in(nodelists, pa.array(broken, pa.string())))
        for i in np.flatnonzero(wrong).tolist():
            problems.bad.append((int(lines[i]), hosts_cache[nodelists[i].as_py()]))
        keep &= ~wrong
    problems.bad.sort()

    kept = pa.array(keep)
    gpus = pc.coalesce(tres_gpus, pc.multiply(pc.coalesce(nnodes, 0), gpus_per_node))
    start_ok = pa.array(times["Start"][0][keep])
    take = {name: col.filter(kept) for name, col in raw.items()}
    typed_times = {name.lower(): column.filter(kept) for name, column in parsed.items()}
    cluster = (batch.column("Cluster").filter(kept) if "Cluster" in batch.schema.names
               else pa.array([""] * int(keep.sum()), pa.string()))
    jobs = pa.table(
        {
            "job_id": take["JobIDRaw"],
            "job_id_display": take["JobID"],
            "name": take["JobName"],
            "user": take["User"],
            "partition": take["Partition"],
            "state": state.filter(kept),
            "exit_code": take["ExitCode"],
            **{
                name.lower(): (_db_time(take[name], pa.array(times[name][0][keep]))
                               if text_times else typed_times[name.lower()])
                for name in ("Submit", "Eligible", "Start", "End")
            },
            "nnodes": nnodes.filter(kept),
            "gpus": gpus.filter(kept),
            "nodelist": take["NodeList"],
            # "<JobIDRaw>:<Submit>:<Start or ''>" as sacct wrote them
            "instance_key": pc.binary_join_element_wise(
                take["JobIDRaw"],
                take["Submit"],
                pc.if_else(start_ok, take["Start"], ""),
                ":",
            ),
            "cluster": cluster,
        }
    )
    usable = {n: hosts_cache[n] for n in distinct if not isinstance(hosts_cache[n], str)}
    return Block(jobs, {n: h for n, h in usable.items() if h},
                 _job_nodes(jobs.column("nodelist"), hosts_cache),
                 typed_times)


def _short(value, limit: int = 80) -> str:
    """A value for a message: as is when short and printable, else quoted and cut."""
    text = str(value) if str(value).isprintable() else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


def _job_nodes(nodelists: pa.ChunkedArray, hosts_cache: dict[str, list[str] | str]) -> pa.Table:
    """(row, node) for every host of every job: each distinct NodeList's hosts taken per row
    and flattened, all in Arrow."""
    encoded = pc.dictionary_encode(nodelists.combine_chunks())
    per_value = pa.array(
        [hosts_cache[n] for n in encoded.dictionary.to_pylist()], pa.list_(pa.string())
    )
    per_row = pc.take(per_value, encoded.indices)
    return pa.table(
        {"row": pc.list_parent_indices(per_row).cast(pa.int64()), "node": pc.list_flatten(per_row)}
    )


def _np(mask: pa.Array) -> np.ndarray:
    return mask.to_numpy(zero_copy_only=False)


def _time_masks(raw: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(is a sacct time, is a no-time marker, the time or null) per row. A time is exactly
    sacct's form, `YYYY-MM-DDTHH:MM:SS`, and a real date and time."""
    is_null = _np(pc.is_in(raw, pa.array(NULL_TIMES)))
    shaped = pc.and_(pc.equal(pc.utf8_length(raw), 19), pc.equal(pc.find_substring(raw, "T"), 10))
    try:  # Arrow's ISO 8601 cast is strict (no Feb 30, no hour 24) but raises on the first bad
        parsed = pc.cast(pc.if_else(shaped, raw, pa.scalar(None, pa.string())),
                         pa.timestamp("s"))
    except pa.ArrowInvalid:
        is_time, parsed = _strict_times(raw)
        return is_time, is_null, parsed
    return _np(shaped), is_null, parsed


def _strict_times(raw: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Row by row, for a block with a value that is not a time: Arrow's strptime alone would
    take a leading blank and roll Feb 30 to Mar 1, hence the shape and the day checks."""
    parsed = pc.strptime(raw, format=_SACCT_TIME, unit="s", error_is_null=True)
    day = pc.utf8_lpad(pc.cast(pc.day(parsed), pa.string()), 2, "0")
    is_time = pc.fill_null(pc.and_kleene(
        pc.match_substring_regex(raw, _TIME_SHAPE),
        pc.equal(pc.utf8_slice_codeunits(raw, 8, 10), day),
    ), False)
    return _np(is_time), pc.if_else(is_time, parsed, pa.scalar(None, pa.timestamp("s")))


def _db_time(raw: pa.Array, is_time: pa.Array) -> pa.Array:
    """sacct's "2024-03-01T08:00:00" -> "2024-03-01 08:00:00.000000" (SQLAlchemy's stored
    form, which PostgreSQL parses too); null for Unknown/None."""
    text = pc.utf8_replace_slice(pc.utf8_replace_slice(raw, 10, 11, " "), 19, 19, ".000000")
    return pc.if_else(is_time, text, pa.scalar(None, pa.string()))


def _per_distinct(column: pa.Array, fn, type_: pa.DataType) -> pa.Array:
    """fn over a column with few distinct values, once per value."""
    encoded = pc.dictionary_encode(column)
    mapped = pa.array([fn(v) for v in encoded.dictionary.to_pylist()], type=type_)
    return pc.take(mapped, encoded.indices)


def _count(text: str) -> int | None:
    """NNodes: a whole number from 0 to MAX_HOSTS, else None."""
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            return None
        if not number.is_integer():
            return None
        value = int(number)
    return value if 0 <= value <= MAX_HOSTS else None


_GPU_UNTYPED = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_GPU_TYPED = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)")


def gpus_in_tres(tres: str) -> int | None:
    """GPUs in an AllocTRES string: `gres/gpu=N`, else the sum of `gres/gpu:<type>=N`.
    ValueError for a count no job can have (MAX_GPUS)."""
    m = _GPU_UNTYPED.search(tres)
    if m:
        count = int(m.group(1))
    else:
        typed = _GPU_TYPED.findall(tres)
        if not typed:
            return None
        count = sum(int(n) for n in typed)
    if count > MAX_GPUS:
        raise ValueError(f"{count} GPUs")
    return count


def _gpus_or_flag(tres: str) -> int | None:
    """gpus_in_tres, with -1 for a count out of range (the row is then reported)."""
    try:
        return gpus_in_tres(tres)
    except ValueError:
        return -1


def expand_nodelist(nodelist: str) -> list[str] | str:
    """The hosts a NodeList names, each once; a str saying why when it is not a usable
    hostlist. A plain name is itself (as stored before), a no-node marker none."""
    if nodelist in NO_NODES:
        return []
    if not _is_range(nodelist):
        hosts = [nodelist]
    else:
        measured = _measure(nodelist)
        if measured is None:
            return f"NodeList is not a hostlist: {_short(nodelist)}"
        bound, longest = measured
        if bound > MAX_HOSTS:
            return f"NodeList names {bound:,} hosts, more than {MAX_HOSTS:,}: {_short(nodelist)}"
        if longest > MAX_HOST_NAME:  # said before any is built: 100 KB each, 100,000 of them
            return f"NodeList has a host name longer than {MAX_HOST_NAME} characters"
        try:
            # One string per host name however many NodeLists name it: a year of a large
            # cluster has hundreds of thousands of NodeLists over a few thousand hosts.
            hosts = list(map(sys.intern, dict.fromkeys(_expand(nodelist))))
        except hostlist.HostlistError:
            return f"NodeList is not a hostlist: {_short(nodelist)}"
    if max(map(len, hosts), default=0) > MAX_HOST_NAME:  # map: no Python frame per host
        return f"NodeList has a host name longer than {MAX_HOST_NAME} characters"
    return hosts


def _measure(nodelist: str) -> tuple[int, int] | None:
    """(how many hosts a NodeList names, its longest host name's length), nothing expanded
    (hostlist.measure); None when it is not a hostlist."""
    try:
        return hostlist.measure(nodelist)
    except hostlist.HostlistError:
        return None


_ONE_BRACKET = re.compile(r"([^\[\],\s]+)\[([\d,\-]+)\]")
_NUMBERS = re.compile(r"(\d+)(?:-(\d+))?")


def _expand(nodelist: str) -> list[str]:
    """hostlist.expand, with a fast path for the common `prefix[lo-hi,...]` form (a big
    file has tens of thousands of distinct ones); anything else goes to hostlist.expand."""
    whole = _ONE_BRACKET.fullmatch(nodelist)
    if whole:
        prefix, body = whole.groups()
        hosts: list[str] = []
        for piece in body.split(","):
            m = _NUMBERS.fullmatch(piece)
            if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
                return hostlist.expand(nodelist)  # its error message, or its answer
            lo, hi, width = int(m.group(1)), int(m.group(2) or m.group(1)), len(m.group(1))
            hosts.extend([f"{prefix}{n:0{width}d}" for n in range(lo, hi + 1)])
        return hosts
    return hostlist.expand(nodelist)


def _is_range(nodelist: str) -> bool:
    """A NodeList that names more than one host (or a bracketed one); the rest is one name."""
    return "[" in nodelist or "," in nodelist
