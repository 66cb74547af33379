"""The config's types, inferred from the packaged defaults, and the checks a site file passes.

A key's type is its default's type in default_config.toml: bool, int, float (an int is
accepted), str, a list of the default's element type, or a map of the default's value type.
A duration key (`*_s`, `*_min`, `*_h`, `*_hours`, `*_days`) whose default is an integer also
takes a float. Defaults that are empty containers say nothing about their elements, so
EXPLICIT gives those; RANGES, CHOICES and the generic rules below bound the values: every
number is finite and >= 0, timeouts and budgets are > 0.

Standard library only: the prolog validates its config on every job start.
"""

from __future__ import annotations

import math
import os

from rsc_health import ConfigError, lazyre
from rsc_health.model import FINDING_SEVERITIES, LOWER_IS_WORSE, Level, Metric
from rsc_health.record import dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from typing import Any


DURATION_SUFFIXES = ("_s", "_min", "_h", "_hours", "_days", "_minutes")
IB_COUNTERS = (
    "symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


@dataclass(frozen=True)
class Spec:
    kind: str  # bool | int | float | number | str | list | map | table | any
    item: Spec | None = None  # list element or map value
    fields: dict[str, Spec] = field(default_factory=dict)  # table
    required: tuple[str, ...] = ()  # table keys that must be given
    keys: tuple[str, ...] | None = None  # the keys a map may have (None: any)


STR = Spec("str")
EXPLICIT: dict[str, Spec] = {
    "infiniband.hcas": Spec("list", STR),
    "infiniband.errors_per_sweep": Spec("map", Spec("int"), keys=IB_COUNTERS),
    "infiniband.errors_per_hour": Spec("map", Spec("float"), keys=IB_COUNTERS),
    "mounts.expected": Spec("list", Spec("table", fields={
        "path": STR, "fstype": STR, "rw": Spec("bool")}, required=("path",))),
    "report.skip": Spec("list", STR),
    "telemetry.warn_above": Spec("map", Spec("float"), keys=tuple(
        m.value for m in Metric if m not in LOWER_IS_WORSE)),
    "telemetry.warn_below": Spec("map", Spec("float"), keys=tuple(
        m.value for m in LOWER_IS_WORSE)),
    "leftover.ignore_commands": Spec("list", STR),
    "node.spool_max_mb": Spec("number"),
    "qualify.tests": Spec("map", Spec("table", fields={
        "plugin": STR, "command": Spec("list", STR), "timeout_s": Spec("number"),
        "server_command": Spec("list", STR), "server_wait_s": Spec("number")},
        required=("plugin", "command"))),
    # A site may judge a metric of its own: any name, each with these fields.
    "failslow.metrics": Spec("map", Spec("table", fields={
        "direction": STR, "min_delta": Spec("float"), "min_margin": Spec("float"),
        "max_margin": Spec("float"),
        "persist_sweeps": Spec("int"), "same_component": Spec("bool"),
        "counts": Spec("bool"), "corroborated_by": Spec("list", STR),
        "levelled": Spec("bool"), "fleet_chance": Spec("bool")},
        required=("direction",))),
}
# Inclusive upper limits (and lower ones above 0) on keys where a typo would be absurd.
RANGES: dict[str, tuple[float, float]] = {
    "gpu.count": (0, 64),
    "gpu.nvlinks_per_gpu": (0, 64),
    "gpu.max_nvlinks": (0, 64),
    "gpu.temperature_max_c": (1, 150),
    "infiniband.count": (0, 1024),
    "infiniband.rate_gbps": (0, 100_000),
    "actions.guard_max_share": (0, 1),
    "actions.guard_retry_min": (0, 1440),
    "actions.guard_retry_max_min": (0, 10_080),
    # 0 counted only drains of the same second (the guard never tripped: sweeps are jittered);
    # 1e13 overflowed every act step's date arithmetic (helper-105). A minute to a week.
    "actions.guard_window_min": (1, 10_080),
    # A drain's second look waits this long inside the run's budget: 600 kept every drain
    # past its watchdog, its requeue and record lost (helper-105). Racing drains land in
    # Slurm within a second or two.
    "actions.guard_settle_s": (0, 30),
    "historian.sacct_overlap_s": (0, 30 * 86_400),
    "lemon.fleet_event_window_s": (0, 7 * 86_400),
    "lemon.episode_gap_h": (0, 24 * 366),
    "lemon.rate_window_days": (1, 3660),
    "metrics.confidence": (0, 1),
    "report.listed_days_max": (1, 60),
    "report.xid_top": (1, 1000),
    "slurm.lock_timeout_s": (0, 3600),
    "slurm.sweep_budget_s": (0, 3600),
    "slurm.call_timeout_s": (0, 3600),
    "historian.statement_timeout_s": (0, 86_400),
    "node.spool_max_mb": (0, 1_000_000),
    "mounts.probe_timeout_s": (0, 600),
    "gpu.nvml_timeout_s": (0, 600),
    "gpu.nvml_hang_sweeps": (0, 10_000),
    "gpu.handle_error_sweeps": (0, 10_000),
    "infiniband.read_timeout_s": (0, 600),
    "infiniband.hang_sweeps": (0, 10_000),
    "site.timeout_s": (0, 600),
    "site.max_output_bytes": (1024, 16 * 1024 * 1024),
    "site.max_lines": (1, 10_000),
    "qualify.k": (0.5, 20),
    # At least three sweeps (a run must persist to be confirmed), at most a week (a window
    # past the dates a database can hold failed every pass).
    "failslow.lookback_min": (15, 10_080),
    "failslow.complete_after_s": (0, 604_800),
    "failslow.recurring_alpha": (0, 1),
    "failslow.recurring_days": (0, 366),
    "failslow.recurring_min_jobs": (1, 10_000),
    "failslow.recurring_every_min": (0, 10_080),
    "telemetry.busy_util_pct": (0, 100),
    "telemetry.hw_throttle_warn_frac": (0, 1),
    "telemetry.pcie_link_warn_ratio": (0, 1),
    "telemetry.max_interval_s": (1, 86_400 * 7),
    # A rate over no time: at least a second between two runs' reads.
    "telemetry.min_interval_s": (1, 86_400),
    "qualify.min_margin": (0, 1),
    "qualify.max_margin": (0, 1),
    "qualify.min_peers": (1, 100_000),
    "qualify.baseline_margin": (0, 1),
    "qualify.parallel": (1, 1024),
    "leftover.min_memory_mib": (0, 16 * 2**20),
    "leftover.own_job_grace_s": (0, 86_400),
    "fabric.timeout_s": (0, 600),
    "dcgm.timeout_s": (0, 3600),
    "dcgm.diag_level": (0, 4),
    "dcgm.group": (0, 2**31),
    "failslow.k": (0.5, 20),
    "failslow.min_margin": (0, 1),
    "failslow.max_margin": (0, 1),
    "failslow.persist_sweeps": (1, 100),
    "failslow.fleet_chance_per_node_day": (0, 1),
    "failslow.min_nodes": (2, 100_000),
    "failslow.max_outlier_share": (0, 1),
    "failslow.steps_max_line_bytes": (256, 16 * 1024 * 1024),
    "failslow.steps_max_lines": (1, 1_000_000_000),
    "failslow.steps_max_files": (1, 10_000_000),
    "failslow.steps_max_lines_per_pass": (1, 10_000_000_000),
    "suspects.max_share": (0, 1),
    "suspects.big_job_nodes": (2, 1_000_000),
    # Slurm's largest node weight (rsc_health.slurm.cli_backend.MAX_WEIGHT): scontrol drops a
    # larger one, exit 0, and sends the rest of the update.
    "suspects.suspect_weight": (2, 0xFFFFFFF0),
    # An hour to a year: 1e12 hours overflowed every pass's date arithmetic, the tier stopped.
    "suspects.expire_after_h": (1, 8784),
}
# Strings Slurm must take as one word: the trusted feature goes into AvailableFeatures= and a
# job's --constraint (a comma or space in it would be two features, "" none: a suspect kept
# only its weight and no restore ever matched).
SLURM_WORDS = ("suspects.trusted_feature",)
_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:+-")
CHOICES: dict[str, tuple[str, ...]] = {
    "gpu.backend": ("auto", "nvml", "replay"),
    "gpu.nvml_binding": ("own", "pynvml"),
    "ettr.link_by": ("job_id", "name_user", "tag"),
    "site.nhc_severity": tuple(s.severity_word for s in FINDING_SEVERITIES if s is not Level.NONE),
    "leftover.action": tuple(s.severity_word for s in (Level.DRAIN_NOW, Level.DRAIN_AFTER_JOB,
                                                       Level.WARN)),
    "fabric.nvswitch": ("auto", "yes", "no"),
    "infiniband.link_layer": ("any", "InfiniBand"),
    "failslow.metrics.*.direction": ("low", "high"),
    "suspects.qualify_tier": ("lite", "full", "deep"),
    "qualify.dcgm_warn": ("inconclusive", "pass"),
}
# Lists whose items name check families (checks.REGISTRY): a misspelt one would silently drop
# that family from every prolog or epilog (or from qualification's gate).
FAMILY_LISTS = ("slurm.prolog_families", "slurm.epilog_families", "qualify.gate_families")
# Family lists where "*" means every family (as the sweep runs them) and that may not be empty:
# qualification's gate on the node's own checks cannot be switched off (rsc_health/qualify/gate.py).
ALL_FAMILIES = "*"
NONEMPTY_FAMILY_LISTS = ("qualify.gate_families",)


def family_names() -> tuple[str, ...]:
    from rsc_health.checks import REGISTRY  # only when a family list is given

    return tuple(f.name for f in REGISTRY)


def family_types() -> dict[str, Spec]:
    """The element types a family declares (checks.Family.types) for its keys whose default
    is an empty list or table, by dotted key."""
    global _FAMILY_TYPES
    if _FAMILY_TYPES is None:
        from rsc_health.checks import REGISTRY  # only for an empty default: few keys

        _FAMILY_TYPES = {f"{f.config}.{key}": spec for f in REGISTRY
                         for key, spec in f.types.items()}
    return _FAMILY_TYPES


_FAMILY_TYPES: dict[str, Spec] | None = None


def _is_duration(key: str) -> bool:
    return key.endswith(DURATION_SUFFIXES)


def infer(value: Any, dotted: str) -> Spec:
    if dotted in EXPLICIT:
        return EXPLICIT[dotted]
    if isinstance(value, (list, dict)) and not value and dotted in family_types():
        return family_types()[dotted]
    # bool before int: True is an int to isinstance.
    make = next((m for t, m in _INFERRED if isinstance(value, t)), None)
    return make(value, dotted) if make else Spec("any")


def _infer_list(value: list, dotted: str) -> Spec:
    kinds = {infer(v, dotted + "[]").kind for v in value}
    if kinds <= {"int", "float", "number"} and "float" in kinds:
        return Spec("list", Spec("float"))
    return Spec("list", infer(value[0], dotted + "[]") if len(kinds) == 1 else Spec("any"))


def _infer_map(value: dict, dotted: str) -> Spec:
    if not value:
        return Spec("map", Spec("any"))
    specs = [infer(v, f"{dotted}.*") for v in value.values()]
    kinds = {s.kind for s in specs}
    if kinds <= {"int", "float", "number"}:
        return Spec("map", Spec("float" if "float" in kinds else specs[0].kind))
    return Spec("map", specs[0] if len(kinds) == 1 else Spec("any"))


_INFERRED = (
    (bool, lambda value, dotted: Spec("bool")),
    (int, lambda value, dotted: Spec("number" if _is_duration(dotted) else "int")),
    (float, lambda value, dotted: Spec("float")),
    (str, lambda value, dotted: STR),
    (list, _infer_list),
    (dict, _infer_map),
)


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            list: "a list", dict: "a table"}.get(type(value), type(value).__name__)


