"""Configuration: one TOML file over the documented defaults, with per-node and per-partition
overrides.

Precedence (lowest first): rsc_health/default_config.toml < the site file
(`--config PATH` > `$RSC_HEALTH_CONFIG` > /etc/rsc_health/config.toml) < [partitions.NAME] <
[nodes."GLOB"] (value by value in the order the file sets them: Config.node_layers) <
command-line options. A missing default-location file counts as empty; a file that was
named explicitly and is missing, or any file that does not parse, is a ConfigError with the
path and the parser's own message.

Every value is typed: the type of each key is the type of its default in default_config.toml
(`rsc_health/config_schema.py` infers it, plus a few range limits), so a key someone adds
there with a default is known and typed at once. An unknown key, a wrong type or an
out-of-range value is a ConfigError naming the file and the key, for the site file and for
every [nodes."GLOB"] / [partitions.NAME] override table alike.

Only the standard library is imported: the prolog loads the config on every job start.
"""

from __future__ import annotations

import marshal
import os
import stat

from rsc_health import ConfigError, lazyre
from rsc_health.compat import (
    date,
    join_parts,
    json_dumps,
    json_loads,
    packaged_bytes,
    packaged_toml,
    path_mode,
    path_parts,
    pure_path,
    time,
)
from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from typing import Any

# Paths are str (os.path, no pathlib on a job start: issue 25); the functions take a str or an
# os.PathLike and give a str, in pathlib's normal form (compat.pure_path).
DEFAULT_CONFIG_PATH = "/etc/rsc_health/config.toml"
PACKAGED_DEFAULTS = os.path.join(os.path.dirname(__file__), "default_config.toml")
OVERRIDE_TABLES = ("nodes", "partitions")
# Config.overrides' key for the [nodes."GLOB"] values in the order the site file sets them
# (Config.node_layers); not a TOML table, so no site file can write it.
NODE_LAYERS = " node layers in file order"
_UNSET: Any = object()


@dataclass
class Config:
    data: dict[str, Any]
    path: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    # The site file's bytes when this load parsed them (None from the compiled config, for a
    # node view, without a site file): what remember_good keeps as the last good config.
    parsed: bytes | None = None

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{self.path or 'config'}: [{name}] must be a table")
        return value

    def get(self, dotted: str, default: Any = _UNSET) -> Any:
        """The value of `section.key`. A documented key takes no default here: one missing
        from this config (a document a test or a caller trimmed) is the packaged default, so
        default_config.toml stays the only place a default is written. `default` is for keys
        default_config.toml does not have (None when not given)."""
        node = _lookup(self.data, dotted)
        if node is not _UNSET:
            return node
        if default is not _UNSET:
            return default
        node = _lookup(_packaged(), dotted)
        return None if node is _UNSET else _copied(node)

    def actions_enabled(self, node: str | None = None) -> bool:
        """[actions] enabled as `node` sees it (its `[nodes."GLOB".actions]` tables, the last
        match winning, as for_node merges them), without copying the config per node: every
        writer to Slurm, on a node or on the management host, asks this for the node it would
        change, so a pilot's shadow nodes stay untouched by lemons, the suspect tier,
        qualification and a person's `healthctl drain` alike. None: the config's own."""
        enabled = bool(self.get("actions.enabled"))
        if node is None:
            return enabled
        for pattern, on in self._node_actions():
            if glob_match(node, pattern):
                enabled = on
        return enabled

    def actions_enabled_anywhere(self) -> bool:
        """Whether any node may be changed in Slurm: the site's [actions] enabled, or a
        `[nodes."GLOB".actions] enabled = true` (a pilot inside a site in shadow mode)."""
        return bool(self.get("actions.enabled")) or any(on for _, on in self._node_actions())

    def _node_actions(self):
        """(glob, enabled) of each `[nodes."GLOB"]` layer that sets actions.enabled, in the
        order for_node merges them."""
        for pattern, table in self.node_layers():
            acts = table.get("actions") if isinstance(table, dict) else None
            if isinstance(acts, dict) and "enabled" in acts:
                yield pattern, bool(acts["enabled"])

    def node_layers(self) -> list:
        """[glob, table] pairs in the order for_node applies them: the site file's values under
        [nodes."GLOB"] in the order the file sets them (load_config's NODE_LAYERS). TOML
        merges every table of one glob into one key, placed where the glob first appears, so
        the parsed dict's order is not the file's: `[nodes."gpu*".actions] enabled = false`
        appended to stop a pilot lost to the pilot's earlier table whenever an earlier
        `[nodes."gpu*".gpu]` came first. A Config made without the file (a test's, a
        snapshot's) has one layer per glob, in its dict order."""
        layers = self.overrides.get(NODE_LAYERS)
        if layers is None:
            return [[k, v] for k, v in self.overrides.get("nodes", {}).items()]
        return layers

    def for_node(self, node: str, partition: str | None = None, *,
                 given_up: bool = False) -> Config:
        """The config as seen by one node: partition overrides, then node-glob overrides. A
        copy, unless the caller gives this config up (`given_up`: the node path's job start,
        whose config was loaded for that run alone and is not used again): then the overrides
        are merged into its own tables (copying the whole tree cost every job start 1.5 M
        instructions, 4% of a bare start)."""
        merged = self.data if given_up else _copied(self.data)
        layers = []
        if partition and partition in self.overrides.get("partitions", {}):
            layers.append(self.overrides["partitions"][partition])
        for pattern, table in self.node_layers():
            if glob_match(node, pattern):
                layers.append(table)
        for layer in layers:
            _deep_merge(merged, layer)
        return Config(merged, self.path, self.overrides)


