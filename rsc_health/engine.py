"""The node engine: collect, evaluate, remember. Used by `healthctl check`, the prolog, the
epilog and the sweep.

`run` never raises: a collector or check that fails becomes a `checker` finding with
Status.ERROR (loud, never a drain by itself). Node-local state (the XID cursor and the counter
baselines) is saved under `state_dir(cfg, root)` only after the findings exist, so an event
is never consumed without being judged.
"""

from __future__ import annotations

import os
import time

from rsc_health.config import Config, state_dir
from rsc_health.durable import fsync_dir
from rsc_health.model import Finding, Severity, Status, utcnow

XID_CURSOR_FILE = "xid_cursor.json"
SXID_CURSOR_FILE = "sxid_cursor.json"
COUNTERS_FILE = "counters.json"
HANGS_FILE = "probe_hangs.json"  # rsc_health.collect.hangs
# The children a read-only run (`healthctl check`) abandoned: its own record, so that the
# next check does not fork one more child to join them in the kernel. Never the sweep's
# record (a check counts no sweep) and never judged from by the node path.
CHECK_HANGS_FILE = "probe_hangs.check.json"
# The node-local state the checks judge against (snapshots carry it for an exact replay);
# every Family.cursor is among them (tests/unit/test_family_contract.py).
STATE_FILES = (XID_CURSOR_FILE, SXID_CURSOR_FILE, COUNTERS_FILE, HANGS_FILE)


def _checker(family: str, component: str, reason: str) -> Finding:
    return Finding("checker", component, Status.ERROR, Severity.NONE, reason, f"{family}_error")


def _as_saved(cursor: dict) -> dict:
    """A loaded cursor as it was written: less the mtime kmsg.load_cursor adds (an unreadable
    one keeps its "lost" and never equals a new cursor, so it is written again)."""
    return {k: v for k, v in cursor.items() if k != "mtime"}


def _load_catalogs(cfg: Config, families: list[str], data: dict) -> list[tuple[str, Finding]]:
    """The XID and SXid catalogs of the families that judge them, into data; (family, checker
    finding) for each that does not load."""
    from rsc_health.xid import CatalogError, load_catalog, load_sxid_catalog

    bad = []
    for family, key, load in (("xid", "xid.catalog_override", load_catalog),
                              ("sxid", "sxid.catalog_override", load_sxid_catalog)):
        if family in families:
            try:
                data[f"{family}_catalog"] = load(cfg.get(key) or None)
            except CatalogError as exc:
                bad.append((family, _checker(family, f"{family} catalog",
                                             f"bad {family.upper()} catalog: {exc}")))
    return bad


def _unjudged(fam, state, new_cursors: dict) -> None:
    """A family whose check failed judged nothing of what it read: its cursor stays where it
    was and its counters keep their baselines, so the next run judges those events and that
    rise (a cursor saved anyway consumed the XID 79 the failed check never saw)."""
    new_cursors.pop(fam.name, None)
    if fam.counters is None:
        return
    try:
        keys = list(fam.counters(state))
    except Exception:  # noqa: BLE001 - then none of its baselines can be told apart
        return
    for key in keys:
        if key in state.baseline:
            state.counters[key] = state.baseline[key]
    from rsc_health.checks.state import time_key

    # Nor their time: a time moved without them would make the next rise's window too short.
    key = time_key(fam.name)
    if key in state.baseline:
        state.counters[key] = state.baseline[key]
    else:
        state.counters.pop(key, None)


def _forget_unread(baselines: dict, read: dict, families: list[str]) -> None:
    """A rate family (Family.rates_prefix) that read any of its counters keeps only the
    baselines it read: its next run would divide two intervals' rise by one. A family of
    per-sweep counters keeps its others (_keep_unread)."""
    from rsc_health.checks import BY_NAME

    for family in families:
        fam = BY_NAME[family]
        if not fam.rates_prefix:
            _keep_unread(baselines, read, fam)
            continue
        if any(k.startswith(fam.rates_prefix) for k in read):
            for key in [k for k in baselines if k.startswith(fam.rates_prefix) and k not in read]:
                del baselines[key]