def check_value(spec: Spec, value: Any, dotted: str) -> str | None:
    """What is wrong with `value` for `spec`, or None."""
    checker = _CHECKERS.get(spec.kind)  # "any" takes anything
    return checker(spec, value, dotted) if checker else None


def _check_bool(spec: Spec, value: Any, dotted: str) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {_show(value)}"


def _check_number(spec: Spec, value: Any, dotted: str) -> str | None:
    integer = isinstance(value, int) and not isinstance(value, bool)
    if integer or (spec.kind != "int" and isinstance(value, float)):
        return _check_range(value, dotted)
    want = "an integer" if spec.kind == "int" else "a number"
    return f"expected {want}, got {_show(value)}"


def _check_str(spec: Spec, value: Any, dotted: str) -> str | None:
    if not isinstance(value, str):
        return f"expected a string, got {_show(value)}"
    choices = CHOICES.get(dotted)
    if choices and value not in choices:
        return f"expected one of {', '.join(choices)}, got {value!r}"
    if dotted in SLURM_WORDS and not (0 < len(value) <= 64 and set(value) <= _WORD_CHARS):
        return f"expected one Slurm feature name (1-64 of A-Z a-z 0-9 _ . : + -), got " \
               f"{value[:80]!r}"
    if (dotted.removesuffix("[]") in NONEMPTY_FAMILY_LISTS and value == ALL_FAMILIES):
        return None
    if dotted.removesuffix("[]") in FAMILY_LISTS and value not in family_names():
        return f"unknown check family {value!r}{_suggest(value, family_names())}"
    return None