def _lookup(data: dict, dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _UNSET
        node = node[part]
    return node


_PACKAGED: list[dict] = []  # the parsed defaults, once (functools.cache without functools)


def _packaged() -> dict:
    if not _PACKAGED:
        _PACKAGED.append(_read_defaults())
    return _PACKAGED[0]


def glob_match(name: str, pattern: str) -> bool:
    """fnmatch.fnmatchcase(name, pattern), without fnmatch and the `re` it compiles patterns
    with (25 M instructions of a 38 M bare start, and [nodes."GLOB"] is matched on every job
    start): `*` any run of characters, `?` any one, `[a-c9]` / `[!a-c9]` one in (not in) the
    set, anything else itself. A set of other characters (`]`, `-` or `\\` of its own, `^`,
    a range backwards, no closing `]`) is fnmatch's to read, and it reads it: its rules for
    those are fnmatch.translate's. tests/unit/test_config_glob.py holds it to fnmatchcase."""
    if not ("*" in pattern or "?" in pattern or "[" in pattern):
        return name == pattern
    if pattern in _GLOBS:
        tokens = _GLOBS[pattern]
    else:
        tokens = _glob_tokens(pattern)
        if len(_GLOBS) < 1024:  # a site has a few globs; a caller with endless ones, no memory
            _GLOBS[pattern] = tokens
    if tokens is None:  # a set fnmatch reads by its own rules
        import fnmatch

        return fnmatch.fnmatchcase(name, pattern)
    # Two pointers: on a mismatch, the last `*` seen takes one character more.
    t = n = 0
    star_t, star_n = -1, 0
    end = len(tokens)
    while n < len(name):
        token = tokens[t] if t < end else None
        if token is _STAR:
            star_t, star_n = t, n
            t += 1
        elif token is not None and (token is _ANY or token == name[n] or (
                type(token) is tuple and _in_set(token, name[n]))):
            t += 1
            n += 1
        elif star_t >= 0:
            star_n += 1
            t, n = star_t + 1, star_n
        else:
            return False
    while t < end and tokens[t] is _STAR:
        t += 1
    return t == end


_STAR = object()
_ANY = object()
_GLOBS: dict[str, list | None] = {}
# What a set may hold for glob_match to read it itself: characters no set rule of fnmatch's
# (negation, ranges, escapes, the closing bracket, set operations) gives a meaning.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@+,=/ #%")


def _in_set(token: tuple, char: str) -> bool:
    negated, chars, ranges = token
    return (char in chars or any(low <= char <= high for low, high in ranges)) != negated


def _glob_tokens(pattern: str) -> list | None:
    """`pattern` as _STAR, _ANY, characters and sets (negated, characters, (low, high)
    ranges); None when a set is not one of plain characters and ascending ranges."""
    tokens: list = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not tokens or tokens[-1] is not _STAR:
                tokens.append(_STAR)
        elif c == "?":
            tokens.append(_ANY)
        elif c != "[":
            tokens.append(c)
        else:
            negated = i < n and pattern[i] == "!"
            i += negated
            chars, ranges = "", []
            while i < n and pattern[i] in _PLAIN:
                if i + 2 < n and pattern[i + 1] == "-" and pattern[i + 2] in _PLAIN:
                    if pattern[i] > pattern[i + 2]:
                        return None
                    ranges.append((pattern[i], pattern[i + 2]))
                    i += 3
                else:
                    chars += pattern[i]
                    i += 1
            if i >= n or pattern[i] != "]" or not (chars or ranges):
                return None
            i += 1
            tokens.append((negated, chars, tuple(ranges)))
    return tokens


def _defaults_bytes() -> bytes:
    """The packaged default_config.toml's bytes, from the installed file or from the node
    zipapp. Raises ConfigError (OSError from a zipapp that cannot be read)."""
    data = packaged_bytes(PACKAGED_DEFAULTS)
    return _read_bytes(PACKAGED_DEFAULTS) if data is None else data


def _read_defaults() -> dict:
    """The packaged default_config.toml, parsed once at build time when it is the file
    scripts/gen-packaged saw."""
    data = _defaults_bytes()
    return packaged_toml(data) or _parse_toml(data, PACKAGED_DEFAULTS)


def _hot_default(dotted: str) -> Any:
    """A default a job start reads before it has a config (the compiled config's place, the
    watchdog's first budget), from rsc_health._packaged_keys.HOT: no tree of every default is
    built for it (rsc_health._packaged: 131 KB of bytecode, about 3 M instructions of a 38 M
    bare start). Only while default_config.toml holds the very bytes HOT was made from;
    _UNSET for anything else (a key not in HOT, other bytes, a file that cannot be read): the
    tree decides, and says what is wrong."""
    from rsc_health._packaged_keys import HOT, SOURCES

    if dotted not in HOT:
        return _UNSET
    try:
        data = _defaults_bytes()
    except (ConfigError, OSError):
        return _UNSET
    return HOT[dotted] if data == SOURCES["default_config.toml"] else _UNSET


def packaged_default(dotted: str) -> Any:
    """A documented key's packaged default (default_config.toml); KeyError for one that is not
    documented."""
    if not _PACKAGED:  # the tree, once built, is as cheap
        value = _hot_default(dotted)
        if value is not _UNSET:
            return value  # an immutable leaf: no copy
    value = _lookup(_packaged(), dotted)
    if value is _UNSET:
        raise KeyError(f"{dotted}: not in {os.path.basename(PACKAGED_DEFAULTS)}")
    return _copied(value)


def with_defaults(section: str, table: Any = None) -> dict[str, Any]:
    """The packaged [section] with `table` (a config's section, or part of one) over it: what
    a helper that takes a section (`from_config`) reads, never a default of its own."""
    merged = packaged_default(section)
    merged.update(table or {})
    return merged


# TOML's leaves: immutable, so a copy of a config tree shares them.
_LEAVES = (str, int, float, bool, type(None), date, time)


def _copied(value: Any) -> Any:
    """A config tree's own copy: tables and arrays made anew, leaves shared (what
    copy.deepcopy gives a TOML document, without importing copy and weakref into every job
    start or walking its memo). Anything else a caller put in is deep-copied."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    if isinstance(value, _LEAVES):
        return value
    import copy

    return copy.deepcopy(value)


def _deep_merge(base: dict, top: dict) -> dict:
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = _copied(value)
    return base


MAX_CONFIG_BYTES = 1 << 20


def _read_toml(path: str | os.PathLike, *, packaged: bool = False, raw: list | None = None) -> dict:
    """Read a TOML file that is a regular file: a FIFO or a device where the config should be
    would block the prolog at open or read, so it is refused without waiting (O_NONBLOCK).
    `raw`, when given, receives the bytes parsed (the compiled config keeps them)."""
    data = _read_bytes(path, trusted=not packaged)
    if raw is not None:
        raw.append(data)
    return (packaged and packaged_toml(data)) or _parse_toml(data, path)


# Why a site config must be one no one else could have written: it names the programs root
# runs ([slurm] bin_dir, [site] nhc_path, [qualify] commands), where root writes (state_dir,
# textfile_dir) and which checks run at all. As for site checks (durable.path_refusal).
UNTRUSTED_CONFIG = ("refused: a config someone else can write would choose what root runs; "
                    "chown root and chmod go-w it and the directories above it")


def _read_bytes(path: str | os.PathLike, *, trusted: bool = False) -> bytes:
    """A config file's bytes: a regular file (opened O_NONBLOCK: a FIFO never blocks), at most
    MAX_CONFIG_BYTES; ConfigError otherwise. `trusted`: the file is the site config, which
    must also be root's (or this user's), writable by no one else, on a path no one else can
    swap (durable.trust_refusal)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{path}: not a regular file")
            if trusted:
                _trust(path, st)
            data = fh.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return data


