"""Out-of-service periods that are not a node's own: planned maintenance (by reason or a
MAINT reservation) and fleet-wide events (many nodes out within a few minutes), and the XIDs
that are the application's own. Read by the lemon features, the reliability metrics, the job
failure attribution and the GPU attribution alike, so it sits below all of them
(tests/unit/test_import_graph.py)."""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, select, union

from rsc_health.config import packaged_default
from rsc_health.model import QUALIFY_RESERVATION_PREFIX, REASON_PREFIX

log = logging.getLogger(__name__)

FLEET_FLOOR = 5.0
# Nodes are drained for a maintenance reservation up to this long before it starts: the lemon
# outage counts leave such a drain out. Not the job failure attribution or the reliability
# figures (planned_maintenance): there an outage that began before the window opened is the
# node's own (a crash half an hour before it is no planned drain).
MAINT_LEAD = pd.Timedelta(hours=1)
# The packaged [lemon] keys for outages that are not a node's own.
OUTAGE_DEFAULTS: dict[str, Any] = {
    key: packaged_default(f"lemon.{key}")
    for key in ("maintenance_reason_patterns", "fleet_event_nodes", "fleet_event_share",
                "fleet_event_window_s", "episode_gap_h", "rate_window_days", "rate_min_episodes",
                "incident_alpha", "ticket_lag_h")
}


def application_xid_codes(catalog_override: str | None = None) -> tuple[str, ...]:
    """check_results codes ("xid13") of the XIDs the catalog marks as the application's own
    errors: the packaged catalog, with the site's `[xid] catalog_override` over it where given
    (the merge the node judges by, xid.load_catalog, held to the same trust rule). Raises
    xid.CatalogError when the override cannot be used."""
    from rsc_health.xid import load_catalog

    return tuple(f"xid{c}" for c in
                 sorted(load_catalog(catalog_override or None).application_codes()))


def _site_application_xids(catalog_override: str | None) -> tuple[tuple[str, ...], str]:
    """(application XID codes, problem): the site catalog's, or where its override cannot be
    used on this host (missing, unreadable, not root's, invalid) the packaged catalog's and
    why, for every command to say (OutageRules.xid_catalog_problem)."""
    from rsc_health.xid import CatalogError

    try:
        return application_xid_codes(catalog_override), ""
    except CatalogError as exc:
        return application_xid_codes(), (
            f"[xid] catalog_override {catalog_override} not used: {exc}; the XIDs the site "
            "marks as the application's own are counted against the nodes (only the packaged "
            "catalog's application XIDs are left out)")


@dataclass(frozen=True)
class OutageRules:
    """Which out-of-service periods are not the node's own: planned maintenance (by reason)
    and fleet-wide events (many nodes out within a few minutes)."""

    maintenance_reason_patterns: tuple[str, ...] = tuple(
        OUTAGE_DEFAULTS["maintenance_reason_patterns"]
    )
    fleet_event_nodes: int = OUTAGE_DEFAULTS["fleet_event_nodes"]
    fleet_event_share: float = OUTAGE_DEFAULTS["fleet_event_share"]
    fleet_event_window_s: float = OUTAGE_DEFAULTS["fleet_event_window_s"]
    # How a node's events become episodes and are judged against its peers' rate.
    episode_gap_h: float = OUTAGE_DEFAULTS["episode_gap_h"]
    rate_window_days: float = OUTAGE_DEFAULTS["rate_window_days"]
    rate_min_episodes: int = OUTAGE_DEFAULTS["rate_min_episodes"]
    incident_alpha: float = OUTAGE_DEFAULTS["incident_alpha"]
    ticket_lag_h: float = OUTAGE_DEFAULTS["ticket_lag_h"]
    # The check_results codes of the XIDs that are the application's own, never the node's:
    # the packaged catalog's, with the site's [xid] catalog_override over it (from_config).
    application_xids: tuple[str, ...] = field(default_factory=application_xid_codes)
    # Why the site's override was not used (it is not on this host, or not trusted): the
    # packaged catalog's application XIDs are then; every command says so, and `healthctl
    # lemons --apply` drains nothing on them.
    xid_catalog_problem: str = ""

    @property
    def gap(self) -> pd.Timedelta:
        return pd.Timedelta(hours=self.episode_gap_h)

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None = None, *,
                    xid_catalog_override: str | None = None) -> OutageRules:
        """The [lemon] keys over the packaged ones, and the application XIDs of the catalog
        with `xid_catalog_override` ([xid] catalog_override) over it."""
        merged = {**OUTAGE_DEFAULTS, **(section or {})}
        for pattern in merged["maintenance_reason_patterns"]:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"[lemon] maintenance_reason_patterns: {pattern!r} is not a regular "
                    f"expression ({exc})"
                ) from exc
        return cls(
            tuple(merged["maintenance_reason_patterns"]),
            int(merged["fleet_event_nodes"]),
            float(merged["fleet_event_share"]),
            float(merged["fleet_event_window_s"]),
            float(merged["episode_gap_h"]),
            float(merged["rate_window_days"]),
            int(merged["rate_min_episodes"]),
            float(merged["incident_alpha"]),
            float(merged["ticket_lag_h"]),
            *_site_application_xids(xid_catalog_override),
        )

    @classmethod
    def of_site(cls, cfg) -> OutageRules:
        """The rules of a site's config (config.Config): its [lemon] keys, and its [xid]
        catalog_override's application XIDs. An override this host cannot use is warned of
        on stderr and kept in xid_catalog_problem."""
        rules = cls.from_config(cfg.section("lemon"),
                                xid_catalog_override=cfg.get("xid.catalog_override"))
        if rules.xid_catalog_problem:
            log.warning("%s", rules.xid_catalog_problem)
        return rules

    def fleet_threshold(self, fleet_size: int) -> float:
        """Nodes out together that make an event fleet-wide (inf: off)."""
        limits: list[float] = []
        if self.fleet_event_nodes > 0:
            limits.append(self.fleet_event_nodes)
        if self.fleet_event_share > 0 and fleet_size > 0:
            # never fewer than FLEET_FLOOR nodes: on a small fleet a share is two or three
            # nodes, and two independent failures in five minutes do happen
            limits.append(max(FLEET_FLOOR, self.fleet_event_share * fleet_size))
        return min(limits) if limits else float("inf")


@lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    return tuple(re.compile(p) for p in patterns)


def planned_pattern(reason: str, rules: OutageRules) -> str | None:
    """The first of `maintenance_reason_patterns` (in the configured order) that `reason`
    matches, or None; never for rsc-health's own reasons. Each pattern alone, by Python's re,
    as OutageRules.from_config validated it: joined with "|" a second "(?i)" is an error to
    Python's re, and a string column's own engine (pyarrow's RE2) refuses lookarounds the
    config accepts."""
    if reason.startswith(REASON_PREFIX):
        return None
    for pattern, rx in zip(rules.maintenance_reason_patterns,
                           _compiled(rules.maintenance_reason_patterns), strict=True):
        if rx.search(reason):
            return pattern
    return None


def _planned(events: pd.DataFrame, rules: OutageRules) -> pd.Series:
    """planned_pattern of each row's reason (object Series; None where none matches)."""
    reason = events["reason"].fillna("").astype(str)
    # Asked once per distinct reason: a fleet's outages repeat a few dozen reasons.
    found = {r: planned_pattern(r, rules) for r in reason.unique()}
    return pd.Series([found[r] for r in reason], index=events.index, dtype=object)


def classify_outages(
    events: pd.DataFrame,
    rules: OutageRules,
    fleet_size: int,
    maintenance: Sequence[tuple[set[str], datetime, datetime | None]] = (),
    lead: pd.Timedelta = MAINT_LEAD,
) -> pd.Series:
    """Per node_events row (columns node, start, reason): "maintenance", "fleet" or "node"
    (the node's own). Fleet-wide: the row's start has at least the threshold of distinct nodes
    going out within fleet_event_window_s either side. `maintenance`: (nodes, start, end) of
    the MAINT reservations; a row that starts up to `lead` before one is in it."""
    kind = pd.Series("node", index=events.index, dtype=object)
    if events.empty:
        return kind
    starts = pd.to_datetime(events["start"])
    for nodes, start, end in maintenance:
        inside = events["node"].isin(nodes) & (starts >= pd.Timestamp(start) - lead)
        if end is not None:
            inside &= starts <= pd.Timestamp(end)
        kind[inside] = "maintenance"
    if rules.maintenance_reason_patterns:
        kind[_planned(events, rules).notna()] = "maintenance"
    threshold = rules.fleet_threshold(fleet_size)
    if np.isfinite(threshold) and len(events) >= threshold:
        order = events.sort_values("start")
        t = pd.to_datetime(order["start"]).to_numpy("datetime64[s]").view(np.int64)
        w = int(rules.fleet_event_window_s)
        lo = np.searchsorted(t, t - w, side="left")
        hi = np.searchsorted(t, t + w, side="right")
        crowded = np.flatnonzero(hi - lo >= threshold)  # rows, before counting distinct nodes
        nodes = order["node"].to_numpy()
        fleet = [order.index[i] for i in crowded
                 if len(set(nodes[lo[i]:hi[i]])) >= threshold]
        kind[fleet] = kind[fleet].where(kind[fleet] == "maintenance", "fleet")
    return kind