def _check_list(spec: Spec, value: Any, dotted: str) -> str | None:
    if not isinstance(value, list):
        return f"expected a list, got {_show(value)}"
    if not value and dotted in NONEMPTY_FAMILY_LISTS:
        return f'must name at least one check family ("{ALL_FAMILIES}": all of them)'
    if not value and dotted in FAMILY_LISTS:
        # Read as "no list given" by the engine, [] ran every family at job start, the
        # sweep's too (helper-105): refused, not guessed.
        return ("must name at least one check family (to run none at job start, leave the "
                "stage's line out of slurm.conf)")
    for i, item in enumerate(value):
        problem = check_value(spec.item or Spec("any"), item, dotted + "[]")
        if problem:
            return f"item {i + 1}: {problem}"
    return None


def _check_map(spec: Spec, value: Any, dotted: str) -> str | None:
    if not isinstance(value, dict):
        return f"expected a table, got {_show(value)}"
    return _check_entries(value, spec.keys, lambda key: spec.item or Spec("any"),
                          lambda key: f"{dotted}.*")


def _check_table(spec: Spec, value: Any, dotted: str) -> str | None:
    if not isinstance(value, dict):
        return f"expected a table, got {_show(value)}"
    problem = _check_entries(value, spec.fields, spec.fields.get,
                             lambda key: f"{dotted}.{key}")
    missing = [k for k in spec.required if k not in value]
    return problem or (f"missing {', '.join(missing)}" if missing else None)