def _trust(path: str | os.PathLike, st: os.stat_result) -> None:
    from rsc_health.durable import trust_refusal

    why = trust_refusal(st, path)
    if why:
        raise ConfigError(f"{path}: {why.removesuffix('; refused')}: {UNTRUSTED_CONFIG}")


def _parse_toml(data: bytes, path: str | os.PathLike) -> dict:
    from rsc_health.compat import tomllib  # not on a job start that finds its compiled config

    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except RecursionError:  # tomllib recurses: `a = [[[[...` 500 deep, inline tables 330
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deep") from None


def resolve_path(explicit: str | os.PathLike | None = None) -> tuple[str, bool]:
    """The config file to read and whether it was named explicitly."""
    if explicit:
        return pure_path(explicit), True
    env = os.environ.get("RSC_HEALTH_CONFIG")
    if env:
        return pure_path(env), True
    return DEFAULT_CONFIG_PATH, False


def _exists(path: str) -> bool:
    """pathlib's Path.exists (compat.path_mode): a missing name, a file where a directory is on
    the way, a symlink loop are "no"; any other error (EACCES) is raised, not "no"."""
    return path_mode(path) is not None


def _under(directory: str | os.PathLike, *names: str) -> str:
    """str(Path(directory).joinpath(*names)) for relative names."""
    root, parts = path_parts(directory)
    for name in names:
        parts += path_parts(name)[1]
    return join_parts(root, parts)


