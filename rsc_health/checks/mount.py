"""Expected mounts: present, of the expected type, writable when they should be, and alive.

All are drain-now (jobs would fail or hang on them) and transient (repair=False): a remount
fixes them, and a clean sweep resumes the node. A hung mount's statvfs child is not asked
again while it waits (collect.hangs), unless another mount stands at the path since (`umount
-l` and mount again): the child stuck on the detached one may never return.

The whole family lives here: what it reads (`collect`: the mount table through the shared
reader collect.mounts, and a statvfs probe of each expected mount in an abandonable child),
what a snapshot must carry to replay it (`capture`: the probes' outcomes, so a hung mount
replays as hung) and its policy.
"""

from __future__ import annotations

import os

from rsc_health.checks._finding import fail, ok
from rsc_health.collect import hangs, mounts
from rsc_health.collect.sysfs import pure
from rsc_health.model import Finding, Severity, utcnow
from rsc_health.record import asdict, dataclass, field

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

READS = ("proc/mounts", "proc/self/mountinfo")


@dataclass
class MountState:
    table: list[mounts.Mount]
    probes: dict[str, mounts.ProbeResult] = field(default_factory=dict)


def automounts_waiting(cfg, present: list[mounts.Mount]) -> list[str]:
    """Expected paths whose visible mount is autofs's trigger, where the config expects
    something else mounted there (or says nothing of the type)."""
    visible = {m.path: m.fstype for m in present}  # the last mount on a path is the visible one
    return [m["path"] for m in cfg.get("mounts.expected", [])
            if m.get("path") and visible.get(m["path"]) == "autofs"
            and m.get("fstype") != "autofs"]


def mounts_to_probe(cfg, present: list[mounts.Mount]) -> list[str]:
    """The expected mounts that are mounted: the ones statvfs must answer for."""
    mounted = {m.path for m in present}
    expected = [m.get("path") for m in cfg.get("mounts.expected", []) if m.get("path")]
    return [p for p in expected if p in mounted]


def _sharing_a_child(paths: list[str], records: dict) -> set[str]:
    """The paths whose abandoned child (pid and start time) is also another path's."""
    child = {p: (records[p].get("pid"), records[p].get("start")) for p in paths}
    return {p for p in paths if sum(1 for q in paths if child[q] == child[p]) > 1}


def _remounted(root: StrPath, paths: list[str], records: dict) -> set[str]:
    """The paths where another mount stands now than the one their child was abandoned on
    (the operator's remount: `umount -l` and mount again): that child may never return (a
    hard NFS mount whose server is gone, a FUSE daemon holding the request), and says nothing
    of the new mount, which is asked afresh. A record that names no mount (written before
    they did, or a child found in /proc) keeps its child as the answer."""
    named = [p for p in paths if records[p].get("mount")]
    now = mounts.standing(root, named) if named else {}
    return {p for p in named if p in now and now[p] != records[p]["mount"]}


SHARED_KEY = "mount_probe"


def start(root: StrPath, env) -> None:
    """Read the table and fork the statvfs children now (collect_all: before NVML or the
    InfiniBand ports are waited for, so a hung mount's wait overlaps theirs); `collect`
    takes their answers. Nothing is started for a replayed probe record."""
    if str(env.cfg.get("mounts.probe_replay_file", "") or ""):
        return
    env.shared[SHARED_KEY] = _begin(root, env)


def _begin(root: StrPath, env) -> tuple | None:
    """(table, expected mounts present, those whose child from before still waits, the
    children asking the others) or None when the table could not be read."""
    table = env.guard("mount", "/proc/mounts", lambda: mounts.collect(root))
    if table is None:
        return None
    to_probe = mounts_to_probe(env.cfg, table)
    before = {p: env.hangs_before.get(hangs.statvfs(p)) for p in to_probe}
    waiting = [p for p in to_probe if hangs.still_waiting(before[p])]
    # One child asks every mount; one left stuck on two mounts cannot say which of them
    # answered since: those are asked again, each in a child of its own. A path remounted
    # since its child was left is asked again too (the child may be stuck for good).
    alone = _sharing_a_child(waiting, before)
    again = alone | _remounted(root, waiting, before)
    waiting = [p for p in waiting if p not in again]
    asked = [p for p in to_probe if p not in waiting]
    probing = env.guard("mount", "statvfs", lambda: mounts.begin(root, asked, alone))
    return table, to_probe, waiting, probing


