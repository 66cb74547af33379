"""Slurm hostlist expressions: `node[001-003,010],gpu7` <-> ["node001", ..., "gpu7"].

Pure standard library so the node path, the historian and the simulator share one parser.
"""

from __future__ import annotations

from itertools import groupby, product

from rsc_health import lazyre

_RANGE = lazyre.compile(r"^(\d+)(?:-(\d+))?$")
_BRACKET = lazyre.compile(r"\[([^\[\]]*)\]")
# No job runs on more hosts than this (the largest Slurm clusters have tens of thousands of
# nodes): a hostlist naming more is a typo (`node[0-99999999]` for `node[0-99]`), refused
# before anything is expanded, by the operator's commands and the sacct ingest alike.
MAX_HOSTS = 100_000
# Nor does a real hostlist's expansion come near this many characters (MAX_HOSTS names of 256):
# without it, 100 KB of text before `[1-100000]` (under MAX_HOSTS) built 10 GB of names.
MAX_CHARS = MAX_HOSTS * 256
# One node as Slurm names it (a hostname): no comma, bracket, space, `=` or leading `-`, any of
# which would make scontrol read the name as many nodes, another field or an option.
_ONE_NODE = lazyre.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


class HostlistError(ValueError):
    pass


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in {expr!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _range(piece: str, item: str) -> tuple[int, int, int]:
    """(low, high, width) of one `lo-hi` or `n` inside a bracket."""
    r = _RANGE.match(piece.strip())
    if not r:
        raise HostlistError(f"bad range {piece!r} in {item!r}")
    lo, hi = r.group(1), r.group(2) or r.group(1)
    try:
        low, high = int(lo), int(hi)
    except ValueError:  # more digits than int() takes
        raise HostlistError(f"bad range {piece!r} in {item!r}") from None
    if high < low:
        raise HostlistError(f"descending range {piece!r} in {item!r}")
    return low, high, len(lo)


def count(expr: str | None) -> int:
    """How many names `expand(expr)` gives, without expanding anything: per comma-separated
    item, the product of its brackets' range sizes. HostlistError where expand raises one."""
    return sum(size for size, _ in _sizes(expr))


def longest(expr: str | None) -> int:
    """The length of the longest name `expand(expr)` gives (0 for none), without expanding
    anything. HostlistError where expand raises one."""
    return measure(expr)[1]


def measure(expr: str | None) -> tuple[int, int]:
    """(count(expr), longest(expr)) in one reading of `expr`."""
    sizes = _sizes(expr)
    return sum(n for n, _ in sizes), max((length for _, length in sizes), default=0)


def _sizes(expr: str | None) -> list[tuple[int, int]]:
    """(names, longest name's length) of each comma-separated item: its literal text plus, per
    bracket, its widest number (`{n:0{width}d}`: the range's width or the high end's digits)."""
    if not expr or expr.strip() in ("None assigned", "(null)", "None"):
        return []
    out = []
    for item in _split_top(expr.strip()):
        size, length = 1, len(_BRACKET.sub("", item))
        for body in _BRACKET.findall(item):
            ranges = [_range(p, item) for p in body.split(",")]
            size *= sum(hi - lo + 1 for lo, hi, _ in ranges)
            length += max(max(width, len(str(hi))) for _, hi, width in ranges)
        out.append((size, length))
    return out


def _expand_one(item: str) -> list[str]:
    """Every name of one comma-free item, the first bracket varying slowest: the product of
    its brackets' numbers between its literal parts. No recursion: an item of thousands of
    brackets (`n[1][1]...`, one host by count) is as many steps, never a RecursionError."""
    parts: list[list[str]] = []
    at = 0
    for m in _BRACKET.finditer(item):
        parts.append([item[at : m.start()]])
        numbers: list[str] = []
        for piece in m.group(1).split(","):
            lo, hi, width = _range(piece, item)
            numbers.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
        parts.append(numbers)
        at = m.end()
    if not parts:
        return [item]
    parts.append([item[at:]])
    return ["".join(name) for name in product(*parts)]


def is_one_node(name: str) -> bool:
    """True when `name` can only ever mean one node to Slurm."""
    return _ONE_NODE.fullmatch(name) is not None


def expand(expr: str | None, limit: int = MAX_HOSTS) -> list[str]:
    """Expand a hostlist; "" / None / "None assigned" give []. One naming more than `limit`
    hosts, or more than MAX_CHARS characters of names, is a HostlistError, said before any
    name is made."""
    if not expr or expr.strip() in ("None assigned", "(null)", "None"):
        return []
    sizes = _sizes(expr)
    size = sum(n for n, _ in sizes)
    if size > limit:
        raise HostlistError(f"{_short(expr)} names {size:,} hosts, more than {limit:,}")
    chars = sum(n * length for n, length in sizes)  # at most: a bound, never an undercount
    if chars > MAX_CHARS:
        raise HostlistError(f"{_short(expr)} names up to {chars:,} characters of host names, "
                            f"more than {MAX_CHARS:,}")
    hosts: list[str] = []
    for item in _split_top(expr.strip()):
        hosts.extend(_expand_one(item))
    return hosts


def _short(expr: str) -> str:
    return repr(expr if len(expr) <= 80 else expr[:77] + "...")


_TAIL_NUM = lazyre.compile(r"^(.*?)(\d+)$")


def compress(hosts: list[str]) -> str:
    """The inverse of expand for names with one trailing number (what Slurm prints)."""
    keyed = []
    plain = []
    for h in dict.fromkeys(hosts):
        m = _TAIL_NUM.match(h)
        if m:
            keyed.append((m.group(1), len(m.group(2)), int(m.group(2))))
        else:
            plain.append(h)
    out = []
    keyed.sort()
    for (prefix, width), grp in groupby(keyed, key=lambda k: (k[0], k[1])):
        nums = [n for _, _, n in grp]
        ranges, start, prev = [], nums[0], nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if n is not None:
                start = prev = n
        if len(nums) == 1:
            out.append(f"{prefix}{nums[0]:0{width}d}")
        else:
            out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out + plain)