def load_config(explicit: str | os.PathLike | None = None, *, raw: list | None = None
                ) -> Config:
    """The packaged defaults merged with the site file, validated. `raw`, when given, receives
    the site file's bytes as parsed (none when there is no site file)."""
    path, named = resolve_path(explicit)
    got: list[bytes] = [] if raw is None else raw
    site: dict = {}
    if str(path) != os.devnull:
        if _exists(path) or named:
            site = _read_toml(path, raw=got)
    cfg = _from_site(site, path, named)
    cfg.parsed = got[-1] if got else None
    if got:
        _order_node_layers(cfg, got[-1], path)
    return cfg


def _order_node_layers(cfg: Config, parsed: bytes, path: str) -> None:
    """Keep in cfg the [nodes."GLOB"] values in the order `parsed` (the site file's text that
    made cfg) sets them: every Config made from a site file's text must (load_config's and
    last_good_config's alike), or a table appended last to stop a pilot loses to the dict's
    order exactly when a broken push makes the node judge with the kept text."""
    nodes = cfg.overrides.get("nodes")
    if nodes and len(nodes) > 1:  # one glob: its dict order is the file's
        cfg.overrides[NODE_LAYERS] = _node_layers(parsed.decode("utf-8"), nodes, path)


def _from_site(site: dict, path: str, named: bool = True) -> Config:
    """The packaged defaults merged with a site document read from `path`, validated."""
    from rsc_health.config_schema import validate_overrides, validate_site

    data = _read_defaults()
    overrides = {k: site.pop(k) for k in OVERRIDE_TABLES if k in site}
    for kind, table in overrides.items():
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise ConfigError(f"{path}: [{kind}.NAME] overrides must be tables")
    validate_site(site, data, path)
    validate_overrides(overrides, data, path)
    _deep_merge(data, site)
    return Config(data, path if site or named else None, overrides)


# ---- [nodes."GLOB"] precedence: the file's order, value by value ----------------------------
# The rule (default_config.toml, README): for a node, every value set under a matching
# [nodes."GLOB"] applies in the order the file sets it, so of two matching globs that set the
# same key, the one written later in the file wins, whichever glob appeared first. tomllib
# gives no positions, so _statement_paths reads the file once more for where each key is set
# (table headers and `key = value` lines; every value skipped, strings and comments included):
# only when the file has two or more globs, and not on a job start that finds its compiled
# config (the layers are compiled with it).


