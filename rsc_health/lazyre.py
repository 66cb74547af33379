"""Regular expressions compiled when first used, not when their module is imported.

The node path's modules hold their patterns at module level, and compiling them all cost
every prolog about as much as the rest of those modules' import: most are for inputs a healthy
job start never sees (syslog files, XID details, drain reasons). `lazyre.compile(...)` is used
exactly as `re.compile(...)` is; the pattern is compiled by the first call of any of its
methods (then it is an `re.Pattern` in all but type).
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from typing import Any, cast
else:
    def cast(_type, value):
        return value


class _Lazy:
    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern: str, flags: int) -> None:
        self._args = (pattern, flags)
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(*self._args)
        return getattr(compiled, name)

    def __repr__(self) -> str:
        return f"lazyre.compile({self._args[0]!r})"


def compile(pattern: str, flags: int = 0) -> re.Pattern[str]:  # noqa: A001 - re's own name
    return cast("re.Pattern[str]", _Lazy(pattern, flags))