def planned_maintenance(
    events: pd.DataFrame,
    rules: OutageRules,
    maintenance: Sequence[tuple[set[str], datetime, datetime | None]] = (),
) -> pd.Series:
    """Per node_events row (node, start, reason): True where it is planned maintenance (a
    maintenance reason, or it began inside a MAINT reservation), classify_outages' first rule
    alone. For a reader that sees a few rows and not the fleet around them (the job failure
    attribution, the reliability figures): whether many nodes went out together cannot be
    told from those. No MAINT_LEAD: an outage that began before the reservation opened is the
    node's own (a node crashing half an hour before a firmware window failed its job)."""
    alone = replace(rules, fleet_event_nodes=0, fleet_event_share=0.0)
    return classify_outages(events, alone, 0, maintenance, lead=pd.Timedelta(0)) == "maintenance"


def maintenance_reservations(
    engine: Engine, hi: datetime, cluster: str | None = None
) -> list[tuple[set[str], datetime, datetime | None]]:
    """(nodes, start, end) of every reservation with the MAINT flag that began before `hi`:
    classify_outages' `maintenance`. rsc-health's own qualification reservations
    (rsc_health_qualify_<node>, MAINT so that Slurm holds the node for the burn-in) are not
    maintenance: a node that crashes under its qualification load failed on its own."""
    from rsc_health.historian.ingest.sacct_parse import expand_nodelist
    from rsc_health.historian.schema import reservations as r

    stmt = select(r.c.nodelist, r.c.start, r.c.end, r.c.flags).where(
        r.c.start < hi, ~r.c.name.startswith(QUALIFY_RESERVATION_PREFIX, autoescape=True))
    if cluster is not None:
        stmt = stmt.where(r.c.cluster == cluster)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    out = []
    for nodelist, start, end, flags in rows:
        if "MAINT" not in {f.strip().upper() for f in flags.split(",")}:
            continue
        hosts = expand_nodelist(nodelist)  # bounded; a str says why it is not a hostlist
        if isinstance(hosts, list):
            out.append((set(hosts), start, end))
    return out


def nodes_seen(engine: Engine, lo: datetime, hi: datetime,
               on_jobs: Collection[str] = ()) -> set[str]:
    """The nodes seen in [lo, hi): `on_jobs` (those a job ended on, which the window's job
    counts already read from job_nodes), and those with a check interval or an
    out-of-service period in the window. The fleet a fleet-wide event is a share of."""
    from rsc_health.historian.schema import check_results, node_events

    stmt = union(
        select(check_results.c.node).where(
            check_results.c.time < hi, check_results.c.last_seen >= lo
        ),
        select(node_events.c.node).where(node_events.c.start >= lo, node_events.c.start < hi),
    )
    with engine.connect() as conn:
        return set(on_jobs) | {r[0] for r in conn.execute(stmt)}


MAINT_RESERVATION = "a MAINT reservation"


def removed_by_cause(events: pd.DataFrame, kind: pd.Series, rules: OutageRules,
                     fleet_size: int) -> dict[str, dict[str, int]]:
    """What classify_outages left out of `events` (its `kind`), counted by cause:
    {"maintenance": {pattern or MAINT_RESERVATION: rows}, "fleet": {"fleet-wide event": rows}}.
    A maintenance row is counted under the first of `maintenance_reason_patterns` its reason
    matches (in the configured order), else under the MAINT reservation it fell in.
    `fleet_size`: as given to classify_outages."""
    out: dict[str, dict[str, int]] = {"maintenance": {}, "fleet": {}}
    if events.empty:
        return out
    maint = events.loc[kind[kind == "maintenance"].index]
    by = _planned(maint, rules).value_counts()
    counted = 0
    for pattern in rules.maintenance_reason_patterns:  # the configured order
        if by.get(pattern, 0):
            out["maintenance"][pattern] = int(by[pattern])
            counted += int(by[pattern])
    if len(maint) > counted:
        out["maintenance"][MAINT_RESERVATION] = len(maint) - counted
    fleet = int((kind == "fleet").sum())
    if fleet:
        out["fleet"][f"fleet-wide event (>= {rules.fleet_threshold(fleet_size):g} "
                     f"nodes within {rules.fleet_event_window_s:g} s)"] = fleet
    return out


def describe_removed(removed: Mapping[str, Any]) -> str:
    """One line of what the filters left out (removed_by_cause's counts, and
    "application_xids" when given): "left out: 899 maintenance (Maintenance: 734, ...), ..."."""
    parts = []
    for kind, label in (("maintenance", "maintenance"), ("fleet", "fleet-wide")):
        by = removed.get(kind) or {}
        if by:
            causes = ", ".join(f"{cause!r}: {n}" for cause, n in
                               sorted(by.items(), key=lambda kv: -kv[1]))
            parts.append(f"{sum(by.values())} {label} outages ({causes})")
    if removed.get("application_xids"):
        parts.append(f"{removed['application_xids']} application-class XIDs")
    return "left out: " + ("; ".join(parts) if parts else "nothing")
