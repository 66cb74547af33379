"""Regular expressions compiled when first used, not when their module is imported.

The node path's modules hold their patterns at module level, and compiling them all cost
every prolog about as much as the rest of those modules' import: most are for inputs a healthy
job start never sees (syslog files, XID details, drain reasons). `lazyre.compile(...)` is used
exactly as `re.compile(...)` is; the pattern is compiled by the first call of any of its
methods (then it is an `re.Pattern` in all but type). Not even `re` is imported before that:
`import re` (with enum, functools and collections) is 25 M instructions of a 38 M bare start
(benchmarks/bench_prolog.py). So a module that holds lazy patterns takes re's flags and
`escape` from here, not from re.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    import re
    from typing import Any, cast
else:
    def cast(_type, value):
        return value

# re's flags (the values re.RegexFlag has had since Python 3.6), for lazyre.compile(p, flags)
ASCII = A = 256
IGNORECASE = I = 2  # noqa: E741 - re's own name
MULTILINE = M = 8
DOTALL = S = 16
VERBOSE = X = 64

# What re.escape escapes (Python 3.7 and later): its own table.
_SPECIAL = {i: "\\" + chr(i) for i in b"()[]{}?*+-|^$\\.&~# \t\n\r\v\f"}


def escape(text: str) -> str:
    """re.escape(text) for a str, without importing re."""
    return text.translate(_SPECIAL)


class _Lazy:
    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern: str, flags: int) -> None:
        self._args = (pattern, flags)
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:
        compiled = self._compiled
        if compiled is None:
            import re  # the first use of any lazy pattern

            compiled = self._compiled = re.compile(*self._args)
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"lazyre.compile({self._args[0]!r})"


def compile(pattern: str, flags: int = 0) -> re.Pattern[str]:  # noqa: A001 - re's own name
    return cast("re.Pattern[str]", _Lazy(pattern, flags))
