"""`healthctl node NODE`: one node's story on one screen (issue 14) — Slurm's state and
reason, the node path's last runs, what is failing now, what rsc-health and people did to it
and why, the failed jobs blamed on it, its tickets, and why it is or is not a lemon.

Slurm and the historian are asked separately: either one away still shows the other half.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from rsc_health.model import LOWER_IS_WORSE
from rsc_health.terminal import echo


def gather_node(ctx: click.Context, node: str, now: datetime) -> dict:
    doc: dict = {"node": node, "time": now.isoformat(timespec="seconds"), "slurm": None,
                 "historian": None, "problems": []}
    try:
        from rsc_health.slurm import SlurmError, from_config

        try:
            info = from_config(ctx.obj.config).node(node)
            doc["slurm"] = {"state": info.state, "reason": info.reason,
                            "reason_user": info.reason_user,
                            "since": info.reason_time.isoformat() if info.reason_time else None,
                            "partitions": list(info.partitions)}
        except SlurmError as exc:
            doc["problems"].append(f"Slurm not consulted: {exc}")
    except ImportError as exc:  # pragma: no cover - slurm/ is part of every install
        doc["problems"].append(f"Slurm not consulted: {exc}")
    from rsc_health.report.links import Links

    # The same places the nightly report links this node to ([report] node_url/dashboard_url).
    doc["links"] = Links.from_config(ctx.obj.config.section("report")).of(node)
    if not ctx.obj.historian_configured:
        doc["problems"].append("no historian configured: history not shown")
        return doc
    try:
        doc["historian"] = _history(ctx, node, now.replace(tzinfo=None))
    except ImportError as exc:
        doc["problems"].append(f"historian not installed here ({exc.name}): history not shown")
    except Exception as exc:  # noqa: BLE001 - the Slurm half still stands
        first = (str(getattr(exc, "orig", None) or exc).splitlines() or [type(exc).__name__])[0]
        doc["problems"].append(f"historian unavailable: {first}")
    return doc


def _history(ctx: click.Context, node: str, now: datetime) -> dict:
    from sqlalchemy import desc, select

    from rsc_health.historian import schema
    from rsc_health.historian.db import connect
    from rsc_health.historian.freshness import node_freshness, stale_after_s
    from rsc_health.historian.intervals import open_failures

    cfg = ctx.obj.config
    engine = connect(ctx.obj.database_url, create_missing=False,
                     statement_timeout_s=ctx.obj.statement_timeout_s)
    try:
        fresh = node_freshness(engine, now, stale_after_s(cfg), nodes=[node])[0]
        with engine.connect() as conn:
            runs = [dict(r._mapping) for r in conn.execute(
                select(schema.node_runs).where(schema.node_runs.c.node == node))]
            failing = open_failures(conn, node)
            a = schema.node_actions
            actions = [dict(r._mapping) for r in conn.execute(
                select(a.c.time, a.c.action, a.c.reason, a.c.job_id).where(a.c.node == node)
                .order_by(desc(a.c.time)).limit(SAMPLE))]
            j, at, c = schema.jobs, schema.attributions, schema.check_results
            # The finding each failure is blamed on (attribute.py picks it: the drain's own
            # code, else the most severe, then the earliest), with the component it was on:
            # which GPU an RMA is for.
            blamed = [dict(r._mapping) for r in conn.execute(
                select(j.c.job_id, j.c.name, j.c.user, j.c.state, j.c.end, j.c.gpus,
                       at.c.cause, at.c.code, c.c.component)
                .select_from(at.join(j, at.c.job_pk == j.c.id)
                             .outerjoin(c, c.c.id == at.c.evidence))
                .where(at.c.node == node).order_by(desc(j.c.end)).limit(SAMPLE))]
            # One name per GPU (rsc_health.gpuname): `gpu1 (0000:1a:00.0)` whichever half
            # a finding knew, as the nightly report names it.
            from rsc_health.historian.gpu_names import gpu_names

            names = gpu_names(conn, [node])[node]
            for row in failing:
                row["component"] = names.name(str(row["component"]))
            for row in blamed:
                if row.get("component") is not None:
                    row["component"] = names.name(str(row["component"]))
            t = schema.tickets
            tickets = [dict(r._mapping) for r in conn.execute(
                select(t.c.id, t.c.opened, t.c.closed, t.c.reason, t.c.source)
                .where(t.c.node == node).order_by(desc(t.c.opened)).limit(SAMPLE))]
            # The lists above are the newest SAMPLE; the figures an operator weighs a pull
            # on are counted apart (a node with 250 failed jobs read "20").
            totals = {
                "actions": _count(conn, a, a.c.node == node),
                "failed_jobs": _count(conn, at, at.c.node == node),
                "tickets": _count(conn, t, t.c.node == node),
            }
            known = bool(runs or fresh.last_seen is not None or actions or blamed or tickets
                         or _any(conn, schema.job_nodes, schema.job_nodes.c.node == node)
                         or _any(conn, schema.node_events, schema.node_events.c.node == node)
                         # a node racked and inventoried that has not reported yet is one
                         or _any(conn, schema.node_inventory,
                                 schema.node_inventory.c.node == node)
                         or _any(conn, schema.telemetry_samples,
                                 schema.telemetry_samples.c.node == node))
        from rsc_health.historian.held import held_verdicts, held_within

        held = held_verdicts(engine, now, held_within(cfg), nodes=[node])
        lemon = _lemon(engine, cfg, node, now)
        triaged = _triage(engine, cfg, node, now)
        from rsc_health.qualify.store import latest_runs

        with engine.connect() as conn:
            qualified = latest_runs(conn, node, limit=3)
            versions = _versions(conn, node)
        from rsc_health.historian.suspects import of_node

        suspect = [e.as_dict() for e in of_node(engine, node, limit=3)]
        from rsc_health.historian.telemetry import latest_rollups

        telemetry = latest_rollups(engine, node, cfg)
    finally:
        engine.dispose()
    return {
        # False: no run, check, action, job, event, ticket, inventory row, qualification,
        # suspect episode or version of this name (a mistyped name is not a node whose
        # checks stopped; _unknown also asks Slurm).
        "known": bool(known or qualified or suspect or versions or telemetry["job"]
                      or telemetry["day"]),
        "totals": totals,
        "freshness": {"last_seen": fresh.last_seen, "source": fresh.last_source,
                      "level": fresh.last_level, "stale": fresh.stale,
                      "checker_errors": fresh.checker_errors},
        "runs": runs, "open_findings": failing, "actions": actions, "failed_jobs": blamed,
        "tickets": tickets, "lemon": lemon, "triage": triaged, "qualified": qualified,
        "suspect": suspect, "telemetry": telemetry, "versions": versions,
        # A drain verdict the node keeps and has not carried out (guard, or a drain not ours).
        "held": {"time": held[0].time, "action": held[0].action, "reason": held[0].reason}
        if held else None,
    }


# How many of a node's actions, failed jobs and tickets are read and listed (newest first).
SAMPLE = 20
# How many of each are printed.
SHOWN = {"actions": 10, "failed_jobs": 10, "tickets": 5, "open_findings": 10}


def _count(conn, table, where) -> int:
    from sqlalchemy import func, select

    return int(conn.execute(select(func.count()).select_from(table).where(where)).scalar() or 0)


def _any(conn, table, where) -> bool:
    from sqlalchemy import literal, select

    return conn.execute(select(literal(1)).select_from(table).where(where).limit(1)).first() \
        is not None


def _cut(h: dict, key: str) -> str:
    """' (newest N listed)' when the printed list is shorter than the count, else ''."""
    total = h.get("totals", {}).get(key, len(h[key]))
    listed = min(len(h[key]), SHOWN[key])
    return f" (newest {listed} listed)" if listed < total else ""


def _versions(conn, node: str) -> dict | None:
    """The node's driver and GPU firmware as its heartbeats said them (node_versions): since
    when, and what they were before (qualification's driver/firmware trigger)."""
    from sqlalchemy import select

    from rsc_health.historian.schema import node_versions as v

    row = conn.execute(select(v.c.versions, v.c.since, v.c.previous)
                       .where(v.c.node == node)).first()
    return dict(row._mapping) if row else None


def _triage(engine, cfg, node: str, now: datetime) -> dict:
    """The node's failed jobs in the lemon window, each labelled host, user or unknown
    (historian/triage.py), newest first."""
    from datetime import timedelta

    from rsc_health.historian.attribute import Window
    from rsc_health.historian.lemons.features import OutageRules
    from rsc_health.historian.lemons.verdicts import DEFAULTS
    from rsc_health.historian.triage import summary, triage

    section = {**DEFAULTS, **cfg.section("lemon")}
    lo = now - timedelta(days=float(section["window_days"]))
    df = triage(engine, lo, now, window=Window.from_config(cfg),
                rules=OutageRules.of_site(cfg), node=node)
    jobs = [{"job_id": r.job_id, "end": r.end, "state": r.state, "label": r.label,
             "blamed": node in r.nodes, "evidence": list(r.evidence)}
            for r in df.iloc[::-1].head(20).itertuples()]
    return {"since": lo, "labels": summary(df), "jobs": jobs}


def _lemon(engine, cfg, node: str, now: datetime) -> dict:
    """The node's verdict from lemon_verdicts, the one door `healthctl lemons`, the report
    and the exporter go through (the threshold rules and the repeat-offender rule); for a
    node it does not list, how near the rules came."""
    from rsc_health.historian.lemons.features import OutageRules, lemon_features
    from rsc_health.historian.lemons.verdicts import (
        DEFAULTS,
        LemonRules,
        crossings_frame,
        lemon_verdicts,
    )

    section = {**DEFAULTS, **cfg.section("lemon")}
    window_days = float(section["window_days"])
    features = lemon_features(engine, now, window_days,
                              early_fail_minutes=float(section["early_fail_minutes"]),
                              history_days=float(section["history_days"]),
                              outages=OutageRules.of_site(cfg),
                              host_jobs=False)  # the rules' features; _triage shows the jobs
    rules = LemonRules.from_config(section)
    if node not in features.index:
        return {"candidate": False, "why": "no activity in the lemon window", "features": {}}
    # The whole fleet's features: the peer-rate rules judge a node against its group.
    verdict = next((v for v in lemon_verdicts(engine, features, now, rules,
                                              window_days=window_days, with_evidence=False)
                    if str(v.node) == node), None)
    row = {k: (float(v) if hasattr(v, "__float__") else v)
           for k, v in features.loc[node].items() if k in rules.thresholds}
    if verdict is not None:
        fired = [c.feature for c in verdict.crossings]
        strong = [f for f in fired if f in rules.strong]
        reasons = [f"rules fired: {', '.join(fired)}" + (
            f" (strong: {', '.join(strong)})" if strong else "")] if fired else []
        if verdict.repeat_offender:
            fired = ["repeat_offender", *fired]
            back = f" {verdict.resumed_at:%Y-%m-%d %H:%M}" if verdict.resumed_at else ""
            reasons.insert(0, f"repeat_offender: failed a job again since its lemon repair "
                              f"(back{back})")
        return {"candidate": True, "why": "; ".join(reasons), "fired": fired,
                "features": {k: v for k, v in row.items() if v}}
    crossed = crossings_frame(features, rules)
    fired = [f for f in crossed.columns if crossed.at[node, f]]
    if fired:
        why = (f"{len(fired)} of {rules.min_signals} rules needed fired ({', '.join(fired)}); "
               "no strong rule")
    else:
        why = "no rule fired"
    return {"candidate": False, "why": why, "fired": fired,
            "features": {k: v for k, v in row.items() if v}}


# What each telemetry metric (rsc_health.model.Metric) is, for a person reading its rollup.
_LABELS = {
    "sm_clock_ratio": "SM clock / max (min GPU)",
    "throttle_hw_frac": "time HW-throttled (max GPU)",
    "throttle_power_frac": "time power-capped (max GPU)",
    "gpu_temp_c": "GPU temperature C (max)",
    "power_ratio": "power / limit (max GPU)",
    "pcie_link_ratio": "PCIe gen x width / max",
    "pcie_replay_rate": "PCIe replays / s (max GPU)",
    "nvlink_error_rate": "NVLink errors / s (max GPU)",
    "ib_xmit_wait_rate": "IB xmit_wait / s (max port)",
    "ib_link_ratio": "IB rate / expected (min)",
    "nvlink_data_rate": "NVLink B/s (min busy GPU)",
    "remapped_rows": "rows remapped (max GPU)",
    "remap_low_banks": "banks low on remap (max GPU)",
    "ib_error_rate": "IB link errors / s (max port)",
}


def _echo_telemetry(h: dict) -> None:
    """The node's telemetry rollups: its last multi-node job, its last day outside jobs."""
    tel = h.get("telemetry") or {}
    if not tel.get("job") and not tel.get("day"):
        echo("  telemetry no rollups (none of its samples rolled up yet)")
    if tel.get("job"):
        jr = tel["job"]
        for line in _rollup_lines(f"  telemetry last multi-node job {jr['job_id']} "
                                  f"({_fmt(jr['start'])} to {_fmt(jr['end'])})",
                                  jr["metrics"]):
            echo(line)
    if tel.get("day"):
        for line in _rollup_lines(f"  telemetry last day outside jobs {tel['day']['day']}",
                                  tel["day"]["metrics"]):
            echo(line)


def _num(x) -> str:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "?"
    return f"{x:.3g}"


def _rollup_lines(title: str, metrics: dict) -> list[str]:
    lines = [title]
    for name, st in metrics.items():
        frac = st.get("past_frac")
        side = "under" if name in LOWER_IS_WORSE else "over"
        past = (f"  {frac:.0%} {side} {st['limit']:g}" if isinstance(frac, float)
                and st.get("limit") is not None else "")
        worst = f"  worst {st['worst']}" if st.get("worst") else ""
        lines.append(f"    {_LABELS.get(name, name):<28} mean {_num(st.get('mean')):>8}  min "
                     f"{_num(st.get('min')):>8}  max {_num(st.get('max')):>8}  "
                     f"({st.get('n')} samples){past}{worst}")
    return lines


def _fmt(v) -> str:
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M")
    return "-" if v is None else str(v)


def _echo_checks(h: dict) -> None:
    """Freshness, the open findings and a held verdict."""
    f = h["freshness"]
    state = ("never checked in: no run of rsc-health delivered" if f["last_seen"] is None
             else "STALE (checks stopped)" if f["stale"] else "fresh")
    if f["level"] == "clock_skew":
        state += "; node clock wrong: its records are quarantined in its spool"
    echo(f"  checks    last {f['source'] or '-'} at {_fmt(f['last_seen'])} "
         f"verdict {f['level'] or '-'} ({state})")
    echo(f"  failing   {len(h['open_findings'])} open finding(s)"
         + (f" (first {SHOWN['open_findings']} listed)"
            if len(h["open_findings"]) > SHOWN["open_findings"] else ""))
    for o in h["open_findings"][:SHOWN["open_findings"]]:
        echo(f"    {o['check']:<10} {o['component']:<14} {o['severity']:<16} since "
             f"{_fmt(o['time'])}  {o['reason']}")
    if h["held"]:
        echo(f"  HELD      a drain verdict not carried out ({h['held']['action']}, "
             f"last said {_fmt(h['held']['time'])}): {h['held']['reason']}")


def _echo_history(h: dict) -> None:
    """Actions, failed jobs blamed on the node, tickets."""
    totals = h.get("totals", {})
    echo(f"  actions   {totals.get('actions', len(h['actions']))}{_cut(h, 'actions')}")
    for a in h["actions"][:SHOWN["actions"]]:
        echo(f"    {_fmt(a['time'])}  {a['action']:<16} {a['reason']}")
    echo(f"  failures  {totals.get('failed_jobs', len(h['failed_jobs']))} failed job(s) "
         f"blamed on it{_cut(h, 'failed_jobs')}")
    for jb in h["failed_jobs"][:SHOWN["failed_jobs"]]:
        echo(f"    {jb['job_id']:<10} {_fmt(jb['end'])}  {jb['state']:<10} "
             f"{jb['gpus']:>5} GPUs  {jb['cause']} {jb['code']}"
             + (f" on {jb['component']}" if jb.get("component") not in (None, "", "*")
                else ""))
    tri = h.get("triage")
    if tri:
        labels = ", ".join(f"{k} {n}" for k, n in tri["labels"].items())
        echo(f"  triage    failed jobs since {_fmt(tri['since'])}: {labels}")
        for jb in tri["jobs"][:10]:
            echo(f"    {jb['job_id']:<10} {_fmt(jb['end'])}  {jb['state']:<13} "
                 f"{jb['label']:<7} {'; '.join(jb['evidence'])[:160]}")
    echo(f"  tickets   {totals.get('tickets', len(h['tickets']))}{_cut(h, 'tickets')}")
    for t in h["tickets"][:SHOWN["tickets"]]:
        echo(f"    #{t['id']} {t['source']} opened {_fmt(t['opened'])} "
             f"{'open' if t['closed'] is None else 'closed ' + _fmt(t['closed'])}: "
             f"{t['reason']}")


def _echo_lemon(h: dict) -> None:
    """Whether the node is a lemon candidate, and its qualification runs."""
    lem = h["lemon"]
    echo(f"  lemon     {'CANDIDATE' if lem['candidate'] else 'no'}: {lem['why']}")
    runs = h.get("qualified") or []
    echo(f"  qualify   {'never qualified' if not runs else str(len(runs)) + ' recent run(s)'}")
    ver = h.get("versions")
    if ver:
        echo(f"  versions  {ver['versions'][:200]} since {_fmt(ver['since'])}"
             + (f" (was {ver['previous'][:120]})" if ver["previous"] else ""))
    for r in runs:
        failed = [x for x in r["results"] if x["status"] != "pass"]
        echo(f"    {_fmt(r['ended'])}  {r['tier']:<5} {r['verdict'].upper():<12} "
             + (r["reason"][:160] if r["reason"] else f"{len(r['results'])} metric(s) "
                "within their peers") + (f" ({len(failed)} not passed)" if failed else ""))


def _figure(x) -> str:
    """A suspect episode's figure, to four significant digits."""
    return "?" if x is None else f"{x:.4g}"


def _echo_suspects(h: dict) -> None:
    """The node's suspect-tier episodes."""
    from rsc_health.model import SuspectState

    eps = h.get("suspect") or []
    if not eps:
        echo("  suspect   never")
    for e in eps:
        ended = "" if e["state"] == SuspectState.SUSPECT else (
            f", {e['changed_by']} {e['changed'][:16].replace('T', ' ')}: "
            f"{e['change_reason'][:80]}")
        echo(f"  suspect   {e['state'].upper()}{ended}: {e['metric']} {_figure(e['value'])} "
             f"vs peers {_figure(e['peer_median'])} (deviation {_figure(e['deviation'])}, "
             f"{e['source']}) since {e['since'][:16].replace('T', ' ')}; jobs "
             f"{', '.join(e['job_ids'][:6]) or '-'}" + (f" [{e['tier']}]" if e["tier"] else ""))
        if e.get("detail"):
            echo(f"            {e['detail'][:200]}")


@click.command()
@click.argument("node_name", metavar="NODE")
@click.option("--as-of", "as_of", type=click.DateTime(), default=None,
              help="Judge freshness and the lemon window as of this UTC time (default: now), "
                   "e.g. for a historian of a past period.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def node(ctx: click.Context, node_name: str, as_of: datetime | None, as_json: bool) -> None:
    """One node's story: Slurm state, last checks, open findings, actions (who, why), failed
    jobs blamed on it, tickets, and why it is or is not a lemon."""
    doc = gather_node(ctx, node_name, as_of.replace(tzinfo=UTC) if as_of else datetime.now(UTC))
    if as_json:
        click.echo(json.dumps(doc, indent=1, default=str))
        return _exit_unknown(ctx, doc)
    s = doc["slurm"]
    echo(f"{node_name}")
    if s:
        echo(f"  slurm     {s['state']}" + (f"  reason: {s['reason']}" if s["reason"] else "")
                   + (f"  since {s['since']}" if s["since"] else ""))
    h = doc["historian"]
    if _unknown(doc):
        # Said first: every section below is empty because the name is not the historian's.
        echo("  historian has no record of this node and Slurm does not know it: no check "
             "run, action, job, event, ticket, inventory row or qualification under this name "
             "(mistyped, or never part of this fleet)")
    if h:
        for part in (_echo_checks, _echo_history, _echo_lemon, _echo_telemetry, _echo_suspects):
            part(h)
    links = doc.get("links") or {}
    for label, key in (("node page", "node_url"), ("dashboard", "dashboard_url")):
        if links.get(key):
            echo(f"  {label:<9} {links[key]}")
    for p in doc["problems"]:
        echo(f"  note      {p}")
    _exit_unknown(ctx, doc)


def _unknown(doc: dict) -> bool:
    """Whether the name is no node: the historian, read, has no record of it (inventory
    included) and Slurm did not answer for it. A node Slurm has, or the inventory lists, that
    never delivered a run is a node (the one an operator asks about), never 'mistyped'."""
    return (doc["slurm"] is None and doc["historian"] is not None
            and not doc["historian"]["known"])


def _exit_unknown(ctx: click.Context, doc: dict) -> None:
    """Exit 1 when the name is no node (_unknown): a script asking about a mistyped name must
    not read the answer as a node's story."""
    if _unknown(doc):
        ctx.exit(1)