def _node_layers(text: str, nodes: dict, path: str) -> list:
    """[glob, table] of each run of values the file sets under one glob, in file order."""
    try:
        paths = _statement_paths(text)
    except (ValueError, IndexError) as exc:
        # tomllib parsed this file: a file this reader cannot follow is its own failure,
        # said loudly rather than guessing the precedence.
        raise ConfigError(f"{path}: cannot tell the order of the [nodes.\"GLOB\"] tables "
                          f"({exc}); write each as a [nodes.\"GLOB\".SECTION] table") from None
    layers: list = []
    for keys in paths:
        if keys[0] != "nodes":
            continue
        if len(keys) == 1:  # nodes = {...}: one inline table, its globs in its own order
            found = [[glob, table] for glob, table in nodes.items()]
        else:
            value, keys = _walk(nodes, keys[1:])
            if value is _UNSET:
                raise ConfigError(f"{path}: cannot tell the order of the [nodes.\"GLOB\"] "
                                  f"tables (nodes.{'.'.join(keys)} is not a table's key); "
                                  "write each as a [nodes.\"GLOB\".SECTION] table")
            keys = ("nodes",) + keys
            for key in reversed(keys[2:]):
                value = {key: value}
            found = [[keys[1], value]]
        for glob, table in found:
            if layers and layers[-1][0] == glob:
                _deep_merge(layers[-1][1], table)
            else:
                layers.append([glob, _copied(table)])
    return layers


def _walk(data: Any, keys: tuple) -> tuple:
    """(the value at `keys`, its keys); for keys inside an array of tables
    (`[[nodes."gpu*".mounts.expected]]`: [mounts] expected is a list of tables), the whole
    array and its keys: an array is one value, replaced whole by a later layer, so it ranks
    where the file last adds to it. (_UNSET, keys) when `keys` name nothing."""
    for depth, key in enumerate(keys):
        if isinstance(data, list):
            return data, keys[:depth]
        if not isinstance(data, dict) or key not in data:
            return _UNSET, keys
        data = data[key]
    return data, keys


def _statement_paths(text: str) -> list[tuple]:
    """The full key path of each `key = value` in a TOML document that parses, in file order
    (the enclosing table header's keys, then the line's own), and of each array-of-tables
    header (`[[...]]`: it adds an element)."""
    paths: list[tuple] = []
    table: tuple = ()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c == "#":
            i = _line_end(text, i)
        elif c == "[":
            double = text.startswith("[[", i)
            start = i + (2 if double else 1)
            end = _key_end(text, start, "]")
            table = _key_path(text[start:end])
            if double:  # an array of tables grows here, even by an element with no keys
                paths.append(table)
            i = end + (2 if double else 1)
        else:
            end = _key_end(text, i, "=")
            paths.append(table + _key_path(text[i:end]))
            i = _value_end(text, end + 1)
    return paths


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _key_end(text: str, i: int, stop: str) -> int:
    """Where `stop` ends a (dotted, maybe quoted) key that starts at i."""
    while text[i] != stop:
        i = _string_end(text, i) if text[i] in "\"'" else i + 1
    return i


def _key_path(key: str) -> tuple:
    """A dotted key's parts, decoded as TOML decodes them (quotes, escapes)."""
    from rsc_health.compat import tomllib

    parsed = tomllib.loads(key + " = 0")
    parts = []
    while isinstance(parsed, dict):
        (name, parsed), = parsed.items()
        parts.append(name)
    return tuple(parts)


def _string_end(text: str, i: int) -> int:
    """Just past the string that starts at i (basic, literal, multi-line of either)."""
    quote = text[i]
    if text.startswith(quote * 3, i):
        j = i + 3
        while True:
            if quote == '"' and text[j] == "\\":
                j += 2
            elif text.startswith(quote * 3, j):
                j += 3
                while j < len(text) and text[j] == quote:
                    j += 1  # up to two quotes of the content before the closing three
                return j
            else:
                j += 1
    j = i + 1
    while text[j] != quote:
        j += 2 if quote == '"' and text[j] == "\\" else 1
    return j + 1


def _value_end(text: str, i: int) -> int:
    """Just past the value that starts after `=` at i: the end of its line, arrays and strings
    (which may span lines) and inline tables skipped whole."""
    depth = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i = _string_end(text, i)
            continue
        if c == "#":
            i = _line_end(text, i)
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == "\n" and depth == 0:
            return i
        i += 1
    return i


def validated(data: dict, source: str | os.PathLike) -> Config:
    """A Config from a whole document that did not come through load_config (a snapshot's)."""
    from rsc_health.config_schema import validate_site

    defaults = _read_defaults()
    validate_site(data, defaults, pure_path(source))
    return Config(_deep_merge(defaults, data), pure_path(source))


def node_name(cfg: Config) -> str:
    """The node's one name in every entry point: $SLURMD_NODENAME > [slurm] node_name > the
    short hostname (the name Slurm knows the node by, which [nodes."GLOB"] matches)."""
    return (
        os.environ.get("SLURMD_NODENAME")
        or str(cfg.get("slurm.node_name") or "")
        or os.uname().nodename.split(".")[0]  # gethostname() without importing socket
    )


