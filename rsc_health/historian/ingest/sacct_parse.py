"""Reading `sacct -a -X -D --parsable2` output into validated job-instance columns (Arrow).

The file is read by Arrow's CSV reader in blocks and every check and transform is an Arrow
compute kernel, or one Python call per distinct value for the columns that have few (State,
NNodes, AllocTRES, NodeList). A row that does not parse is reported with its line number
and left out; the rest of its block still lands.

The reader runs on one thread: only then does Arrow say on which line a row with the wrong
number of fields was (and Arrow's single-threaded parse is still several times faster than
pandas').
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from rsc_health import hostlist

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
)
# About 85,000 sacct rows a block: the first is parsed soon, and memory stays bounded.
BLOCK_BYTES = 16 << 20
NULL_TIMES = ("Unknown", "None", "")
NO_NODES = ("", "None assigned", "(null)", "None")  # what hostlist.expand reads as no host
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
_TIME_SHAPE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$"


class SacctError(RuntimeError):
    pass


@dataclass
class Block:
    """The job instances of one block that parsed, in JOB_COLUMNS order; the hosts of each
    NodeList they name (no-node markers left out); and the same as job_nodes rows: `row`
    (the job's row in `jobs`) and `node`."""

    jobs: pa.Table
    hosts: dict[str, list[str]]
    job_nodes: pa.Table

    def hosts_json(self) -> dict[str, str]:
        """NodeList -> its hosts as a JSON array, for the database to expand."""
        return {nodelist: json.dumps(hosts) for nodelist, hosts in self.hosts.items()}


@dataclass
class BlockProblems:
    """What one block could not take: (line, message) pairs, and rows skipped as pending."""

    bad: list[tuple[int, str]] = field(default_factory=list)
    pending: int = 0
    read: int = 0


def blocks(
    source: io.TextIOBase | Path | str,
    *,
    gpus_per_node: int,
    hosts_cache: dict[str, list[str] | None],
) -> Iterator[tuple[Block, BlockProblems]]:
    """Parse sacct output (a path, an open text file, or the text itself) block by block.

    `hosts_cache` maps NodeList -> its hosts (None: not a hostlist) across blocks;
    the caller keeps it for the whole load, so each distinct NodeList is expanded once."""
    # Rows the reader dropped for their width, by line. The reader parses ahead, so some
    # may lie past the batch in hand: each batch takes only those before its end.
    dropped: dict[int, str] = {}

    def wrong_width(row) -> str:
        wanted, saw = row.expected_columns, row.actual_columns
        dropped[row.number] = f"expected {wanted} fields, saw {saw}"
        return "skip"

    data, header = _input(source)
    missing = [f for f in FIELDS if f not in header]
    if missing:
        raise SacctError(f"sacct output lacks column(s) {', '.join(missing)}")
    try:
        reader = pcsv.open_csv(
            data,
            read_options=pcsv.ReadOptions(use_threads=False, block_size=BLOCK_BYTES),
            parse_options=pcsv.ParseOptions(
                delimiter="|",
                quote_char=False,  # sacct never quotes; a '"' in a job name is literal
                ignore_empty_lines=False,  # a blank line is a bad row with its line number
                invalid_row_handler=wrong_width,
            ),
            convert_options=pcsv.ConvertOptions(
                column_types={name: pa.string() for name in FIELDS},
                strings_can_be_null=False,
                include_columns=list(FIELDS),  # other columns are not even converted
            ),
        )
    except pa.ArrowInvalid as exc:
        raise SacctError(f"sacct output is not readable: {exc}") from exc
    next_line = 2  # line 1 is the header
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as exc:  # bytes that are not UTF-8
            raise SacctError(
                f"sacct output from line {next_line} on is not readable ({exc}); nothing was "
                "written. `iconv -f utf-8 -t utf-8 -c` drops bytes that are not UTF-8."
            ) from exc
        lines, next_line, mine = _line_numbers(next_line, batch.num_rows, dropped)
        problems = BlockProblems(
            bad=[(line, dropped.pop(line)) for line in mine], read=batch.num_rows + len(mine)
        )
        yield _validate(batch, lines, problems, gpus_per_node, hosts_cache), problems
    if dropped:  # dropped rows after the last one kept
        empty = pa.RecordBatch.from_pylist([], schema=reader.schema)
        problems = BlockProblems(bad=sorted(dropped.items()), read=len(dropped))
        yield _validate(empty, np.array([], dtype=np.int64), problems, gpus_per_node,
                        hosts_cache), problems


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


def _input(source: io.TextIOBase | Path | str) -> tuple[str | io.BytesIO, list[str]]:
    """(what Arrow reads: a path or bytes, the header's column names)."""
    if isinstance(source, Path):
        with source.open("rb") as fh:
            first = fh.readline()
        return str(source), _names(first)
    text = source if isinstance(source, str) else source.read()  # stdin: Arrow wants bytes
    data = text.encode()
    return io.BytesIO(data), _names(data[: data.find(b"\n")] if b"\n" in data else data)


def _names(header: bytes) -> list[str]:
    return header.decode("utf-8", "replace").rstrip("\r\n").split("|")


def _validate(
    batch: pa.RecordBatch,
    lines: np.ndarray,
    problems: BlockProblems,
    gpus_per_node: int,
    hosts_cache: dict[str, list[str] | None],
) -> Block:
    raw = {name: batch.column(name) for name in FIELDS}
    n = batch.num_rows
    state = _per_distinct(raw["State"], lambda text: text.split(" ", 1)[0], pa.string())
    # In order of precedence: a row is reported for the first thing wrong with it.
    checks: list[tuple[np.ndarray, str | None]] = [(_np(pc.equal(raw["JobIDRaw"], "")), None)]
    times: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in ("Submit", "Eligible", "Start", "End"):
        is_time, is_null = _time_masks(raw[name])
        times[name] = (is_time, is_null)
        checks.append((~is_time & ~is_null, name))
        if name == "Submit":
            checks.append((is_null, None))
    nnodes = _per_distinct(raw["NNodes"], _count, pa.int64())
    checks.append((_np(pc.is_null(nnodes)), "NNodes"))

    bad = np.zeros(n, dtype=bool)
    for mask, _ in checks:
        bad |= mask
    for i in np.flatnonzero(bad).tolist():
        problems.bad.append((int(lines[i]), _why(checks, raw, i)))
    pending = _np(pc.equal(state, "PENDING"))  # not an instance yet; read again once it starts
    problems.pending += int((~bad & pending).sum())
    keep = ~bad & ~pending

    # Expand each distinct NodeList once; one that is not a hostlist makes its rows bad.
    nodelists = raw["NodeList"]
    distinct = pc.unique(nodelists.filter(pa.array(keep))).to_pylist()
    for nodelist in distinct:
        if nodelist not in hosts_cache:
            hosts_cache[nodelist] = _hosts(nodelist)
    broken = [n for n in distinct if hosts_cache[n] is None]
    if broken:
        wrong = keep & _np(pc.is_in(nodelists, pa.array(broken, pa.string())))
        for i in np.flatnonzero(wrong).tolist():
            problems.bad.append(
                (int(lines[i]), f"NodeList is not a hostlist: {nodelists[i].as_py()!r}")
            )
        keep &= ~wrong
    problems.bad.sort()

    kept = pa.array(keep)
    gpus = pc.coalesce(
        _per_distinct(raw["AllocTRES"], gpus_in_tres, pa.int64()),
        pc.multiply(pc.coalesce(nnodes, 0), gpus_per_node),
    )
    start_ok = pa.array(times["Start"][0][keep])
    take = {name: col.filter(kept) for name, col in raw.items()}
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
                name.lower(): _db_time(take[name], pa.array(times[name][0][keep]))
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
        }
    )
    return Block(jobs, {n: hosts_cache[n] for n in distinct if hosts_cache[n]},
                 _job_nodes(jobs.column("nodelist"), hosts_cache))