def _keep_unread(baselines: dict, read: dict, fam) -> None:
    """A family of per-sweep counters (Family.counter_prefixes) whose time this run moved
    (checks.state.time_key) keeps the baseline of each counter it could not read (garbled,
    absent for a run) and when that was taken (checks.state.counter_time_key): the next read
    is judged against it, over the sweeps it spans. Dropped, the next read was a first
    baseline, no rise: a UE logged while ue_count read garbled never drained (helper-207).
    Kept with the family's new time, a rise over two sweeps was judged against one sweep's
    limit (helper-108). A counter read again has the family's time, its own is dropped."""
    from rsc_health.checks.state import counter_time_key, time_key

    family_key = time_key(fam.name)
    now, then = read.get(family_key), baselines.get(family_key)
    if not fam.counter_prefixes or now is None or now == then:
        return  # the time did not move (a job start, a failed check's restored time)
    for key in [k for k in baselines if k.startswith(fam.counter_prefixes) and k not in read]:
        own = counter_time_key(key)
        if own not in baselines and isinstance(then, int) \
                and not (fam.counter_keeps and key.endswith(fam.counter_keeps)):
            # A baseline of unknown age (no family time on record) stays untimed: judged
            # over the family's span, as any untimed baseline is.
            baselines[own] = then
    for key in [k for k in read if k.startswith(fam.counter_prefixes)]:
        baselines.pop(counter_time_key(key), None)


def _forget_unjudged(baselines: dict, unjudged: list[str]) -> None:
    """No baseline of a family no run of this boot has judged: what it read is a value since
    boot that the first run judging it must see whole, not a baseline that hides it (the
    counters of a check that failed on its first run after a reboot)."""
    from rsc_health.checks import BY_NAME
    from rsc_health.checks.state import counter_time_key, time_key

    for family in unjudged:
        fam = BY_NAME.get(family)
        prefixes = tuple(p for p in (fam.counter_prefixes if fam is not None else ())
                         for p in (p, counter_time_key(p)))
        for key in [k for k in baselines
                    if k == time_key(family) or (prefixes and k.startswith(prefixes))]:
            del baselines[key]


def _hangs_before(shared: dict, own: dict | None, boot_id: str) -> dict[str, dict]:
    """The probes on record as hanging: the node path's record, and for a read-only run also
    its own (CHECK_HANGS_FILE) where that names a child still waiting and the node path's
    does not (so neither run's stuck child is joined by another)."""
    from rsc_health.collect import hangs

    out = dict(hangs.current(shared, boot_id))
    for name, rec in (hangs.current(own, boot_id) if own is not None else {}).items():
        if hangs.still_waiting(rec) and not hangs.still_waiting(out.get(name)):
            out[name] = rec
    return out


def _keep_own_hangs(own, own_hangs: dict, state) -> None:
    """A read-only run's record of the children it left waiting (`own`, a hangs.Kept that
    writes only where a directory root's alone already stands: a check run by someone who
    cannot write there keeps none, and finds the children in /proc instead). It never says
    more than the run's findings already do."""
    from rsc_health.collect import hangs

    probes = hangs.update(own_hangs, state.boot_id, set(state.probes_asked),
                          {name: state.probe_pids.get(name) for name in state.hung_probes},
                          utcnow(), sweep=False, after_health=state.hung_after_health,
                          mounts=state.probe_mounts)
    own.save(probes, state.boot_id)


def _records(sdir: str | os.PathLike, root: str | os.PathLike, boot_id: str, *,
             read_only: bool, find_children: bool):
    """(the node path's record, the read-only runs' own or None, the probes on record as
    hanging before this run, the read-only run's own record as it stands). A record that may
    miss a child (a copy lost, a read-only run that cannot keep its own, find_children: the
    run cannot save one) has the children runs abandoned found in /proc (hangs.find_waiting)."""
    from rsc_health.collect import hangs

    rdir = hangs.runtime_dir(root)
    kept = hangs.Kept(HANGS_FILE, sdir, rdir, boot_id)
    own = hangs.Kept(CHECK_HANGS_FILE, sdir, rdir, boot_id, make=False) if read_only else None
    blind = find_children or kept.lost or (own is not None and (own.lost or not own.keepable()))
    found = hangs.find_waiting(root) if blind else {}
    now = utcnow()
    shared = hangs.with_found(kept.record, found, boot_id, now)
    own_hangs = hangs.with_found(own.record, found, boot_id, now) if own is not None else None
    return kept, own, _hangs_before(shared, own_hangs, boot_id), shared, own_hangs