def resolve_node_config(
    cfg: Config, node: str | None = None, partition: str | None = None, *,
    given_up: bool = False,
) -> tuple[Config, str]:
    """(the config as this node sees it, the node's name): one resolution for `healthctl check`,
    the prolog, the epilog and the sweep. [partitions.NAME] applies where the partition is
    known (the prolog/epilog's $SLURM_JOB_PARTITION, `check --partition`). `given_up`:
    Config.for_node's (`cfg` is not used again: the view is made in it)."""
    name = node or node_name(cfg)
    return cfg.for_node(name, partition or None, given_up=given_up), name


def node_root(explicit: str | os.PathLike | None = None) -> str:
    """The directory every collector reads under (`--root` > $RSC_HEALTH_ROOT > /)."""
    return pure_path(explicit or os.environ.get("RSC_HEALTH_ROOT") or "/")


def state_dir(cfg: Config, root: str | os.PathLike) -> str:
    """Local state (cursors, counters, spool) lives under the root, so two roots never share it."""
    return _under(root, *path_parts(cfg.get("node.state_dir"))[1])


# Keys whose value is a secret whatever it looks like, and secrets inside any string value: a
# URL's password (postgresql://user:PASSWORD@host) and libpq's `password=...`.
_SECRET_KEY = lazyre.compile(r"passw|secret|token|credential|api_?key", lazyre.IGNORECASE)
_URL_PASSWORD = lazyre.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)[^/\s]*(?=@)")
_KV_PASSWORD = lazyre.compile(r"(?P<head>\bpassword\s*=\s*)('[^']*'|\S+)", lazyre.IGNORECASE)
MASK = "***"


def masked(value: Any, key: str = "") -> Any:
    """`value` (a config document or any part of it) with its secrets replaced by MASK, for
    everything that prints or ships a config (`config show`, snapshots)."""
    if isinstance(value, dict):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, key) for v in value]
    if isinstance(value, str):
        if value and _SECRET_KEY.search(key):
            return MASK
        value = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, value)
        return _KV_PASSWORD.sub(lambda m: m.group("head") + MASK, value)
    return value


# ---- the last good config -------------------------------------------------------------------
# What a node remembers of its last config that loaded (in the packaged default state dir's
# <state_dir>/last_good_config.json, 0600: the historian URL may hold a password), so a broken
# push is still said in its textfile and its spool still flushed. A site whose state_dir is
# not the default's has its memory where a broken config cannot point: it falls back to the
# packaged defaults.
LAST_GOOD_FILE = "last_good_config.json"
REMEMBERED = ("node.textfile_dir", "historian.url")


def remember_good(cfg: Config, sdir: str | os.PathLike, parsed: bytes | None = None) -> None:
    """Keep REMEMBERED of a config that loaded, and `parsed`, the site file's bytes when this
    run parsed them (its whole text: what a broken push is judged with, last_good_config),
    when they differ from what is kept. Raises OSError."""
    from rsc_health.durable import load_state_json, write_atomic

    keep = {key: cfg.get(key) for key in REMEMBERED}
    kept = load_state_json(_under(sdir, LAST_GOOD_FILE))
    text = kept.get("toml") if isinstance(kept.get("toml"), str) else None
    if parsed is not None:
        try:
            text = parsed.decode("utf-8")
        except UnicodeDecodeError:  # a site file that parsed is UTF-8; be sure
            text = None
    if kept.get("settings") == keep and kept.get("source") == str(cfg.path) \
            and kept.get("toml") == text:
        return
    doc = {"settings": keep, "source": str(cfg.path), "time": _now_text()}
    if text is not None:
        doc["toml"] = text
    write_atomic(_under(sdir, LAST_GOOD_FILE), json_dumps(doc), mode=0o600)


