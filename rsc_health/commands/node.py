"""`healthctl check` and `healthctl snapshot`: the node's health, now, from the collectors.

Only the standard library, click and the node engine are imported: this runs on every compute
node (no pandas, SQLAlchemy or matplotlib on this path; tests/node/test_node_imports.py).

`check --json` schema (version "rsc_health.check/1"; fields are only ever added):
    {"schema": "rsc_health.check/1", "node": str, "root": str, "time": ISO-8601 UTC,
     "verdict": {"level": "ok|warn|drain_after_job|drain_now|checker_error", "exit_code": 0-4,
                 "reason": Slurm reason or "", "auto_resumable": bool},
     "findings": [{"family", "component", "status", "severity", "reason", "code", "repair",
                   "data"}, ...]}
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import click

from rsc_health.config import Config, masked
from rsc_health.model import Finding, Level, Status, utcnow

SNAPSHOT_SCHEMA = "rsc_health.snapshot/1"
PROBES_FILE = "rsc_health/mount_probes.json"  # in a replay root
SITE_FILE = "rsc_health/site_checks.json"  # in a replay root
CLOCK_FILE = "rsc_health/telemetry_clock.json"  # in a replay root
CHECK_SCHEMA = "rsc_health.check/1"


def _families(text: str | None) -> set[str] | None:
    return {f.strip() for f in text.split(",") if f.strip()} if text else None


def _render_table(findings: list[Finding], verdict, verbose: bool) -> str:
    shown = findings if verbose else [f for f in findings if f.status is not Status.OK]
    lines = []
    if shown:
        w_fam = max(len("CHECK"), *(len(f.family) for f in shown))
        w_comp = max(len("COMPONENT"), *(len(f.component) for f in shown))
        w_sev = max(len("SEVERITY"), *(len(f.severity.severity_word) for f in shown))
        lines.append(f"{'CHECK':<{w_fam}}  {'COMPONENT':<{w_comp}}  STATUS  "
                     f"{'SEVERITY':<{w_sev}}  REASON")
        order = sorted(sorted(shown, key=lambda f: (f.family, f.component)),
                       key=lambda f: f.severity, reverse=True)  # worst first, by rank
        for f in order:
            lines.append(f"{f.family:<{w_fam}}  {f.component:<{w_comp}}  {f.status.value:<6}  "
                         f"{f.severity.severity_word:<{w_sev}}  {f.reason}")
    n_ok = sum(f.status is Status.OK for f in findings)
    lines.append(f"{len(findings)} checks, {n_ok} ok, {len(findings) - n_ok} not ok")
    lines.append(f"verdict: {verdict.level.name} (exit {verdict.exit_code})"
                 + (f"  {verdict.reason}" if verdict.reason else ""))
    return "\n".join(lines)


@click.command()
@click.option("--only", metavar="FAMILY,...", help="Run only these check families.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema).")
@click.option("--from", "snapshot", type=click.Path(exists=True, dir_okay=False),
              help="Replay a `healthctl snapshot` file instead of reading this node.")
@click.option("-v", "--verbose", is_flag=True, help="Show OK findings in the table too.")
@click.option("--root", "root_arg", metavar="DIR",
              help="Read the node under DIR (same as `healthctl --root`).")
@click.option("--partition", metavar="NAME",
              help="Apply [partitions.NAME] overrides, as the prolog does for a job there.")
@click.pass_obj
def check(obj, only: str | None, as_json: bool, snapshot: str | None, verbose: bool,
          root_arg: str | None, partition: str | None) -> None:
    """Check this node; exit code = verdict (0 ok, 1 warn, 2 drain after job, 3 drain now,
    4 checker error).

    Read-only: the XID cursor and counter baselines are the sweep's (prolog, epilog and sweep
    advance them under the node lock), so what `check` shows is what is new since the last
    of those, and it is still there for the next sweep to act on."""
    from rsc_health.config import ConfigError, resolve_node_config
    from rsc_health.engine import run
    from rsc_health.policy import decide

    if root_arg:
        obj.root_arg = root_arg
    try:
        obj.config  # noqa: B018 -- load it now: a broken config is a checker error, not a crash
    except click.ClickException as exc:
        click.echo(f"checker error: {exc.message}", err=True)
        sys.exit(Level.CHECKER_ERROR.exit_code)

    families = _families(only)
    if snapshot:
        import tempfile  # only replay needs it; keep the prolog's import time down

        with tempfile.TemporaryDirectory(prefix="rsc_health-replay-") as tmp:
            try:
                cfg, root = restore_snapshot(Path(snapshot), Path(tmp), obj)
                node = str(load_snapshot(Path(snapshot)).get("node", ""))[:256]
            except ConfigError as exc:
                click.echo(f"checker error: {exc}", err=True)
                sys.exit(Level.CHECKER_ERROR.exit_code)
            findings = run(cfg, root, only=families, save_state=False)
            shown_root = f"snapshot:{snapshot}"
    else:
        # The same node name and overrides as the sweep and the prolog.
        cfg, node = resolve_node_config(obj.config, partition=partition)
        root = obj.root
        findings = run(cfg, root, only=families, save_state=False)
        shown_root = str(root)
    verdict = decide(findings)
    if as_json:
        doc = {
            "schema": CHECK_SCHEMA,
            "node": node,
            "root": shown_root,
            "time": utcnow().isoformat(timespec="seconds"),
            "verdict": {
                "level": verdict.level.label,
                "exit_code": verdict.exit_code,
                "reason": verdict.reason,
                "auto_resumable": verdict.auto_resumable,
            },
            "findings": [f.to_dict() for f in findings],
        }
        click.echo(json.dumps(doc, indent=1, sort_keys=True, default=str))
    else:
        click.echo(_render_table(findings, verdict, verbose))
    sys.exit(verdict.exit_code)


# --- snapshot -----------------------------------------------------------------------------

# Read by the engine for every family: the boot id keys counter baselines and the XID cursor.
SHARED_READS = ("proc/sys/kernel/random/boot_id",)


def _read(path: Path) -> str | None:
    """A file's text as the checks read it: a regular file, at most FILE_BYTES (a FIFO where
    a file was would block the snapshot for ever, a device never ends), or /dev/kmsg."""
    from rsc_health.collect.sysfs import read_bounded

    try:
        st = path.stat()
        if stat.S_ISCHR(st.st_mode):
            from rsc_health.collect.kmsg import _read_kmsg_device

            # The whole ring buffer, up to MAX_READ bytes of records: a snapshot has no cursor.
            return _read_kmsg_device(path, -1).text + "\n"
        return read_bounded(path).decode("utf-8", "replace")
    except OSError:
        return None


def _local_state(cfg: Config, root: Path) -> dict[str, str]:
    """The node's local state the checks judge against (XID cursor, counter baselines), so a
    replay judges "new since the last sweep" exactly as the node did. Read, never written."""
    from rsc_health.collect.sysfs import read_bounded
    from rsc_health.config import state_dir
    from rsc_health.engine import STATE_FILES

    out = {}
    for name in STATE_FILES:
        try:  # bounded: a FIFO at the name held the snapshot for ever, /dev/zero never ends
            out[name] = read_bounded(Path(state_dir(cfg, root)) / name).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return out


def take_snapshot(cfg: Config, root: Path, node: str = "") -> dict:
    """Exactly what the families of checks.REGISTRY declare they read (files, NVML's answers,
    what their `capture` adds), with the node's local state, as one JSON document.

    Every probe that can hang (a mount's statvfs, NVML, the IB ports' read) is asked as a check
    asks it (engine.Looking): from an abandonable child, not again while a child abandoned
    before (by a run, a check or a snapshot) still waits in the kernel (the probe is hung:
    the replay says so), and the children this snapshot abandons are kept in the check's
    record. Before, each snapshot forked its children afresh and kept no record: taken by hand
    through a storage outage, each left one more process stuck behind the hung mount."""
    from rsc_health.engine import Looking

    looking = Looking(cfg, root)
    try:
        return _take_snapshot(cfg, root, node, looking)
    finally:
        looking.keep()


def _take_snapshot(cfg: Config, root: Path, node: str, looking) -> dict:
    from rsc_health.checks import BY_NAME, REGISTRY, CollectEnv
    from rsc_health.collect import gpu as gpu_mod
    from rsc_health.collect import ibports
    from rsc_health.collect.node import read_nvml

    env = CollectEnv(cfg, state=looking.state, hangs_before=looking.before)
    # The InfiniBand ports through the checks' own abandonable child: a counter read a wedged
    # HCA firmware holds in the kernel would hold the snapshot there for good. What it did
    # not answer (read_timeout_s) is not carried.
    ib = ibports.IbReader(root, None, ibports.port_files(g for f in REGISTRY for g in f.reads),
                          float(cfg.get("infiniband.read_timeout_s")), state=looking.state,
                          hangs_before=looking.before)
    doc: dict = {}
    if any(fam.nvml for fam in REGISTRY):
        # NVML's answers first (the leftover capture names who its processes are): what it
        # answered before a hang is kept, the GPUs it never reached marked unanswered, a hang
        # before the device count (or a child still waiting) is NVML's own timeout (a replay
        # says it could not ask, never a drain).
        read_nvml(cfg, root, looking.state, looking.before,
                  telemetry="telemetry" in BY_NAME)
        doc["nvml"] = looking.state.nvml_answers or dict(gpu_mod.UNANSWERED)
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    real_root = root.resolve()

    def inside(path: Path) -> str | None:
        try:
            return path.relative_to(real_root).as_posix()
        except ValueError:
            return None  # a link out of the root: not this node's to carry

    def grab(rel: str) -> None:
        # Each symlink on the way is carried as a link (where its directory really is), the
        # file where it really is: a replay resolves paths as the node did (the bridges
        # above a PCI device are the addresses on its resolved path).
        here = root
        for part in Path(rel).parts:
            here = here / part
            if here.is_symlink():
                where, target = inside(here.parent.resolve() / part), inside(here.resolve())
                if where is None or target is None:
                    return
                links.setdefault(where, target)
        real = inside((root / rel).resolve())
        if real is None:
            return
        text = ib.text(root / rel) if ibports.under_ports(rel) else _read(root / rel)
        if text is not None:
            files[real] = text

    for rel in SHARED_READS:
        grab(rel)
    for fam in REGISTRY:
        for pattern in fam.reads:
            for path in sorted(root.glob(pattern)):
                grab(path.relative_to(root).as_posix())
        for key in fam.reads_config:
            value = cfg.get(key, [])
            for source in [value] if isinstance(value, str) else value:
                grab(str(source).lstrip("/"))
        if fam.capture is not None:
            doc.update(fam.capture(cfg, root, env))
    return {
        "schema": SNAPSHOT_SCHEMA,
        "node": node or os.uname().nodename,
        "time": utcnow().isoformat(timespec="seconds"),
        "root": str(root),
        "config": masked(cfg.data),  # a bug report leaves the site: no database password
        "files": files,
        "links": links,
        **doc,
        "state": _local_state(cfg, root),
    }


def load_snapshot(path: Path) -> dict:
    """The snapshot document; ConfigError (a checker error naming the file) for anything that
    is not one: not JSON, not UTF-8, not an object, another schema."""
    from rsc_health.config import ConfigError

    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"{path}: not a {SNAPSHOT_SCHEMA} file ({str(exc)[:120]})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SNAPSHOT_SCHEMA:
        raise ConfigError(f"{path}: not a {SNAPSHOT_SCHEMA} file")
    return doc


def restore_snapshot(path: Path, into: Path, obj=None) -> tuple[Config, Path]:
    """Rebuild a snapshot as a root directory; the config is the snapshot's own unless
    --config was given.

    The snapshot is someone else's file (a bug report) and the replay is often run as root:
    nothing it names is written outside the replay root. Its paths lose their ".." parts, a
    link is made only when it and its target stay inside, every file is written only where
    its directory really is inside (links followed), and the config's state dir is taken
    inside the root whatever it says. ConfigError (`check`: a checker error, exit 4) for a
    document that is not a snapshot it can read, or a config that does not validate."""
    from rsc_health.config import ConfigError, state_dir, validated

    doc = load_snapshot(path)
    root = into / "root"
    root.mkdir(parents=True, exist_ok=True)
    tree = _Tree(root)
    try:
        tree.restore(doc)
        data = doc.get("config") if doc.get("config") is not None else {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: its config is not a table")
        data = dict(data)
        gpu = dict(data.get("gpu") or {})
        gpu.update(backend="replay", replay_file="rsc_health/nvml.json")
        data["gpu"] = gpu
        tree.write("rsc_health/nvml.json", json.dumps(doc.get("nvml") or {}))
        # Older snapshots have no probe record: their mounts are then probed under the root.
        probes = doc.get("mount_probes")
        if isinstance(probes, dict):
            tree.write(PROBES_FILE, json.dumps(probes))
        # The snapshot's config names files of the node it came from; opened here they would
        # be the replaying machine's (a catalog override naming /dev/watchdog, root's and
        # 0600, passes the catalog's trust rule and arms this machine's hardware watchdog):
        # the packaged catalogs judge the replay (helper-136).
        for section in ("xid", "sxid"):
            if isinstance(data.get(section), dict):
                data[section] = {**data[section], "catalog_override": ""}
        node = data.get("node")
        if isinstance(node, dict) and isinstance(node.get("state_dir"), str):
            data["node"] = {**node, "state_dir": "/" + _safe(node["state_dir"])}
        cfg = validated(data, path)
        if obj is not None and obj.config_path and obj.config_path != os.devnull:
            cfg = obj.config
            cfg.data.setdefault("gpu", {}).update(backend="replay")
        # The replay's records are the snapshot's own or none, whatever the config said: a
        # path joined to the root keeps its "..", and "/../../x" read the machine's x.
        cfg.data.setdefault("mounts", {})["probe_replay_file"] = \
            PROBES_FILE if isinstance(probes, dict) else ""
        # Site checks are programs: replaying would run this machine's, not look at the
        # snapshot's; what the node's printed is judged instead (older snapshots have no
        # record: none run).
        cfg.data.setdefault("site", {}).update(checks_dir="", nhc_conf="")
        if isinstance(doc.get("site_checks"), dict):
            tree.write(SITE_FILE, json.dumps(doc["site_checks"]))
            cfg.data["site"]["replay_file"] = SITE_FILE
        # Families that record what they read of the live machine (Family.replays) judge the
        # snapshot's record; an older snapshot without one gives them an empty record: nothing
        # of the machine replaying it is read or run.
        from rsc_health.checks import REGISTRY

        for fam in REGISTRY:
            if fam.replays:
                rec = doc.get(f"{fam.name}_record")
                rel = f"rsc_health/{fam.name}_record.json"
                tree.write(rel, json.dumps(rec if isinstance(rec, dict) else {}))
                cfg.data.setdefault(fam.config, {})["replay_file"] = rel
        # When the node read its counters: rates replay over the interval the node saw, not
        # over the time since (older snapshots have none: their rates are the replay's).
        clock = doc.get("telemetry_clock")
        if isinstance(clock, dict):
            tree.write(CLOCK_FILE, json.dumps(clock))
        cfg.data.setdefault("telemetry", {})["clock_replay_file"] = \
            CLOCK_FILE if isinstance(clock, dict) else ""
        sdir = Path(state_dir(cfg, root))
        if not tree.inside(sdir):  # --config's own state dir, through the snapshot's links
            raise ConfigError(f"{path}: the state dir {sdir} is not inside the replay")
        state = doc.get("state")
        if isinstance(state, dict):
            _write_state(state, sdir, tree)
    except (TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a {SNAPSHOT_SCHEMA} file ({str(exc)[:120]})") from None
    except OSError as exc:
        # Paths that cannot all stand (a file below a file, a link where the replay writes
        # its own files, a name too long): a snapshot this replay cannot rebuild is a checker
        # error (exit 4), never the WARN verdict of an uncaught error's exit 1 (helper-136).
        raise ConfigError(f"{path}: cannot be replayed ({type(exc).__name__}: "
                          f"{str(exc)[:160]})") from None
    return cfg, root


class _Tree:
    """Writes under a replay root that never land outside it, whatever links it holds."""

    def __init__(self, root: Path):
        self.root = root
        self.real = root.resolve()

    def inside(self, path: Path) -> bool:
        """`path` (links followed, as far as it exists) is the root or below it."""
        try:
            path.resolve().relative_to(self.real)
        except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (3.9)
            return False
        return True

    def directory(self, rel: str) -> Path | None:
        """root/rel made as a directory, or None where it would be outside."""
        path = self.root / _safe(rel)
        if not self.inside(path):
            return None
        path.mkdir(parents=True, exist_ok=True)
        return path if self.inside(path) else None

    def write(self, rel: str, text: str) -> None:
        dest = self.root / _safe(rel)
        parent = self.directory(str(dest.parent.relative_to(self.root)))
        if parent is None or not isinstance(text, str):
            return
        _write_new(parent / dest.name, text)

    def link(self, rel: str, target: str) -> None:
        dest = self.root / _safe(rel)
        parent = self.directory(str(dest.parent.relative_to(self.root)))
        # A link to one of the snapshot's files (a real node's /proc/mounts -> self/mounts) is
        # a link to that file; any other target is a directory the snapshot names.
        named = self.root / _safe(target)
        goal = named if named.is_file() and self.inside(named) else self.directory(target)
        if parent is None or goal is None or dest.name in ("", ".", "..") or \
                os.path.lexists(dest):
            return
        os.symlink(os.path.relpath(goal.resolve(), parent.resolve()), dest)
        if not self.inside(dest):
            dest.unlink()

    def restore(self, doc: dict) -> None:
        """The snapshot's files, symlinks and mount points under root (names kept inside)."""
        for rel, text in _items(doc.get("files")):
            if isinstance(text, str):
                self.write(rel, text)
        for rel, target in _items(doc.get("links")):
            if isinstance(target, str):
                self.link(rel, target)
        mountpoints = doc.get("mountpoints") or []
        if not isinstance(mountpoints, list):
            raise TypeError("mountpoints is not a list")
        for mp in mountpoints:
            if isinstance(mp, str):
                self.directory(mp)


