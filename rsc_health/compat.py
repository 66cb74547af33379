"""What the node path takes from Python 3.11 and later, on the Python 3.9 and 3.10 that compute
nodes ship (RHEL 9: 3.9, Ubuntu 22.04: 3.10). The node-side modules (`[tool.rsc-health-node]`
in pyproject.toml) import these names from here, never from the standard library directly;
tests/static/test_node_python.py holds them to Python 3.9 with vermin.
"""

from __future__ import annotations

import enum
import os
import sys
import zipimport

# datetime's types from the C module the standard `datetime` re-exports: the same classes
# (`datetime.datetime is _datetime.datetime`), without executing datetime.py's pure-Python
# definitions first (6.5 M instructions of a 38 M bare start, benchmarks/bench_prolog.py).
try:
    from _datetime import date, datetime, timedelta, timezone
except ImportError:  # pragma: no cover - an interpreter without the accelerator
    from datetime import date, datetime, timedelta, timezone

UTC = timezone.utc  # datetime.UTC is 3.11+

try:  # the standard json's own C scanner and encoder, without json/__init__'s `re` and `enum`
    import _json
except ImportError:  # pragma: no cover - an interpreter without the accelerator
    _json = None  # type: ignore[assignment]


class _DecodeContext:
    """What _json.make_scanner reads off json.JSONDecoder: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


_scan = None
_WHITESPACE = " \t\n\r"


def json_loads(text: str | bytes) -> object:
    """json.loads(text) with json's defaults, by the standard library's C scanner: the same
    values and the same rejections (ValueError: json.JSONDecodeError, which imports json, is
    raised for a document that is not JSON). bytes are UTF-8 (with a BOM, or another UTF,
    json.loads itself decides)."""
    global _scan
    if isinstance(text, (bytes, bytearray)):
        try:
            if text[:3] == b"\xef\xbb\xbf" or b"\x00" in text[:4]:
                raise UnicodeError
            text = bytes(text).decode("utf-8")
        except UnicodeError:
            import json
            return json.loads(text)
    if _json is None or text[:1] == "\ufeff":
        import json
        return json.loads(text)
    if _scan is None:
        _scan = _json.make_scanner(_DecodeContext())
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        end = -1
    finally:
        _DecodeContext.memo.clear()
    if end < 0 or text[end:].strip(_WHITESPACE):
        import json
        return json.loads(text)  # raises json.JSONDecodeError, json's own message
    return value


def _no_default(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_dumps(value: object, *, default=None, sort_keys: bool = False,
               separators: tuple[str, str] | None = None) -> str:
    """json.dumps(value, default=, sort_keys=, separators=) by the standard library's C
    encoder: the same text (ensure_ascii, allow_nan, circular references refused)."""
    if _json is None or getattr(_json, "make_encoder", None) is None:
        import json
        return json.dumps(value, default=default, sort_keys=sort_keys, separators=separators)
    item, key = separators if separators is not None else (", ", ": ")
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    encode = _json.make_encoder({}, default or _no_default, _json.encode_basestring_ascii,
                                None, key, item, sort_keys, False, True)
    return "".join(encode(value, 0))

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin
else:  # pragma: no cover - exercised on a 3.9/3.10 interpreter (tests/static)

    class StrEnum(str, enum.Enum):
        """enum.StrEnum as 3.11 has it: str() and format() give the value."""

        __str__ = str.__str__
        __format__ = str.__format__

        @staticmethod
        def _generate_next_value_(name, start, count, last_values):
            return name.lower()


def __getattr__(name: str):
    """`compat.tomllib`, imported when first asked for (PEP 562): a job start that finds its
    compiled config (config.load_config_compiled) parses no TOML, and tomllib with its
    patterns is 8 ms of a 17.9 ms bare start (benchmarks/bench_prolog.py)."""
    if name != "tomllib":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if sys.version_info >= (3, 11):
        import tomllib  # novermin
    else:  # pragma: no cover - the declared dependency for python_version < "3.11"
        import tomli as tomllib
    globals()["tomllib"] = tomllib
    return tomllib


def packaged_bytes(path: os.PathLike | str) -> bytes | None:
    """The bytes of one of this package's own data files (default_config.toml, the XID
    catalog) when the package runs from a zip archive (the node zipapp, scripts/build-node);
    None when it is installed as files, which the caller reads as it reads any file."""
    loader = globals().get("__loader__")
    if isinstance(loader, zipimport.zipimporter):
        return loader.get_data(os.fspath(path))
    return None


def packaged_toml(data: bytes) -> dict | None:
    """The parsed form of one of the package's own TOML files, from rsc_health/_packaged.py
    (generated by scripts/gen-packaged: loaded as bytecode, no TOML parse at job start), when
    `data` is exactly the file it was made from; None otherwise (parse it)."""
    from rsc_health._packaged import TREES

    build = TREES.get(data)
    return build() if build is not None else None


def zip_archive() -> str | None:
    """The zip archive this package runs from (the node zipapp), or None."""
    loader = globals().get("__loader__")
    return loader.archive if isinstance(loader, zipimport.zipimporter) else None


__all__ = ["UTC", "StrEnum", "date", "datetime", "json_dumps", "json_loads", "timedelta",
           "timezone", "packaged_bytes", "packaged_toml", "zip_archive"]  # and tomllib