class Looking:
    """The probes' hang records for a read-only look outside the engine (`healthctl
    snapshot`): read as a check reads them (`before`: a probe whose abandoned child still
    waits is not asked again), and the children the look abandons (`state`'s probes_asked,
    hung_probes, probe_pids, filled by the probes) kept in the check's record (`keep`)."""

    def __init__(self, cfg: Config, root: str | os.PathLike) -> None:
        from rsc_health.checks.state import NodeState
        from rsc_health.collect import kmsg

        self.state = NodeState(boot_id=kmsg.boot_id(root))
        _, self.own, self.before, _, self.own_hangs = _records(
            state_dir(cfg, root), root, self.state.boot_id, read_only=True,
            find_children=False)

    def keep(self) -> None:
        if self.own is not None and self.own_hangs is not None:
            _keep_own_hangs(self.own, self.own_hangs, self.state)


def run(
    cfg: Config,
    root: str | os.PathLike,
    *,
    only: set[str] | None = None,
    budget_s: float | None = None,
    save_state: bool = True,
    sweep: bool = False,
    stage: str | None = None,
) -> list[Finding]:
    """All findings for the node under `root` (or only the families in `only`).

    save_state=False is read-only (`healthctl check`, snapshots): the XID cursor and the
    counter baselines stay the sweep's, so what was new stays new for the next sweep. It keeps
    only its own record of the probe children it abandoned (CHECK_HANGS_FILE): a check run
    every minute on a node whose mount or driver hangs leaves one child stuck, not one each.
    sweep: a probe that hangs counts one more sweep in a row (collect.hangs)."""
    findings, commit = run_deferred(cfg, root, only=only, budget_s=budget_s,
                                    sweep=sweep and save_state, read_only=not save_state,
                                    stage=stage)
    if save_state:
        findings.extend(commit())
    return findings


class InFlight:
    """A run's collection as far as it got, for the watchdog that ends a run stuck in it (a
    read in the kernel no deadline reaches): `judged()` judges the families whose every input
    came in before the hang (NodeState.ready), so a GPU NVML already called lost still fails
    the job start. Nothing is consumed: no cursor or baseline is saved, the next run judges
    it all again. `findings`: the whole run's, once the checks are done."""

    def __init__(self, cfg: Config, only: set[str] | None = None) -> None:
        self.cfg = cfg
        self.only = only
        self.state = None  # checks.state.NodeState, set by collect_all
        self.findings: list[Finding] | None = None

    def judged(self) -> tuple[list[Finding], list[str]]:
        """(findings, the families not judged): the whole run's once done, else the ready
        families' own (their checks are pure: no I/O but the XID catalog's override)."""
        if self.findings is not None:
            return list(self.findings), []
        from rsc_health.checks import BY_NAME, FAMILIES

        families = [f for f in FAMILIES if not self.only or f in self.only]
        state = self.state
        if state is None:
            return [], families
        ready = [f for f in families if state.ready(BY_NAME[f])]
        found, no_catalog, _ = _judge(self.cfg, state, ready)
        return (_collector_errors(state) + found,
                [f for f in families if f not in ready or f in no_catalog])


def _collector_errors(state) -> list[Finding]:
    """The collectors' problems (NodeState.errors) as checker findings."""
    return [_checker(family, source, f"{family}: cannot read {source}: {message}")
            for family, source, message in list(state.errors)]


