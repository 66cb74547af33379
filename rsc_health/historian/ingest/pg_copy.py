"""PostgreSQL's binary COPY format, built from Arrow columns with no Python loop per row.

psycopg's `write_row` formats every value in Python (about 1.3 s of a 300k-row sacct load),
and the text format makes the server parse every timestamp from text (about 1 s more). The
binary format needs no escaping either: a tab, a backslash, a newline or `\\N` in a job name
is just its bytes, where the text format would read them as a field end, an escape, a row end
or NULL.

The format (PostgreSQL docs, COPY, "Binary Format"): a signature; per row an int16 field
count, then per field an int32 byte length (-1 for NULL) and that many bytes; an int16 -1 at
the end. Numbers are big-endian; a `timestamp` is int64 microseconds since 2000-01-01.
Each value must be the destination column's own type (int4 for an integer column, int8
for a bigint), so the caller casts its Arrow columns to match (`ARROW_FOR`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # the signature, no flags, no header extension
TRAILER = b"\xff\xff"
_NULL = pa.scalar(b"\xff\xff\xff\xff", pa.binary())
_NOTHING = pa.scalar(b"", pa.binary())
_PG_EPOCH_US = 946_684_800 * 1_000_000  # 2000-01-01T00:00:00 in Unix microseconds

# The Arrow type each PostgreSQL column type is sent from.
ARROW_FOR = {
    "text": pa.string(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "timestamp": pa.timestamp("us"),
}


@dataclass(frozen=True)
class Encoded:
    """Columns already in binary COPY form (`encoded`): per row, `count` fields one after
    another. Encoding is the costly part, so it can be done ahead, on another thread."""

    fields: pa.Array
    count: int

    def filter(self, mask: pa.Array) -> Encoded:
        return Encoded(self.fields.filter(mask), self.count)


def encoded(columns: Sequence[pa.Array | pa.ChunkedArray]) -> Encoded:
    """The rows of `columns` (equal lengths; string, int32, int64 or timestamp[us]) as
    binary COPY fields."""
    arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    if len(arrays) == 1:
        return Encoded(_field(arrays[0]), 1)
    return Encoded(pc.binary_join_element_wise(*(_field(a) for a in arrays), _NOTHING),
                   len(arrays))


def encode(columns: Sequence[pa.Array | pa.ChunkedArray | Encoded]) -> bytes:
    """Whole binary COPY data (signature, rows, trailer) from columns, some of them perhaps
    already `encoded`."""
    parts = [c if isinstance(c, Encoded) else encoded([c]) for c in columns]
    if not parts or not len(parts[0].fields):
        return SIGNATURE + TRAILER
    count = pa.scalar(np.array(sum(p.count for p in parts), ">i2").tobytes(), pa.binary())
    rows = pc.binary_join_element_wise(count, *(p.fields for p in parts), _NOTHING)
    offsets = np.frombuffer(rows.buffers()[1], np.int32, len(rows) + 1, rows.offset * 4)
    data = rows.buffers()[2][offsets[0] : offsets[-1]]
    return b"".join((SIGNATURE, memoryview(data), TRAILER))


def _field(values: pa.Array) -> pa.Array:
    """Each value as one field: its length, then its bytes (NULL: length -1, no bytes)."""
    kind = values.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        data = values.cast(pa.binary())
        lengths = pc.fill_null(pc.binary_length(data), -1).to_numpy(zero_copy_only=False)
        return pc.binary_join_element_wise(
            _fixed_width(lengths.astype(">i4")), pc.fill_null(data, _NOTHING), _NOTHING
        )
    if pa.types.is_timestamp(kind):
        micros = values.cast(pa.timestamp("us")).cast(pa.int64())
        values, dtype = pc.subtract(micros, _PG_EPOCH_US), ">i8"
    elif kind == pa.int32():
        dtype = ">i4"
    elif kind == pa.int64():
        dtype = ">i8"
    else:
        raise TypeError(f"no binary COPY form for Arrow type {kind}")
    width = np.dtype(dtype).itemsize
    records = np.empty(len(values), dtype=[("length", ">i4"), ("value", dtype)])
    records["length"] = width
    records["value"] = pc.fill_null(values, 0).to_numpy(zero_copy_only=False)
    fields = _fixed_width(records)
    if values.null_count:
        fields = pc.if_else(pc.is_valid(values), fields, _NULL)
    return fields


def _fixed_width(records: np.ndarray) -> pa.Array:
    """A numpy array of equal-width records as an Arrow binary array, one record a value."""
    width = records.dtype.itemsize
    offsets = np.arange(0, (len(records) + 1) * width, width, dtype=np.int32)
    return pa.BinaryArray.from_buffers(
        pa.binary(), len(records),
        [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(records).view(np.uint8))],
    )
