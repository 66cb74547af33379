"""What the node path takes from Python 3.11 and later, on the Python 3.9 and 3.10 that compute
nodes ship (RHEL 9: 3.9, Ubuntu 22.04: 3.10). The node-side modules (`[tool.rsc-health-node]`
in pyproject.toml) import these names from here, never from the standard library directly;
tests/static/test_node_python.py holds them to Python 3.9 with vermin.
"""

from __future__ import annotations

import errno
import os
import sys
import zipimport

# datetime's types from the C module the standard `datetime` re-exports: the same classes
# (`datetime.datetime is _datetime.datetime`), without executing datetime.py's pure-Python
# definitions first (6.5 M instructions of a 38 M bare start, benchmarks/bench_prolog.py).
try:
    from _datetime import date, datetime, time, timedelta, timezone  # time: datetime.time
except ImportError:  # pragma: no cover - an interpreter without the accelerator
    from datetime import date, datetime, time, timedelta, timezone

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


def aware_time(value: object) -> datetime | None:
    """A stored ISO time, aware; None for anything else (not a str, an old file's naive time,
    a hand edit): the one reading of the times our state files keep."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


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
        _scan = _json.make_scanner(_DecodeContext())  # type: ignore[arg-type]  # its fields
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration:
        end = -1
    except RecursionError:  # nested deeper than the decoder goes: json.loads raises it too
        raise
    except Exception:  # noqa: BLE001 - json.loads below says what is wrong, in its own words
        # A document broken inside a string, array or object: the scanner raises
        # json.decoder.JSONDecodeError, which it takes from sys.modules without importing it
        # (3.10, 3.11): with json not imported yet that is a SystemError ("returned NULL
        # without setting an exception"), not a ValueError any caller catches.
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


TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:  # a type checker sees the standard library's enums
    from enum import IntEnum, StrEnum  # novermin
else:
    _MAPPINGPROXY = type(type.__dict__)

    class _EnumType(type):
        """enum.EnumType for the node path's vocabularies (rsc_health.model), without `enum`
        (17 M instructions of a 38 M bare start: it brings types, functools, operator,
        collections, keyword and reprlib; benchmarks/bench_prolog.py). A class body's plain
        values become its members, instances of the class and of its data type (str or int),
        made once; a value met again is an alias of the first member with it. What the
        product uses of enum behaves as 3.11's StrEnum and IntEnum do (tests/unit/
        test_compat_enums.py holds the two side by side): lookup by value (`Cls(v)`) and by
        name (`Cls["N"]`), iteration in definition order without aliases, len, __members__,
        .name/.value, str/format/repr, pickling and copying as the same member. Not here:
        auto(), _missing_, Flag, the functional API, members named with a leading `_`."""

        def __new__(mcls, name, bases, namespace, **kwargs):
            for base in bases:
                if getattr(base, "_member_names_", None):
                    raise TypeError(f"{name}: cannot extend {base!r}")
            # A str or int is never a descriptor: only other values are asked (each hasattr
            # that fails formats an AttributeError, three a member, every job start).
            members = [(key, value) for key, value in namespace.items()
                       if not (key[:1] == "_" or type(value) not in (str, int) and (
                           hasattr(value, "__get__") or hasattr(value, "__set__")
                           or hasattr(value, "__delete__")))]
            named = {key for key, _ in members}
            body = {key: value for key, value in namespace.items() if key not in named}
            cls = super().__new__(mcls, name, bases, body, **kwargs)
            data_type = next((b for b in cls.__mro__ if b in (str, int)), None)
            by_name: dict = {}
            by_value: dict = {}
            names: list = []
            for key, value in members:
                if data_type is None:
                    raise TypeError(f"{name}: members need a str or int data type")
                member = by_value.get(value)
                if member is None:  # a new value: a new member (an alias otherwise)
                    if type(value) is not data_type:
                        raise TypeError(f"{name}.{key}: {value!r} is not a {data_type.__name__}")
                    member = data_type.__new__(cls, value)
                    member.__dict__.update(_value_=value, _name_=key, __objclass__=cls)
                    by_value[value] = member
                    names.append(key)
                by_name[key] = member
            type.__setattr__(cls, "_member_map_", by_name)
            type.__setattr__(cls, "_value2member_map_", by_value)
            type.__setattr__(cls, "_member_names_", names)
            for key, member in by_name.items():
                type.__setattr__(cls, key, member)
            return cls

        def __call__(cls, value):
            try:
                return cls._value2member_map_[value]
            except (KeyError, TypeError):
                raise ValueError(f"{value!r} is not a valid {cls.__qualname__}") from None

        def __getitem__(cls, name):
            return cls._member_map_[name]

        def __iter__(cls):
            return (cls._member_map_[name] for name in cls._member_names_)

        def __reversed__(cls):
            return (cls._member_map_[name] for name in reversed(cls._member_names_))

        def __len__(cls):
            return len(cls._member_names_)

        def __contains__(cls, value):
            """A member, or (as 3.12 has it) the value of one."""
            if isinstance(value, cls):
                return True
            try:
                return value in cls._value2member_map_
            except TypeError:
                return False

        def __bool__(cls):
            return True

        @property
        def __members__(cls):
            return _MAPPINGPROXY(cls._member_map_)

        def __repr__(cls):
            return f"<enum {cls.__name__!r}>"

        def __setattr__(cls, name, value):
            if name in cls.__dict__.get("_member_map_", ()):
                raise AttributeError(f"cannot reassign member {name!r}")
            super().__setattr__(name, value)

        def __delattr__(cls, name):
            if name in cls.__dict__.get("_member_map_", ()):
                raise AttributeError(f"{cls.__name__!r} cannot delete member {name!r}.")
            super().__delattr__(name)

    class _Member:
        """What enum.Enum gives its members, for StrEnum and IntEnum below (before their data
        type: its __repr__ and __reduce_ex__ are not what enum has)."""

        __slots__ = ()

        @property
        def name(self):
            return self._name_

        @property
        def value(self):
            return self._value_

        def __repr__(self):
            return f"<{type(self).__name__}.{self._name_}: {self._value_!r}>"

        def __reduce_ex__(self, protocol):
            return type(self), (self._value_,)

        def __copy__(self):
            return self

        def __deepcopy__(self, memo):
            return self

    class StrEnum(_Member, str, metaclass=_EnumType):
        """enum.StrEnum as 3.11 has it: members are strs, str() and format() give the value."""

        __str__ = str.__str__
        __format__ = str.__format__

    class IntEnum(_Member, int, metaclass=_EnumType):
        """enum.IntEnum as 3.11 has it: members are ints, str() and format() give the number."""

        __str__ = int.__repr__
        __format__ = int.__format__


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


def path_parts(path: str | os.PathLike[str]) -> tuple[str, list[str]]:
    """(root, names) of `path` as pathlib.PurePosixPath reads it: "/" (or POSIX's "//") or "",
    then the names without empty or "." ones ("..", which may cross a symlink, is kept). The
    node path's paths are str (os.path): pathlib is 43 M instructions of a 38 M bare start."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"expected str or os.PathLike[str], not {type(text).__name__}")
    root = "//" if text[:2] == "//" and text[2:3] != "/" else "/" if text[:1] == "/" else ""
    return root, [part for part in text.split("/") if part and part != "."]


def join_parts(root: str, parts: list[str]) -> str:
    """The path of path_parts' (root, names): str(PurePosixPath(...)), "." for nothing."""
    return root + "/".join(parts) or "."


def pure_path(path: str | os.PathLike[str]) -> str:
    """str(pathlib.Path(path)) without pathlib: no doubled or trailing slash, no "." part. A
    str in that form already is itself (a "." part can only stand whole, first, inside or
    last): most of the paths a job start reads, a few hundred of them."""
    text = os.fspath(path)
    if type(text) is str and text and "//" not in text and "/./" not in text \
            and text[-1] != "/" and text[:2] != "./" and text[-2:] != "/.":
        return text
    return join_parts(*path_parts(text))


# pathlib's exists/is_dir/is_symlink (3.9 to 3.11): these errors mean "no", any other is raised.
_NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def path_mode(path: str | os.PathLike[str], *, follow: bool = True) -> int | None:
    """The st_mode of `path` (os.stat; os.lstat with follow=False) as pathlib's exists,
    is_dir and is_symlink read it: None for a missing name, a file where a directory is on
    the way, a symlink loop or a NUL in the name; any other error (EACCES, EIO) is raised."""
    try:
        return (os.stat if follow else os.lstat)(path).st_mode
    except OSError as exc:
        if exc.errno not in _NOT_THERE:
            raise
        return None
    except ValueError:
        return None


def packaged_bytes(path: os.PathLike | str) -> bytes | None:
    """The bytes of one of this package's own data files (default_config.toml, the XID
    catalog) when the package runs from a zip archive (the node zipapp, scripts/build-node);
    None when it is installed as files, which the caller reads as it reads any file."""
    loader = globals().get("__loader__")
    if isinstance(loader, zipimport.zipimporter):
        return loader.get_data(os.fspath(path))
    return None


def packaged_name(data: bytes) -> str | None:
    """The name of the package's own TOML file (default_config.toml, xid_catalog.toml, ...)
    whose exact bytes `data` is, as scripts/gen-packaged saw them (rsc_health/_packaged_keys.py,
    small: no tree is loaded to tell); None for any other bytes."""
    from rsc_health._packaged_keys import SOURCES

    for name, source in SOURCES.items():
        if source == data:
            return name
    return None


def packaged_toml(data: bytes) -> dict | None:
    """The parsed form of one of the package's own TOML files, from rsc_health/_packaged.py
    (generated by scripts/gen-packaged: loaded as bytecode, no TOML parse at job start), when
    `data` is exactly the file it was made from; None otherwise (parse it). A new tree each
    call."""
    name = packaged_name(data)
    if name is None:
        return None
    from rsc_health._packaged import TREES

    return TREES[name]()


def zip_archive() -> str | None:
    """The zip archive this package runs from (the node zipapp), or None."""
    loader = globals().get("__loader__")
    return loader.archive if isinstance(loader, zipimport.zipimporter) else None


__all__ = ["UTC", "IntEnum", "StrEnum", "date", "datetime", "json_dumps", "json_loads", "time",
           "timedelta", "timezone", "join_parts", "packaged_bytes", "packaged_name",
           "packaged_toml", "path_mode", "path_parts", "pure_path", "zip_archive"]  # and tomllib