def _judge(cfg: Config, state, families: list[str]
           ) -> tuple[list[Finding], list[str], list[str]]:
    """Each family's check on the state: (findings, the families not judged because their
    catalog did not load, the families whose check raised). A whole run and the watchdog's
    judgement of what came in (InFlight) judge alike."""
    from rsc_health.checks import CHECKS

    data = dict(cfg.data)
    findings: list[Finding] = []
    judged = list(families)
    no_catalog = []
    for family, problem in _load_catalogs(cfg, judged, data):
        findings.append(problem)
        judged.remove(family)
        no_catalog.append(family)
    failed = []
    for family in judged:
        try:
            findings.extend(CHECKS[family](state, data))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            findings.append(_checker(family, family, f"{family} check failed: {exc!r}"))
            failed.append(family)
    return findings, no_catalog, failed


def run_deferred(
    cfg: Config, root: str | os.PathLike, *, only: set[str] | None = None,
    budget_s: float | None = None,
    sweep: bool = False, read_only: bool = False, find_children: bool = False,
    stage: str | None = None, inflight: InFlight | None = None,
):
    """(findings, commit): the node path calls commit() once what the findings say is safely
    spooled, so an event is never consumed without being recorded, and commit(events=False)
    when it could not spool them: only the record of the probe children abandoned is saved
    (it consumes nothing, and without it the next run forks one more child to join them).
    commit() returns checker findings for state it could not save; it never raises.
    read_only: see run(). find_children: the record may miss a child abandoned before this
    run (the state dir refuses writes; the node lock is held, and its holder's are not on it
    yet): the children runs abandoned are found in /proc. The record is still saved by
    commit() where it can be (a run without the lock counts its sweep of a probe that hangs,
    as one with it does).
    stage: the node path's stage, given to the collectors (CollectEnv.stage). inflight: see
    InFlight (the node path's watchdog)."""
    try:
        return _run(cfg, root, only=only, budget_s=budget_s, sweep=sweep,
                    read_only=read_only, find_children=find_children, stage=stage,
                    inflight=inflight)
    except Exception as exc:  # noqa: BLE001 - the contract: never raise
        return ([_checker("engine", "engine", f"checker failed: {type(exc).__name__}: {exc}")],
                lambda events=True: [])