def collect(root: StrPath, env) -> MountState | None:
    cfg, state = env.cfg, env.state
    timeout = env.probe_timeout_s or float(cfg.get("mounts.probe_timeout_s", 2.0))
    replay = str(cfg.get("mounts.probe_replay_file", "") or "")
    if replay:  # a snapshot's recorded outcomes, not this machine's statvfs
        table = env.guard("mount", "/proc/mounts", lambda: mounts.collect(root))
        if table is None:
            return None
        found = MountState(table)
        found.probes = env.guard("mount", replay, lambda: mounts.replayed_probes(
            pure(os.path.join(root, replay.lstrip("/"))), mounts_to_probe(cfg, table))) or {}
    else:
        begun = env.shared.pop(SHARED_KEY) if SHARED_KEY in env.shared else _begin(root, env)
        if begun is None:
            return None
        table, to_probe, waiting, probing = begun
        found = MountState(table)
        found.probes = (env.guard("mount", "statvfs", lambda: mounts.finish(probing, timeout))
                        if probing is not None else None) or {}
        now = utcnow()
        for path in waiting:  # its statvfs from an earlier run has still not returned
            found.probes[path] = mounts.ProbeResult(
                path, False, True, hangs.waited_s(env.hangs_before[hangs.statvfs(path)], now))
        if automounts_waiting(cfg, table):
            # autofs unmounts an idle path; its trigger (fstype autofs) is all the table
            # showed. statvfs follows automounts, so the probe just mounted it (or failed
            # to): judge the table as the next job will find it.
            again = env.guard("mount", "/proc/mounts", lambda: mounts.collect(root))
            if again is not None:
                found.table = again
    state.probes_asked.append(hangs.STATVFS)
    left = [p for p, r in found.probes.items() if r.hung and r.pid is not None]
    for path, mount in (mounts.standing(root, left) if left else {}).items():
        state.probe_mounts[hangs.statvfs(path)] = mount  # a remount is then told apart
    for path, result in found.probes.items():
        if result.checker_fault:  # the checker's error (engine), never mount_error's drain
            state.errors.append(("mount", hangs.statvfs(path), str(result.error)))
        if result.hung:
            state.hung_probes[hangs.statvfs(path)] = (
                f"statvfs {path}: no answer within {result.seconds:.1f}s")
            state.probe_pids[hangs.statvfs(path)] = result.pid
    return found


def capture(cfg, root: StrPath, env) -> dict:
    """What a snapshot carries beyond the files: each expected mount point (a directory in
    the replay root) and the statvfs probe's outcome for each one present, probed as a run
    probes them (`collect`): a mount whose child abandoned before still waits is not asked
    again (it is hung), and the children this one abandons are named in env.state."""
    found = collect(root, env)
    return {"mountpoints": [m.get("path") for m in cfg.get("mounts.expected", [])],
            "mount_probes": {p: asdict(r) for p, r in (found.probes if found else {}).items()}}


def check(state, cfg: dict) -> list[Finding]:
    expected = cfg.get("mounts", {}).get("expected", [])
    found = state.extra.get("mount")
    if found is None:
        return []
    # The last mount on a path is the visible one (mounts stack).
    by_path = {m.path: m for m in found.table}
    out: list[Finding] = []
    for want in expected:
        path = want.get("path")
        if not path:
            continue
        m = by_path.get(path)
        fstype = want.get("fstype")
        if m is None or (fstype and m.fstype != fstype):
            got = f"{m.fstype} mounted" if m else "not mounted"
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_missing",
                     f"{path} {got}, expected {fstype or 'a mount'}", repair=False)
            )
            continue
        probe = found.probes.get(path)
        if probe is not None and probe.hung:
            # Since when and for how many sweeps (collect.hangs): the heartbeat and textfile
            # name the probe; the reason, which Slurm shows, stays short.
            name = hangs.statvfs(path)
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_hung",
                     f"{path} ({m.fstype}) did not answer statvfs in {probe.seconds:.1f}s",
                     repair=False, probe=name, **getattr(state, "hangs", {}).get(name, {}))
            )
        elif probe is not None and not probe.ok and not probe.checker_fault:
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_error",
                     f"{path} ({m.fstype}) statvfs failed: {probe.error}", repair=False)
            )
        elif want.get("rw", True) and m.read_only:
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_ro",
                     f"{path} ({m.fstype}) is read-only", repair=False)
            )
        elif probe is None or not probe.checker_fault:  # else: a checker error, not ok
            out.append(ok("mount", path, f"{path} {m.fstype} ok"))
    return out