def last_good_config(root: str | os.PathLike) -> tuple[Config, str] | None:
    """(the whole last config that loaded on this node, in words which and when) to judge with
    while the site's is broken or refused; None when none is kept, when what is kept is not
    root's own (the file and the state dir: a planted copy would choose what root runs), or
    when it no longer validates (a release that changed the schema)."""
    from rsc_health.durable import open_regular, trust_refusal

    defaults = load_config(os.devnull)
    file = _under(state_dir(defaults, root), LAST_GOOD_FILE)
    try:
        fd = open_regular(file)
        with os.fdopen(fd, "rb") as fh:
            if trust_refusal(os.fstat(fd), file):
                return None
            kept: Any = json_loads(fh.read(4 * MAX_CONFIG_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    text = kept.get("toml") if isinstance(kept, dict) else None
    if not isinstance(text, str):
        return None
    source = str(kept.get("source"))[:512]
    try:
        parsed = text.encode("utf-8")
        cfg = _from_site(_parse_toml(parsed, pure_path(source)), pure_path(source))
        _order_node_layers(cfg, parsed, pure_path(source))
    except (ConfigError, UnicodeEncodeError, RecursionError):
        return None
    return cfg, f"the last good config ({source}, kept {str(kept.get('time'))[:32]})"


def fallback_config(root: str | os.PathLike) -> tuple[Config, str]:
    """(the config to go on with when the site's is broken, which one it is, in words): the
    packaged defaults with the last good config's REMEMBERED settings, or the defaults alone."""
    from rsc_health.durable import load_state_json

    defaults = load_config(os.devnull)
    kept = load_state_json(_under(state_dir(defaults, root), LAST_GOOD_FILE))
    settings = kept.get("settings")
    if not isinstance(settings, dict):
        return defaults, "the packaged defaults"
    for key in REMEMBERED:
        value = settings.get(key)
        if isinstance(value, str):
            section, _, name = key.partition(".")
            defaults.data.setdefault(section, {})[name] = value
    return defaults, (f"the last good config's settings ({kept.get('source')}, remembered "
                      f"{kept.get('time')})")


def _now_text() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- the compiled config --------------------------------------------------------------------
# What a job start loads instead of parsing TOML (tomllib and its patterns: 8 ms of a 17.9 ms
# bare start, benchmarks/bench_prolog.py): the validated, merged config of the last load,
# marshalled into <packaged default state_dir>/COMPILED_FILE (root's, 0600: the historian URL
# may hold a password), keyed by everything the result depends on: the site file's stat
# (device, inode, size, mtime_ns, ctime_ns, mode, owner: an edit that keeps the mtime, a
# replace by rename or a chmod all change it), the package's version and the stat of the code
# and defaults that validated it. Anything else (another key, a file not a regular one, owned
# by someone other than root or this user, writable by group or others, in a directory that
# breaks durable.DIRECTORY_RULE, truncated, corrupt, larger than MAX_CONFIG_BYTES) is a miss:
# the TOML is parsed and validated as always, and the result written anew. Only a site whose
# state_dir is the packaged default's keeps one (the file must be found before the config is
# read). A config with a date or time value is not kept (marshal has no datetime).
#
# A stat key cannot see an edit made within the filesystem's timestamp granularity of the load
# that wrote it: content A parsed, then rewritten in place to B of the same size in the same
# tick (the same second on a 1-second filesystem), and size, mtime and ctime all still match A.
# git's "racily clean" rule: a key whose file was changed no earlier than RACY_NS before the
# moment the load began (taken before its first stat) is racy. Such a compiled config keeps
# the very bytes it parsed and is served only while the file still holds them (one small read,
# no parse); code that changed that recently is not compiled at all. Any later change is
# stamped at or after that moment less one tick, so a key RACY_NS older than it is safe.
COMPILED_FILE = "compiled_config.marshal"
COMPILED_FORMAT = 3  # 3: overrides keep NODE_LAYERS
# 2 s: the coarsest timestamps a config's filesystem has (FAT's 2 s; ext3, 128-byte-inode ext4
# and NFS servers on them: 1 s; local ext4/xfs/btrfs: one kernel tick, 1-10 ms), with a second
# of clock skew between an NFS server and this node to spare. A racy key costs one read of
# the site file, so the bound can be generous.
RACY_NS = 2_000_000_000


def _stat_key(path: str | os.PathLike) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode,
            st.st_uid)


def _code_key() -> tuple:
    """The stat of what turns a site file into a Config: this module, the schema, the packaged
    defaults (or the node zipapp that holds them all)."""
    from rsc_health import __version__
    from rsc_health.compat import zip_archive

    archive = zip_archive()
    here = os.path.dirname(os.path.abspath(__file__))
    parts = [archive] if archive else [os.path.join(here, name) for name in (
        "config.py", "config_schema.py", "default_config.toml", "_packaged.py", "_packaged_keys.py",
        "model.py")]
    return (COMPILED_FORMAT, __version__, tuple(_stat_key(p) for p in parts))


def _compiled_key(path: str, named: bool) -> tuple | None:
    """The key of a load of `path`; None when it is no file to keep a compiled copy of (a
    FIFO, a device, a directory: load_config says what is wrong with it)."""
    site = _stat_key(path)
    if site is None and named and str(path) != os.devnull:
        return None
    if site is not None and str(path) != os.devnull and not stat.S_ISREG(site[5]):
        return None
    return (_code_key(), str(path), named, site, _dirs_key(path))


def _dirs_key(path: str) -> tuple:
    """Who owns each directory the kernel looks a name up in to reach `path` (symlinks
    followed: durable.path_holders, what load_config's trust check judges), and its mode. A
    directory made writable by others after the compile changes the key, and the load that
    follows refuses the file loudly (helper-105: the compiled copy kept serving it, and no
    config_error was said; helper-108: also behind a symlink)."""
    from rsc_health.durable import path_holders

    try:
        holders = sorted(path_holders(os.path.abspath(path)))
    except OSError:
        return (None,)
    parts: list[tuple] = []
    for here in holders:
        try:
            st = os.lstat(here)
            parts.append((here, st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid))
        except OSError:
            parts.append((here, None))
    return tuple(parts)


def compiled_path(root: str | os.PathLike) -> str:
    return _under(root, *path_parts(packaged_default("node.state_dir"))[1], COMPILED_FILE)


def _read_compiled(file: str, key: tuple, site: str) -> Config | None:
    from rsc_health.durable import open_regular, ours, unsafe_directory

    try:
        if unsafe_directory(os.stat(os.path.dirname(file))):
            return None
        fd = open_regular(file)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not ours(st.st_uid) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None
            blob = fh.read(MAX_CONFIG_BYTES + 1)
        if len(blob) > MAX_CONFIG_BYTES:
            return None
        kept = marshal.loads(blob)
    except (OSError, EOFError, ValueError, TypeError, MemoryError):
        # MemoryError: marshal trusts a list's count (5 garbled bytes ask for 16 GiB).
        return None
    if not (isinstance(kept, tuple) and len(kept) == 6 and kept[0] == key):
        return None
    _, data, path, overrides, written, parsed = kept
    if not (isinstance(data, dict) and isinstance(overrides, dict)
            and (path is None or isinstance(path, str)) and type(written) is int
            and (parsed is None or isinstance(parsed, bytes))):
        return None
    if any(_racy(part, written) for part in key[0][2]):
        return None
    if _racy(key[3], written) and (parsed is None or _site_bytes(site) != parsed):
        return None  # racily clean: the bytes decide, not the stat
    return Config(data, path, overrides)


def _site_bytes(path: str) -> bytes | None:
    """The site file's bytes now, read as _read_toml reads them; None if they cannot be."""
    try:
        return _read_bytes(path)
    except ConfigError:
        return None


def _write_compiled(file: str, key: tuple, cfg: Config, began: int,
                    parsed: bytes | None) -> None:
    """Keep cfg under `key`, with when its load began and, for a racy key, the bytes parsed."""
    from rsc_health.durable import write_atomic

    try:
        blob = marshal.dumps((key, cfg.data, None if cfg.path is None else str(cfg.path),
                              cfg.overrides, began, parsed))
    except ValueError:  # a date or time value: parsed each time
        return
    if len(blob) <= MAX_CONFIG_BYTES:
        write_atomic(file, blob, mode=0o600)


def load_config_compiled(root: str | os.PathLike,
                         explicit: str | os.PathLike | None = None) -> Config:
    """load_config(explicit) for a job start: from the compiled config when its key still
    holds (and, for a racy key, the file still holds the bytes it was compiled from), else
    loaded as always and kept for the next run (a write that fails is only a miss next time).
    Raises ConfigError as load_config does."""
    import time

    began = time.time_ns()  # before the first stat: see RACY_NS
    path, named = resolve_path(explicit)
    key = _compiled_key(path, named)
    if key is None:
        return load_config(explicit)
    file = compiled_path(root)
    cfg = _read_compiled(file, key, path)
    if cfg is not None:
        return cfg
    raw: list[bytes] = []
    cfg = load_config(explicit, raw=raw)
    if state_dir(cfg, root) == os.path.dirname(file) and _compiled_key(path, named) == key \
            and not any(_racy(part, began) for part in key[0][2]):
        try:
            _write_compiled(file, key, cfg, began,
                            raw[0] if raw and _racy(key[3], began) else None)
        except OSError:
            pass
    return cfg


def _racy(stat_key: tuple | None, when_ns: int) -> bool:
    """Whether a file with this stat key was changed (mtime or ctime) no earlier than RACY_NS
    before `when_ns`: an edit within its timestamp granularity could leave the key unchanged."""
    return stat_key is not None and max(stat_key[3], stat_key[4]) >= when_ns - RACY_NS