def _items(value) -> list[tuple[str, object]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise TypeError(f"{type(value).__name__} where a table of paths belongs")
    return [(k, v) for k, v in value.items() if isinstance(k, str)]


def _write_new(path: Path, text: str) -> None:
    """A file of the replay: never through a link or a FIFO standing at its name."""
    from rsc_health.durable import _clear_name

    _clear_name(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
        fh.write(text)


def _write_state(state: dict, sdir: Path, tree: _Tree) -> None:
    """The node state files the snapshot carries (plain names only) into the state dir."""
    rel = str(sdir.relative_to(tree.root))
    for name, text in state.items():
        if isinstance(name, str) and isinstance(text, str) and name == Path(name).name \
                and not name.startswith("."):
            tree.write(f"{rel}/{name}", text)


def _safe(rel: str) -> str:
    """Snapshot paths are relative and never climb out of the replay root."""
    parts = [p for p in Path(str(rel).lstrip("/")).parts if p not in ("..", ".")]
    return "/".join(parts) or "."


@click.command()
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Write the snapshot (JSON) here; '-' for stdout.")
@click.pass_obj
def snapshot(obj, out: str) -> None:
    """Capture everything the checks read, NVML answers included, for `check --from`."""
    from rsc_health.config import resolve_node_config

    cfg, node = resolve_node_config(obj.config)
    doc = take_snapshot(cfg, obj.root, node)
    text = json.dumps(doc, indent=1, sort_keys=True, default=str)
    if out == "-":
        click.echo(text)
    else:
        from rsc_health.durable import write_atomic

        # As root writes every file: never through a symlink or FIFO planted at the name (a
        # person's --out is often in /tmp), and two snapshots to one name never interleave.
        try:
            write_atomic(Path(out), text + "\n", mode=0o600)
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc}") from None
        click.echo(f"snapshot of {len(doc['files'])} files written to {out}", err=True)
