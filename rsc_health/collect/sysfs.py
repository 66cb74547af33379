"""Tolerant readers for sysfs attribute files: a missing or garbled file is None, never raised."""

from __future__ import annotations

import re
from pathlib import Path

_INT = re.compile(r"^\s*(-?\d+)")


def read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "replace").strip()
    except OSError:
        return None


def parse_int(text: str | None) -> int | None:
    """Leading integer ("4: ACTIVE" -> 4, "16" -> 16, "0x030200" is not for this)."""
    if text is None:
        return None
    m = _INT.match(text)
    return int(m.group(1)) if m else None


def parse_count(text: str | None) -> int | None:
    """A counter file's value: ASCII decimal digits and nothing else. parse_int's leniency
    ("1e30" -> 1, "7junk" -> 7, Arabic-Indic digits) would turn a garbled read into a count."""
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


def parse_counters(text: str | None) -> dict[str, int]:
    """AER-style "NAME VALUE" lines ("RxErr 0", "TOTAL_ERR_COR 2"); bad lines are skipped."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[1].isascii():
            out[parts[0]] = int(parts[1])
    return out