def _job_nodes(nodelists: pa.ChunkedArray, hosts_cache: dict[str, list[str] | None]) -> pa.Table:
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


def _why(checks: list[tuple[np.ndarray, str | None]], raw: dict, i: int) -> str:
    for number, (mask, name) in enumerate(checks):
        if not mask[i]:
            continue
        if name is None:
            return "no JobIDRaw" if number == 0 else "no Submit time"
        kind = "a number" if name == "NNodes" else "a time"
        return f"{name} is not {kind}: {raw[name][i].as_py()}"
    return "unparsable row"


def _np(mask: pa.Array) -> np.ndarray:
    return mask.to_numpy(zero_copy_only=False)


def _time_masks(raw: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(is a sacct time, is a no-time marker) per row. A time is exactly sacct's form,
    `YYYY-MM-DDTHH:MM:SS`, and a real date and time."""
    is_null = _np(pc.is_in(raw, pa.array(NULL_TIMES)))
    shaped = pc.and_(pc.equal(pc.utf8_length(raw), 19), pc.equal(pc.find_substring(raw, "T"), 10))
    try:  # Arrow's ISO 8601 cast is strict (no Feb 30, no hour 24) but raises on the first bad
        pc.cast(pc.if_else(shaped, raw, pa.scalar(None, pa.string())), pa.timestamp("s"))
    except pa.ArrowInvalid:
        return _strict_time_mask(raw), is_null
    return _np(shaped), is_null


def _strict_time_mask(raw: pa.Array) -> np.ndarray:
    """Row by row, for a block with a value that is not a time: Arrow's strptime alone would
    take a leading blank and roll Feb 30 to Mar 1, hence the shape and the day checks."""
    parsed = pc.strptime(raw, format=_SACCT_TIME, unit="s", error_is_null=True)
    day = pc.utf8_lpad(pc.cast(pc.day(parsed), pa.string()), 2, "0")
    is_time = pc.and_kleene(
        pc.match_substring_regex(raw, _TIME_SHAPE),
        pc.equal(pc.utf8_slice_codeunits(raw, 8, 10), day),
    )
    return _np(pc.fill_null(is_time, False))


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
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return None
        return int(value) if value.is_integer() else None


_GPU_UNTYPED = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_GPU_TYPED = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)")


def gpus_in_tres(tres: str) -> int | None:
    """GPUs in an AllocTRES string: `gres/gpu=N`, else the sum of `gres/gpu:<type>=N`."""
    m = _GPU_UNTYPED.search(tres)
    if m:
        return int(m.group(1))
    typed = _GPU_TYPED.findall(tres)
    return sum(int(n) for n in typed) if typed else None


def _hosts(nodelist: str) -> list[str] | None:
    """The hosts a NodeList names, each once; None when it is not a hostlist. A plain name is
    itself (as stored before), a no-node marker none."""
    if nodelist in NO_NODES:
        return []
    if not _is_range(nodelist):
        return [nodelist]
    try:
        # One string per host name however many NodeLists name it: a year of a large
        # cluster has hundreds of thousands of NodeLists over a few thousand hosts.
        return [sys.intern(host) for host in dict.fromkeys(_expand(nodelist))]
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