def _run(
    cfg: Config, root: str | os.PathLike, *, only: set[str] | None, budget_s: float | None,
    sweep: bool,
    read_only: bool = False, find_children: bool = False, stage: str | None = None,
    inflight: InFlight | None = None,
):
    # Imported here so a broken collector module is a finding, not an ImportError in the prolog.
    from rsc_health.checks import BY_NAME, FAMILIES
    from rsc_health.checks.state import collect_all
    from rsc_health.collect import counters, hangs, kmsg
    started = time.monotonic()
    findings: list[Finding] = []
    unknown = set(only or ()) - set(FAMILIES)
    for family in sorted(unknown):
        findings.append(_checker(family, family, f"unknown check family {family!r}"))
    families = [f for f in FAMILIES if not only or f in only]

    sdir = state_dir(cfg, root)
    cursor_files: dict[str, str] = {f: c for f in families if (c := BY_NAME[f].cursor)}
    cursors = {f: kmsg.load_cursor(os.path.join(sdir, name)) for f, name in cursor_files.items()}
    previous = counters.load(os.path.join(sdir, COUNTERS_FILE))
    boot_id = kmsg.boot_id(root)
    kept, own, hangs_before, previous_hangs, own_hangs = _records(
        sdir, root, boot_id, read_only=read_only, find_children=find_children)
    if "lost" in previous:
        # Said by the one run that rebuilds it: the commit below writes it whole again.
        findings.append(_checker("state", os.path.join(sdir, COUNTERS_FILE),
                                 f"{COUNTERS_FILE} unreadable ({previous['lost'][:80]}); "
                                 "rebuilt: no counter deltas this run"))
    timeout = float(cfg.get("mounts.probe_timeout_s"))
    if budget_s is not None:
        # Leave the rest of the budget for everything else the collectors do.
        timeout = max(0.05, min(timeout, budget_s * 0.5))
    # Programs a family runs (site checks) must be done by here: the rest is judging.
    deadline = started + budget_s * 0.9 if budget_s is not None else None
    state, new_cursors = collect_all(
        cfg, root, only=set(families), cursors=cursors, previous_counters=previous,
        probe_timeout_s=timeout, deadline=deadline,
        hangs_before=hangs_before, stage=stage, sweep=sweep, inflight=inflight,
    )
    findings.extend(_collector_errors(state))
    # A refused GPU handle is kept as a hang is (since when, sweeps in a row), with no child.
    unanswered = {**{name: None for name in state.refused_probes},
                  **{name: state.probe_pids.get(name) for name in state.hung_probes}}
    state.hangs = hangs.update(previous_hangs, state.boot_id, set(state.probes_asked),
                               unanswered, utcnow(), sweep=sweep,
                               after_health=state.hung_after_health,
                               mounts=state.probe_mounts)
    if own is not None and own_hangs is not None:
        _keep_own_hangs(own, own_hangs, state)
    for probe, code in ((hangs.NVML, "nvml_hung"), (hangs.IB, "ib_hung")):
        if probe not in state.hung_probes:
            continue
        # Said on every run it hangs, with since when; after [gpu] nvml_hang_sweeps
        # ([infiniband] hang_sweeps) sweeps in a row the gpu (infiniband) check makes it the
        # node's fault (nvml_wedged, ib_wedged).
        hang = state.hangs[probe]
        findings.append(Finding(
            "checker", probe, Status.ERROR, Severity.NONE,
            f"{state.hung_probes[probe]}; not answering since {hang['since']} "
            f"({hang['sweeps']} sweep(s) in a row)", code, data={"probe": probe, **hang}))

    judged, no_catalog, failed = _judge(cfg, state, families)
    findings.extend(judged)
    for family in no_catalog:
        families.remove(family)
        new_cursors.pop(family, None)  # nothing judged: nothing consumed
    for family in failed:
        _unjudged(BY_NAME[family], state, new_cursors)
    # The families whose counters no run of this boot has judged yet, this one included: one
    # that did not run, read none of them or failed stays so (checks.state._read_counters).
    unjudged = sorted(state.unjudged - (state.counted - set(failed) - set(no_catalog)))

    def commit(events: bool = True) -> list[Finding]:
        # Each state file is written only when it changes: what is on disk already says the
        # same thing, made durable by the run that wrote it. A healthy run on a quiet node
        # (no new kernel log record, no counter moved, no probe hung) writes none of them and
        # pays no fsync for them (bench_prolog.py).
        unsaved = kept.save(state.hangs, state.boot_id)
        out = [_checker("state", os.path.join(sdir, HANGS_FILE), unsaved)] if unsaved else []
        if not events:
            return out
        renamed = False
        try:
            for family, cursor in new_cursors.items():
                if cursor != _as_saved(cursors[family]):
                    # One directory fsync below covers every name renamed into it.
                    kmsg.save_json(os.path.join(sdir, cursor_files[family]), cursor, sync_dir=False)
                    renamed = True
            # Merge: a partial run (--only) must not drop the other families' baselines.
            merged = dict((previous.get("counters") or {}) if previous.get("boot_id") in
                          (None, state.boot_id) else {})
            _forget_unread(merged, state.counters, families)
            merged.update((k, v) for k, v in state.counters.items() if k not in state.held)
            _forget_unjudged(merged, unjudged)
            if previous != counters.record(state.boot_id, merged, unjudged):
                counters.save(os.path.join(sdir, COUNTERS_FILE), merged, state.boot_id,
                              sync_dir=False, unjudged=unjudged)
                renamed = True
            if renamed:
                fsync_dir(sdir)
        except OSError as exc:
            return out + [_checker("state", os.fspath(sdir),
                                   f"cannot save state: {exc.strerror or exc}")]
        return out

    elapsed = time.monotonic() - started
    if budget_s is not None and elapsed > budget_s:
        findings.append(
            _checker("engine", "engine", f"checks took {elapsed:.2f}s, budget {budget_s:.2f}s")
        )
    return findings, commit
