"""The XID catalog as data: the packaged `xid_catalog.toml` with the site override file over it.
The NVSwitch SXid catalog (`sxid_catalog.toml`) has the same shape and is read the same way."""

from __future__ import annotations

import os

from rsc_health.compat import packaged_bytes, packaged_name, packaged_toml
from rsc_health.model import Severity
from rsc_health.record import dataclass

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable

CATALOG_PATH = os.path.join(os.path.dirname(__file__), "xid_catalog.toml")
SXID_CATALOG_PATH = os.path.join(os.path.dirname(__file__), "sxid_catalog.toml")
ACTIONS = {
    "drain_now": Severity.DRAIN_NOW,
    "drain_after_job": Severity.DRAIN_AFTER_JOB,
    "warn": Severity.WARN,
    "ignore": Severity.NONE,
}


# Actions decided per line, each by the table of the same name.
PER_LINE = ("by_severity", "by_recovery_action")


class CatalogError(Exception):
    pass


@dataclass(frozen=True)
class XidRule:
    severity: Severity
    repair: bool
    name: str


class Catalog:
    """The catalog's tree (`data`: the packaged one with the site override over it) and what
    its codes are called in messages (`label`: "SXid" for the NVSwitch catalog). The packaged
    catalog alone is built when first used (`build`): a healthy run judges no event and never
    builds it, nor loads the trees' module (rsc_health._packaged, 131 KB of bytecode)."""

    def __init__(self, data: dict | None, label: str = "XID",
                 build: Callable[[], dict] | None = None) -> None:
        self._data = data
        self._build = build
        self.label = label

    @property
    def data(self) -> dict:
        if self._data is None and self._build is not None:
            self._data = self._build()
        return self._data if self._data is not None else {}

    def __repr__(self) -> str:
        built = "built" if self._data is not None else "not built yet"
        return f"Catalog(label={self.label!r}, {built})"

    def rule(
        self, xid: int, line_severity: str | None = None, recovery: str | None = None
    ) -> XidRule:
        entry = self.data.get("codes", {}).get(str(xid))
        if entry is None:
            action = self.data.get("defaults", {}).get("unknown", "warn")
            if action not in PER_LINE:
                return XidRule(ACTIONS[action], False, f"{self.label} {xid} (not in catalog)")
            # An unlisted code judged by what its line says (an SXid's Fatal / Non-fatal).
            entry = {"action": action, "name": f"{self.label} {xid} (not in catalog)"}
        action = entry.get("action", "warn")
        repair = bool(entry.get("repair", False))
        if action == "by_severity":
            bys = self.data.get("by_severity", {})
            if line_severity == "fatal":
                action, repair = bys.get("fatal_action", "drain_now"), bool(
                    bys.get("fatal_repair", True)
                )
            elif line_severity == "nonfatal":
                action = bys.get("nonfatal_action", "warn")
            else:
                action = bys.get("unknown_severity_action", "drain_after_job")
        elif action == "by_recovery_action":
            table = self.data.get("by_recovery_action", {})
            key = recovery if recovery in table else "unknown"
            action = table.get(key, "drain_after_job")
            repair = key in table.get("repair", ())
        return XidRule(ACTIONS[action], repair, entry.get("name", f"{self.label} {xid}"))

    def application_codes(self) -> frozenset[int]:
        """The XIDs marked `application = true`: the program's error, never the node's."""
        return frozenset(
            int(code) for code, entry in self.data.get("codes", {}).items()
            if entry.get("application", False)
        )


def _trusted(path: str) -> None:
    """A site catalog decides what drains, as the site config does, and is held to its rule:
    root's (or ours), writable by no one else, and so is every directory on its path (or
    sticky). CatalogError otherwise: another user could set XID 79 to "ignore"."""
    from rsc_health.durable import trust_refusal

    try:
        st = os.stat(path)
    except OSError as exc:
        raise CatalogError(f"{path}: {exc.strerror or exc}") from exc
    why = trust_refusal(st, path, str(path))
    if why:
        raise CatalogError(why)


_PACKAGED_PATHS = (CATALOG_PATH, SXID_CATALOG_PATH)


def _bytes(path: str) -> bytes:
    from rsc_health.collect.sysfs import read_bounded  # refuses a FIFO or endless file

    packed = packaged_bytes(path) if path in _PACKAGED_PATHS else None  # from the node zipapp
    try:
        return read_bounded(path, 1 << 20) if packed is None else packed
    except OSError as exc:
        raise CatalogError(f"{path}: {exc}") from exc


def _read(path: str, data: bytes | None = None) -> dict:
    """The tree of the catalog at `path` (its bytes `data`, when read already)."""
    if data is None:
        data = _bytes(path)
    if path in _PACKAGED_PATHS:
        tree = packaged_toml(data)  # parsed at build time (scripts/gen-packaged)
        if tree is not None:
            return tree
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{path}: {exc}") from exc
    from rsc_health.compat import tomllib  # a catalog that is not the packaged one

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: {exc}") from exc
    except RecursionError:  # tomllib recurses: `a = [[[[...` 500 deep, inline tables 330
        raise CatalogError(f"{path}: arrays or tables nested too deep") from None


def _validate(data: dict, path: str) -> None:
    unknown = data.get("defaults", {}).get("unknown", "warn")
    if unknown not in (*ACTIONS, *PER_LINE):
        raise CatalogError(f"{path}: [defaults] unknown: unknown action {unknown!r}")
    for key, action in data.get("by_recovery_action", {}).items():
        if key != "repair" and action not in ACTIONS:
            raise CatalogError(f"{path}: [by_recovery_action] {key}: unknown action {action!r}")
    for code, entry in data.get("codes", {}).items():
        if not code.isdigit() or not isinstance(entry, dict):
            raise CatalogError(f"{path}: [codes.{code}] must be a table under a numeric XID")
        if entry.get("action", "warn") not in (*ACTIONS, *PER_LINE):
            raise CatalogError(f"{path}: [codes.{code}] unknown action {entry.get('action')!r}")


def load_catalog(override: str | os.PathLike | None = None,
                 path: str | os.PathLike = CATALOG_PATH, label: str = "XID") -> Catalog:
    path = os.fspath(path)
    raw = _bytes(path)
    if not override and path in _PACKAGED_PATHS and packaged_name(raw) is not None:
        # The very bytes scripts/gen-packaged made its tree from (tomllib's tree of them, and
        # one that validates: tests/unit/test_packaged_literal.py, test_xid_catalog.py): built,
        # and validated again, only when an event is judged by it.
        return Catalog(None, label, build=lambda: _validated(_read(path, raw), path))
    data = _read(path, raw)
    if override:
        site_path = os.fspath(override)
        _trusted(site_path)
        site = _read(site_path)
        _validate(site, site_path)
        for table in ("defaults", *PER_LINE):
            data.setdefault(table, {}).update(site.get(table, {}))
        data.setdefault("codes", {}).update(site.get("codes", {}))
    return Catalog(_validated(data, path), label)


def _validated(data: dict, path: str) -> dict:
    _validate(data, path)
    return data


def load_sxid_catalog(override: str | os.PathLike | None = None) -> Catalog:
    return load_catalog(override, SXID_CATALOG_PATH, "SXid")