def _check_entries(value: dict, known, spec_of, dotted_of) -> str | None:
    """The first entry of a table that is not among `known` (None: any key is) or whose value
    is wrong for spec_of(key), in words."""
    for key, item in value.items():
        if known is not None and key not in known:
            return f"unknown key {key!r} (known: {', '.join(known)})"
        problem = check_value(spec_of(key), item, dotted_of(key))
        if problem:
            return f"{key}: {problem}"
    return None


_CHECKERS = {"bool": _check_bool, "int": _check_number, "float": _check_number,
             "number": _check_number, "str": _check_str, "list": _check_list,
             "map": _check_map, "table": _check_table}


def _show(value: Any) -> str:
    text = repr(value)
    return f"{_type_name(value)} {text[:40]}{'...' if len(text) > 40 else ''}"


def _check_range(value: float, dotted: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if value < 0:
        return f"must be >= 0, got {value}"
    last = dotted.rsplit(".", 1)[-1]
    if ("timeout" in last or "budget" in last) and value <= 0:
        return f"must be > 0, got {value}"
    low, high = RANGES.get(dotted, (None, None))
    if low is not None and value < low:
        return f"must be >= {low}, got {value}"
    if high is not None and value > high:
        return f"must be <= {high}, got {value}"
    return None


def validate_section(section: str, table: Any, defaults: dict, path: str | os.PathLike,
                     where: str) -> None:
    if section not in defaults or not isinstance(defaults[section], dict):
        raise ConfigError(f"{path}: {where}unknown section [{section}]")
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {where}[{section}] must be a table")
    known = defaults[section]
    for key, value in table.items():
        dotted = f"{section}.{key}"
        if key not in known:
            raise ConfigError(f"{path}: {where}[{section}] {key}: unknown key"
                              f"{_suggest(key, known)}")
        problem = check_value(infer(known[key], dotted), value, dotted)
        if problem:
            raise ConfigError(f"{path}: {where}[{section}] {key}: {problem}")
    if section == "node" and "state_dir" in table and not str(table["state_dir"]).startswith("/"):
        raise ConfigError(f"{path}: {where}[node] state_dir: must be an absolute path")
    if section == "failslow" and isinstance(table.get("metrics"), dict):
        _check_corroborators(table["metrics"], known.get("metrics") or {}, path, where)


def _check_corroborators(site: dict, defaults: dict, path: str | os.PathLike,
                         where: str) -> None:
    """Each `corroborated_by` names a judged metric (a table of the defaults' or the site's):
    a misspelt one would never vouch, and the run would wait a sweep more, silently."""
    judged = set(defaults) | set(site)
    for name, body in site.items():
        for other in (body.get("corroborated_by") or []) if isinstance(body, dict) else []:
            if other not in judged:
                raise ConfigError(f"{path}: {where}[failslow.metrics.{name}] corroborated_by: "
                                  f"{other!r} is not a judged metric{_suggest(other, judged)}")


def validate_site(site: dict, defaults: dict, path: str | os.PathLike) -> None:
    for section, table in site.items():
        validate_section(section, table, defaults, path, "")


# Sections a [partitions.NAME] table may not override (validate_overrides).
NODE_WIDE_SECTIONS = ("actions",)
# Sections only the management host reads, once for the whole fleet (the historian's figures,
# the lemon and fail-slow verdicts, the suspect tier, the report, the lab): no override table
# applies to them, so one there would be shown by `config show --node` and never honoured
# (helper-105). Refused in [nodes."GLOB"] and [partitions.NAME] alike.
FLEET_SECTIONS = ("attribution", "metrics", "ettr", "lemon", "report", "failslow", "suspects",
                  "sim")


def validate_overrides(overrides: dict, defaults: dict, path: str | os.PathLike) -> None:
    for kind, tables in overrides.items():
        for name, table in tables.items():
            label = f'[{kind}."{name}"] ' if kind == "nodes" else f"[{kind}.{name}] "
            if kind == "nodes":
                _refuse_hostlist_glob(name, path, label)
            for section, body in table.items():
                if section in FLEET_SECTIONS:
                    raise ConfigError(
                        f"{path}: {label}[{section}]: read by the management host once for "
                        "the whole fleet, never per node or partition: an override here would "
                        f"not be applied; set it in [{section}]")
                if kind == "partitions" and section in NODE_WIDE_SECTIONS:
                    # Applied only where a job's partition is known (prolog, epilog), never in
                    # a sweep, and a node may be in several: `enabled = false` here let a
                    # partition's jobs start on a fault the same node's sweep then drained.
                    raise ConfigError(
                        f"{path}: {label}[{section}]: what rsc-health does to a node in Slurm "
                        "is the node's, not a job's partition's (the sweep knows no partition; "
                        f'a node may be in several): set it in [nodes."GLOB".{section}] for '
                        "the partition's nodes")
                validate_section(section, body, defaults, path, label)


def _refuse_hostlist_glob(glob: str, path: str | os.PathLike, label: str) -> None:
    """A node glob is fnmatch's: `[...]` is ONE character of a set. A Slurm hostlist range
    written there (`gpu[01-16]`, `gpu[1-4,8]`) is a set of single characters to fnmatch
    ({0, 1, 6}; {1, 2, 3, 4, ",", 8}): the table matched none of the nodes meant (a pilot's
    'shadow' nodes stayed live) and `config check` said ok. Refused, not read as Slurm reads
    it: a bracket of digits means one thing to fnmatch and another to Slurm (`[13]`), and a
    site's existing fnmatch sets keep their meaning. Refused is only what the two read
    differently: a set with a comma, or one Slurm range with a bound of two or more digits
    (`[01-16]`, `[1-35]`). `[0-9]`, `[01]`, and sets of several ranges (`[0-35-9]`, {0-3,
    5-9}; `[13-5]`, {1, 3-5}), which are no Slurm range, are fnmatch's. A list of names
    (`gpu001,gpu002`: a comma or a blank outside a set) matches no node at all, since a Slurm
    node name holds neither: refused too."""
    outside = _outside_sets(glob)
    if "," in outside or any(c.isspace() for c in outside):
        raise ConfigError(
            f"{path}: {label}reads as a Slurm hostlist of names, but a node glob is ONE "
            "fnmatch pattern and no node name holds a comma or a blank (it matches no node); "
            'write a table for each glob: [nodes."gpu001"], [nodes."gpu002"]')
    for found in _SLURM_SET.finditer(glob):
        if _slurm_range(found.group(1)):
            raise ConfigError(
                f"{path}: {label}{found.group(0)} reads as a Slurm hostlist range, but a node "
                f"glob is fnmatch's, where {found.group(0)} is ONE character out of a set (it "
                "matches none of the names the range means); write fnmatch globs, a table "
                "each: `gpu[01-16]` is `gpu0[1-9]` and `gpu1[0-6]`")


# A bracket of digits, commas and dashes: what a Slurm hostlist range is written with.
_SLURM_SET = lazyre.compile(r"\[([0-9][0-9,-]*)\]")


def _slurm_range(body: str) -> bool:
    """Whether a bracket of digits, commas and dashes means to Slurm what fnmatch reads
    otherwise: a comma (a list to Slurm, a character to fnmatch), or a single `LOW-HIGH`
    range, LOW <= HIGH, with a bound of two or more digits (Slurm's numbers, fnmatch's
    characters around one range). fnmatch reads the body as single characters and
    `c-c` ranges, so `0-35-9` ({0-3, 5-9}) or `13-5` ({1, 3-5}) are its sets, and no
    Slurm range (two dashes; a bound above the other)."""
    if "," in body:
        return True
    low, dash, high = body.partition("-")
    return bool(dash) and low.isdigit() and high.isdigit() and \
        max(len(low), len(high)) > 1 and int(low) <= int(high)


def _outside_sets(glob: str) -> str:
    """`glob`'s characters outside its `[...]` sets, the sets found as fnmatch.translate finds
    them (`[!` negates; a `]` first in a set is its own; a `[` with no `]` after is itself)."""
    out = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "[":
            j = i
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            j = glob.find("]", j)
            if j >= 0:
                i = j + 1
                continue
        out.append(c)
    return "".join(out)


def _suggest(key: str, known) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
