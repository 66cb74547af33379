"""`healthctl drain|resume|status|sweep|prolog|epilog`: the operator's side of the Slurm actions.

All Slurm access goes through rsc_health.slurm; the node-path commands are the same mains the
thin scripts in prolog/, epilog/ and checks/ run.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import click

from rsc_health.hostlist import HostlistError, expand
from rsc_health.terminal import echo


def _hosts(expr: str) -> list[str]:
    """The nodes an operator named, or one line saying why not (counted before expanding:
    `node[0-99999999]` is refused at once, not after gigabytes of names)."""
    try:
        hosts = expand(expr)
    except HostlistError as exc:
        raise click.ClickException(f"NODES: {exc}") from exc
    if not hosts:
        raise click.ClickException(f"NODES: {expr!r} names no node")
    return hosts


def _slurm(ctx: click.Context):
    from rsc_health.slurm import from_config

    return from_config(ctx.obj.config)


SHADOW_WORDS = "shadow mode ([actions] enabled = false): Slurm not asked, nothing changed"


def _shadow(ctx: click.Context, nodes: list[str] | None = None) -> bool:
    """[actions] enabled = false: no command changes Slurm, a person's included (as `lemons
    --apply`, `qualify start` and `qualify cleanup`); with `nodes`, true when every one of
    them is in shadow mode (by the site or its own `[nodes."GLOB".actions]`): Slurm is not
    even asked. A list mixing shadow and live nodes changes the live ones only (each node's
    own, `_shadow_node`), as `lemons --apply` does."""
    cfg = ctx.obj.config
    if not nodes:
        return not cfg.actions_enabled()
    return all(not cfg.actions_enabled(n) for n in nodes)


def _shadow_node(ctx: click.Context, node: str) -> bool:
    return not ctx.obj.config.actions_enabled(node)


def _who() -> str:
    from rsc_health.commands import invoking_person

    return invoking_person()


def _unconfirmed(ctx: click.Context, kind: str, node: str, reason: str, by: str, verb: str,
                 exc: Exception, res: dict) -> None:
    """A drain or resume whose scontrol timed out: recorded as asked and said to be
    unconfirmed, since slurmctld may apply it once it answers again."""
    where = _record(ctx, kind, node, f"{reason} ({by}; unconfirmed: Slurm did not answer)")
    res.update(result="unconfirmed",
               detail=f"Slurm did not answer ({exc}); the {verb} may still land, "
                      f"see `healthctl node {node}`; recorded in the {where}")


def _record(ctx: click.Context, action: str, node: str, reason: str) -> str:
    """Who did what and why: into the historian when one is configured (the management host),
    else the local spool. Returns where it went."""
    from rsc_health.actions import Action, spool_action
    from rsc_health.config import state_dir

    if ctx.obj.historian_configured:
        try:
            import uuid

            from rsc_health.historian.db import connect
            from rsc_health.historian.schema import node_actions
            from rsc_health.model import utcnow

            engine = connect(ctx.obj.database_url, create_missing=False,
                             statement_timeout_s=ctx.obj.statement_timeout_s)
            try:
                with engine.begin() as conn:
                    conn.execute(node_actions.insert().values(
                        id=uuid.uuid4().hex, time=utcnow().replace(tzinfo=None), node=node,
                        action=action, reason=reason))
            finally:
                engine.dispose()
            return "historian"
        except Exception as exc:  # noqa: BLE001 - a database error must not hide the action
            click.echo(f"warning: could not record in the historian ({exc}); spooling",
                       err=True)
    try:
        spool_action(Path(state_dir(ctx.obj.config, ctx.obj.root)), Action(action, node, reason))
        return "spool"
    except OSError as exc:
        click.echo(f"warning: could not spool the action: {exc}", err=True)
        return "nowhere"


def _open_tickets(ctx: click.Context, node: str) -> list[str] | None:
    """Open repair tickets of the node from the historian; None when there is none to ask."""
    if not ctx.obj.historian_configured:
        return None
    try:
        from sqlalchemy import select

        from rsc_health.historian.db import connect
        from rsc_health.historian.schema import tickets

        engine = connect(ctx.obj.database_url, create_missing=False,
                         statement_timeout_s=ctx.obj.statement_timeout_s)
        try:
            with engine.connect() as conn:
                rows = conn.execute(select(tickets.c.id, tickets.c.reason).where(
                    tickets.c.node == node, tickets.c.closed.is_(None))).all()
        finally:
            engine.dispose()
        return [f"#{i} {r}" for i, r in rows]
    except Exception:  # noqa: BLE001 - no historian reachable: say it could not check
        return None


def repair_drain(reason: str | None, never_resume) -> bool:
    """A drain of ours that needs hands-on repair: a lemon, a failed qualification (or one
    that proved nothing), or a node-path drain for a never-resume code. A person's
    `healthctl drain` is theirs to lift; a transient code resumes by itself."""
    from rsc_health.policy import LEMON_MODE, MANUAL_MODE, QUALIFY_MODE, parse_reason

    parsed = parse_reason(reason)
    if parsed is None:
        return False
    if parsed["mode"] == MANUAL_MODE:
        # a person's drain over one of ours (`healthctl drain` writes over_<its code>)
        return parsed["code"].startswith(OVER_REPAIR)
    return parsed["mode"] in (LEMON_MODE, QUALIFY_MODE) or parsed["code"] in set(never_resume)


# The code of a person's `healthctl drain` over a repair drain of ours: over_<that code>.
OVER_REPAIR = "over_"


def _never_resume(ctx: click.Context, node: str) -> list:
    """[actions] never_resume_codes as `node` sees it: its [nodes."GLOB".actions] tables are
    what the node path kept its drain as a repair by (a site's ib_down on its H100 nodes), so
    judging the drain with the site-wide list put a repair back with no qualification pass."""
    return ctx.obj.config.for_node(node).get("actions.never_resume_codes")


def _drained_by_another(reason: str | None, who: str) -> str | None:
    """Who drained the node with `healthctl drain`, when that is not `who` (the person now
    asking): a person's drain carries our prefix and is read back as ours, so another
    person's `drain` replaced it and a bulk `resume` lifted it without --force (an RMA note,
    a GPU awaiting a swap back in service). The name is the reason's trailing `by NAME`
    (manual_reason keeps it whole); one the reason does not end with (a drain written
    before it was kept, cut short) counts as another person's: --force says it is meant."""
    from rsc_health.policy import MANUAL_MODE, parse_reason, sanitize

    parsed = parse_reason(reason)
    if parsed is None or parsed["mode"] != MANUAL_MODE:
        return None
    _, by, name = parsed["text"].rpartition(" by ")
    if by and name.strip() == sanitize(who).strip():
        return None
    return name.strip() if by and name.strip() else "someone"


# How far back, with no resume on record, a never-resume fault is looked for behind a drain
# whose reason names a transient one.
FAULT_LOOKBACK = timedelta(days=30)


def _never_resumed_under(ctx: click.Context, info, never) -> tuple[str, str] | None:
    """(the code, why) a drain of the node path's whose reason leads with a transient code
    still asks a qualification pass, or None: a fault never auto-resumed was found on the
    node since it was last put back in service (the last resume or qualification release on
    record; with none, FAULT_LOOKBACK before the drain) and no pass came after it. Slurm's
    reason names one cause; an XID 48 found under our drain for a lost mount (its line consumed, the
    node's own record keeping it from auto-resume) or escalated over by one is only in the
    historian, and `resume` put the GPU back with no pass (helper-208, helper-211). Setting
    the drain again to lead with it moved Slurm's reason time (the mass-drain guard counted
    a node two hours out as a drain made now) and split its accounting event, so the
    historian is asked instead. Without one (or when it cannot answer) the reason is all
    there is: resumed as before. `healthctl drain` over such a drain writes over_<the code>
    (helper-214: a person's drain over it was a plain manual one, and its resume asked
    nothing)."""
    from rsc_health.compat import UTC, datetime
    from rsc_health.policy import MODE_FOR_LEVEL, parse_reason

    parsed = parse_reason(info.reason)
    if parsed is None or parsed["mode"] not in MODE_FOR_LEVEL.values() or \
            not ctx.obj.historian_configured or not never:
        return None
    try:
        from sqlalchemy import func, select

        from rsc_health.historian.db import connect
        from rsc_health.historian.schema import check_results as c
        from rsc_health.historian.schema import node_actions as a
        from rsc_health.model import ActionKind, Status
        from rsc_health.qualify.flow import HistorianSide

        engine = connect(ctx.obj.database_url, create_missing=False,
                         statement_timeout_s=ctx.obj.statement_timeout_s)
        try:
            with engine.connect() as conn:
                back = conn.execute(select(func.max(a.c.time)).where(
                    a.c.node == info.name, a.c.action.in_(
                        (ActionKind.RESUME.value, ActionKind.QUALIFY_RELEASE.value)))).scalar()
                drained = info.reason_time.astimezone(UTC).replace(tzinfo=None) \
                    if info.reason_time else datetime.now(UTC).replace(tzinfo=None)
                since = back if back is not None else drained - FAULT_LOOKBACK
                row = conn.execute(
                    select(c.c.code, c.c.time).where(
                        c.c.node == info.name, c.c.status == Status.FAIL.value, c.c.time > since,
                        c.c.code.in_(sorted(never)))
                    .order_by(c.c.time.desc()).limit(1)).first()
            if row is None or HistorianSide(engine).passed_since(info.name, row.time):
                return None
        finally:
            engine.dispose()
    except Exception:  # noqa: BLE001 - the reason names a transient fault: as before
        return None
    return row.code, (f"{row.code} was found on it at {row.time:%Y-%m-%d %H:%M}Z, under or "
                      f"before this drain ({info.reason[:60]!r}), with no qualification pass "
                      "since")


def _needs_qualification(ctx: click.Context, info) -> str | None:
    """Why this node must be qualified rather than resumed, or None."""
    never = _never_resume(ctx, info.name)
    ask = f"qualify it: `healthctl qualify start {info.name}` (or --force)"
    if not repair_drain(info.reason, never):
        found = _never_resumed_under(ctx, info, never)
        return None if found is None else f"{found[1]}; {ask}"
    if not ctx.obj.historian_configured:
        return f"repair drain ({info.reason[:60]!r}) and no historian to find a pass in; {ask}"
    try:
        from rsc_health.historian.db import connect
        from rsc_health.qualify.flow import HistorianSide

        engine = connect(ctx.obj.database_url, create_missing=False,
                         statement_timeout_s=ctx.obj.statement_timeout_s)
        try:
            # Slurm stamps a reason to the whole second: a pass that ended within the drain's
            # own second may be from before it (a node that failed again at once), so only a
            # pass from the next second on counts.
            since = info.reason_time + timedelta(seconds=1) if info.reason_time else None
            passed = HistorianSide(engine).passed_since(info.name, since)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - cannot tell: never back without a pass
        return f"repair drain and the historian could not say whether it passed ({exc}); {ask}"
    if passed:
        return None
    return f"repair drain ({info.reason[:60]!r}) with no qualification pass since; {ask}"


def _report(results: list[dict], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        for r in results:
            echo(f"{r['node']}: {r['result']}" + (f" ({r['detail']})" if r["detail"] else ""))
    if any(not r["ok"] for r in results):
        sys.exit(1)


def _fail(exc: Exception) -> None:
    raise click.ClickException(str(exc)) from exc


@click.command()
@click.argument("nodes")
@click.option("--reason", required=True, help="Why (free text; kept in Slurm's reason).")
@click.option("--code", default="manual", show_default=True, help="Short fault token.")
@click.option("--now", "now_", is_flag=True, help="Also requeue the node's jobs at once.")
@click.option("--force", is_flag=True, help="Also replace a drain or DOWN a person set.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per node.")
@click.pass_context
def drain(ctx: click.Context, nodes: str, reason: str, code: str, now_: bool, force: bool,
          as_json: bool) -> None:
    """Drain NODES (a hostlist) with an rsc_health:manual reason; never auto-resumed.

    Goes on past a node it cannot change and prints one line per node; exits 1 if any failed.
    A node a person drained or set DOWN keeps its reason unless --force, a `healthctl drain` of
    another person's included (the reason's `by NAME`); one's own may be drained again."""
    from rsc_health.model import REASON_PREFIX, ActionKind
    from rsc_health.policy import (
        MANUAL_MODE,
        MAX_CODE_LEN,
        MAX_REASON_LEN,
        is_ours,
        parse_reason,
        sanitize,
    )
    from rsc_health.slurm import SlurmError, SlurmUnavailable

    who = _who()
    text = sanitize(reason).strip()
    if not text:
        raise click.ClickException("--reason must say why (it is what the next person reads)")
    def manual_reason(code: str) -> str:
        # The code clipped first (MAX_CODE_LEN): a long one cut at MAX_REASON_LEN lost the
        # colon after it, and the drain was no longer read back as ours (resume refused it)
        # The text is clipped, not the `by NAME` after it: whose drain it is decides who
        # may replace or lift it without --force (_drained_by_another).
        head = (f"{REASON_PREFIX}{MANUAL_MODE}:"
                f"{sanitize(code).replace(':', '_')[:MAX_CODE_LEN] or MANUAL_MODE}:")
        tail = f" by {sanitize(who)}"
        room = max(MAX_REASON_LEN - len(head) - len(tail), 1)
        return (head + text[:room].rstrip() + tail)[:MAX_REASON_LEN].rstrip()

    slurm_reason = manual_reason(code)
    hosts = _hosts(nodes)
    if _shadow(ctx, hosts):
        # Shadow mode: Slurm is asked nothing; what would have been drained is recorded.
        for node in hosts:
            _record(ctx, ActionKind.WOULD_DRAIN, node, f"{slurm_reason} ({who})")
        _report([{"node": node, "ok": True, "result": "not drained", "requeued": [],
                  "detail": SHADOW_WORDS + "; recorded as would_drain"} for node in hosts],
                as_json)
        return
    slurm = _slurm(ctx)

    def drain_one(node: str, res: dict) -> SlurmUnavailable | None:
        if _shadow_node(ctx, node):  # a shadow node in a list of live ones
            _record(ctx, ActionKind.WOULD_DRAIN, node, f"{slurm_reason} ({who})")
            res.update(ok=True, result="not drained",
                       detail=f"shadow mode for {node}: Slurm not asked; recorded as "
                              "would_drain")
            return None
        info = slurm.node(node)
        other = (info.drain_set or info.down) and _drained_by_another(info.reason, who)
        if (info.drain_set or info.down) and (not is_ours(info.reason) or other) \
                and not force:
            res.update(result="refused",
                       detail=f"{info.state} by {other or 'someone else'}: {info.reason!r}; "
                              "--force")
            return None
        reason = slurm_reason
        never = _never_resume(ctx, node)
        repair = info.drain_set and repair_drain(info.reason, never)
        found = _never_resumed_under(ctx, info, never) if info.drain_set and not repair \
            else None
        if repair or found:
            # Over our repair verdict (a never-resume XID, a lemon, a failed or unproven
            # qualification): the person's reason replaces it, and its code says what it
            # went over (`over_xid48`), so the maintenance's `healthctl resume` still asks
            # for the qualification pass the repair needs, and `qualify auto` leaves the node
            # to the person meanwhile (a manual drain).
            over = found[0] if found else (parse_reason(info.reason) or {}).get("code", "repair")
            # A person's drain over a person's over_ drain keeps its one over_ (not over_over_)
            reason = manual_reason(over if over.startswith(OVER_REPAIR) else OVER_REPAIR + over)
            res["detail"] = (f"over rsc-health's repair drain {info.reason[:60]!r}: resume "
                             "asks for a qualification pass; ")
        try:
            slurm.drain(node, reason)
        except SlurmUnavailable as exc:
            # slurmctld may hold the request and apply it once it answers again (a
            # SIGSTOP, an overload): recorded as asked, and said to be unconfirmed.
            _unconfirmed(ctx, ActionKind.MANUAL_DRAIN, node, reason, who, "drain",
                         exc, res)
            return exc
        # Recorded before anything else can fail: the drain is done.
        where = _record(ctx, ActionKind.MANUAL_DRAIN, node, f"{reason} ({who})")
        res.update(ok=True, result="drained")
        away = None
        try:
            after = slurm.node(node)
            if any(f in after.flags for f in ("ALLOCATED", "MIXED", "COMPLETING")) \
                    and not now_:
                res["result"] = "draining"
            if now_:
                for job in slurm.jobs_on_node(node):
                    try:
                        slurm.requeue(job.target)
                        res["requeued"].append(job.job_id)
                    except SlurmUnavailable:
                        raise
                    except SlurmError as exc:
                        res["detail"] += f"job {job.job_id} not requeued: {exc}; "
        except SlurmError as exc:
            if isinstance(exc, SlurmUnavailable):
                away = exc
            res["detail"] += (f"drained, but {'jobs not requeued: ' if now_ else ''}"
                              f"state not re-read: {exc}; ")
            res["ok"] = not now_
        res["detail"] = (res["detail"] + f"recorded in the {where}").strip()
        return away

    _report(_each_node(hosts, drain_one, requeued=True), as_json)


@click.command()
@click.argument("nodes")
@click.option("--force", is_flag=True,
              help="Also resume a drain rsc-health did not set, one with an open ticket, or a "
                   "repair drain with no qualification pass since.")
@click.option("--reason", default="", help="Why (recorded with who resumed it).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per node.")
@click.pass_context
def resume(ctx: click.Context, nodes: str, force: bool, reason: str, as_json: bool) -> None:
    """Resume NODES after repair; one line per node, going on past a node it cannot change.

    A person's or Slurm's drain needs --force (a `healthctl drain` only when another person's:
    the reason's `by NAME` is not the one resuming); so does a node with an open repair ticket in
    the historian (close the ticket: `healthctl ticket close ID`), and a node rsc-health
    drained for a repair (a never-resume code, a lemon, a failed qualification) with no
    stored qualification pass since the drain: `healthctl qualify start NODE` proves it and
    resumes it on a pass (issue 24: no node back in service without one)."""
    from rsc_health.model import ActionKind
    from rsc_health.policy import is_ours
    from rsc_health.slurm import SlurmUnavailable

    who = _who()
    hosts = _hosts(nodes)
    if _shadow(ctx, hosts):
        _report([{"node": node, "ok": True, "result": "not resumed", "detail": SHADOW_WORDS}
                 for node in hosts], as_json)
        return
    slurm = _slurm(ctx)

    def resume_one(node: str, res: dict) -> SlurmUnavailable | None:
        if _shadow_node(ctx, node):  # a shadow node in a list of live ones
            res.update(ok=True, result="not resumed",
                       detail=f"shadow mode for {node}: Slurm not asked")
            return None
        info = slurm.node(node)
        if not (info.drain_set or info.down):
            res.update(ok=True, result="not drained", detail=info.state)
            return None
        if not is_ours(info.reason) and not force:
            res.update(result="refused", detail=f"not ours ({info.reason!r}); --force")
            return None
        other = _drained_by_another(info.reason, who)
        if other and not force:
            res.update(result="refused",
                       detail=f"drained by {other} ({info.reason!r}); theirs to lift, or --force")
            return None
        open_tickets = _open_tickets(ctx, node)
        if open_tickets and not force:
            res.update(result="refused",
                       detail=f"open repair ticket {', '.join(open_tickets)}; --force")
            return None
        unproved = None if force else _needs_qualification(ctx, info)
        if unproved:
            res.update(result="refused", detail=unproved)
            return None
        note = f"by {who}" + (f": {reason}" if reason else "")
        # Read again: the historian's checks took time, and a person's drain or DOWN set
        # meanwhile is theirs (RESUME would lift it with its reason).
        fresh = slurm.node(node)
        if (fresh.reason, fresh.down, fresh.drain_set) != (info.reason, info.down,
                                                          info.drain_set):
            res.update(result="refused", detail=f"changed while checking: now {fresh.state} "
                       f"{fresh.reason!r}; run it again")
            return None
        try:
            if info.down:
                slurm.resume(node)
            else:
                # UNDRAIN lifts the drain and nothing else: a DOWN set since this read (a
                # person's, or Slurm's own) stays, with its reason
                slurm.undrain(node)
        except SlurmUnavailable as exc:
            # As for drain: slurmctld may still apply it once it answers again.
            _unconfirmed(ctx, ActionKind.RESUME, node, info.reason, note, "resume", exc, res)
            return exc
        where = _record(ctx, ActionKind.RESUME, node, f"{info.reason} ({note})")
        checked = "" if open_tickets is not None else "; tickets not checked (no historian)"
        res.update(ok=True, result="resumed",
                   detail=f"was {info.state} {info.reason}; recorded in the {where}{checked}")
        return None

    _report(_each_node(hosts, resume_one), as_json)


def _each_node(hosts: list[str], act, *, requeued: bool = False) -> list[dict]:
    """`act(node, result)` on each node in turn, one result each (`requeued`: every result
    has the list). An act that finds Slurm unavailable returns (or raises) it, and the nodes
    after it are not tried: one timeout for the lot, not one per node (64 nodes against a
    frozen slurmctld would otherwise take 64 timeouts, or three each)."""
    from rsc_health.slurm import SlurmError, SlurmUnavailable

    results = []
    away: SlurmUnavailable | None = None
    for node in hosts:
        res: dict = {"node": node, "ok": False, "result": "", "detail": ""}
        if requeued:
            res["requeued"] = []
        if away is not None:
            res.update(result="not tried", detail=f"Slurm unavailable: {away}")
        else:
            try:
                away = act(node, res)
            except SlurmUnavailable as exc:
                away = exc
                res.update(result="failed", detail=str(exc))
            except SlurmError as exc:
                res.update(result="failed", detail=str(exc))
        results.append(res)
    return results


def gather_status(slurm, cfg, now) -> dict:
    from rsc_health.actions import guard_states
    from rsc_health.policy import parse_reason

    nodes = slurm.nodes()
    window = timedelta(minutes=float(cfg.get("actions.guard_window_min")))
    drained = []
    for n in nodes:
        if not (n.drain_set or n.down):
            continue
        parsed = parse_reason(n.reason)
        age = (now - n.reason_time).total_seconds() if n.reason_time else None
        drained.append({
            "node": n.name, "state": n.state, "reason": n.reason, "ours": parsed is not None,
            "mode": parsed["mode"] if parsed else None, "code": parsed["code"] if parsed else None,
            "since": n.reason_time.isoformat() if n.reason_time else None, "age_s": age,
        })
    partitions = sorted({p for n in nodes for p in n.partitions})
    guards = [
        {"partition": g.partition, "nodes": g.total, "drained_recently": g.recent_ours,
         "limit": g.limit, "tripped": g.tripped}
        for g in guard_states(nodes, partitions, window=window, now=now,
                              max_share=float(cfg.get("actions.guard_max_share")))
    ]
    return {"time": now.isoformat(), "drained": drained, "guard": guards,
            "guard_window_min": window.total_seconds() / 60,
            # Every node Slurm has now (not printed): the historian keeps a retired node's
            # heartbeat row for ever, and status judges freshness of these alone.
            SLURM_NODES: {n.name for n in nodes},
            # Nodes whose scontrol record reads ambiguously (Features/Comment text shaped like
            # a field): refused by every action until a person fixes the text.
            "refused": list(getattr(slurm, "refused_nodes", []))}


def _echo_refused(data: dict) -> None:
    if data["refused"]:
        echo(f"refused: {len(data['refused'])} node(s) whose scontrol record reads ambiguously "
             "(Features/Comment/Extra text shaped like a field): no action is taken on them "
             "until the text is fixed: " + ",".join(data["refused"]))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


# freshness.CLOCK_SKEW, said for a person (not imported: status runs without the historian).
_CLOCK_WRONG = "node clock wrong (its records are quarantined in its spool)"


HISTORIAN_ERROR = "rsc_health.historian_error"
SLURM_NODES = "_slurm_nodes"
# Names of nodes left out for Slurm no longer having them, printed before "...".
_NAMES_SHOWN = 10


def _from_historian(ctx: click.Context, what: str, read) -> list | None:
    """`read(engine)` against the historian for `status` (its imports inside it: a node-only
    install may lack the historian's libraries); None when no historian is configured or it
    cannot be read (said on stderr: Slurm's half of status still stands). The first failure
    is kept in ctx.meta[HISTORIAN_ERROR] (status cannot vouch for what it could not read, and
    exits 1) and the reads after it are not tried (one timeout, not one per read)."""
    if not ctx.obj.historian_configured or ctx.meta.get(HISTORIAN_ERROR):
        return None
    try:
        from rsc_health.historian.db import connect

        engine = connect(ctx.obj.database_url, create_missing=False,
                         statement_timeout_s=ctx.obj.statement_timeout_s)
        try:
            return read(engine)
        finally:
            engine.dispose()
    except Exception as exc:  # noqa: BLE001 - Slurm's half of status still stands
        click.echo(f"warning: cannot read {what} from the historian: {exc}", err=True)
        ctx.meta[HISTORIAN_ERROR] = f"{what}: {exc}"
        return None


def _freshness(ctx: click.Context, now) -> list[dict] | None:
    """Nodes whose checks stopped or cannot look, from the historian's heartbeats; None when
    no historian is configured (a node-only install)."""
    def read(engine):
        from rsc_health.historian.freshness import node_freshness, stale_after_s

        return node_freshness(engine, now, stale_after_s(ctx.obj.config))

    rows = _from_historian(ctx, "node freshness", read)
    if rows is None:
        return None
    return [{"node": f.node, "last_seen": f.last_seen.isoformat() if f.last_seen else None,
             "source": f.last_source, "level": f.last_level, "stale": f.stale,
             "checker_errors": f.checker_errors}
            for f in rows if f.stale or f.broken]


def _hung_probes(ctx: click.Context, now) -> list[dict] | None:
    """Nodes whose probes keep hanging (a mount's statvfs, NVML), from the historian's open
    intervals; None when no historian is configured or it cannot be read."""
    def read(engine):
        from rsc_health.historian.freshness import hung_probes, stale_after_s

        return hung_probes(engine, now, stale_after_s(ctx.obj.config))

    rows = _from_historian(ctx, "hung probes", read)
    if rows is None:
        return None
    return [{"node": h.node, "probe": h.probe, "codes": list(h.codes),
             "since": h.since.isoformat(), "last_seen": h.last_seen.isoformat()} for h in rows]


def _held(ctx: click.Context, now) -> list[dict] | None:
    """Nodes keeping a drain verdict rsc-health has not carried out (the mass-drain guard, or
    a drain not ours standing), from the actions they delivered; None with no historian."""
    def read(engine):
        from rsc_health.historian.held import held_verdicts, held_within

        return held_verdicts(engine, now, held_within(ctx.obj.config))

    rows = _from_historian(ctx, "held verdicts", read)
    if rows is None:
        return None
    return [{"node": h.node, "time": h.time.isoformat(), "action": h.action,
             "reason": h.reason} for h in rows]


def _suspects(ctx: click.Context) -> list[dict] | None:
    """Open suspect episodes (rsc_health/suspects.py) with their evidence; None with no
    historian."""
    def read(engine):
        from rsc_health.historian.suspects import active

        return active(engine)

    rows = _from_historian(ctx, "suspects", read)
    if rows is None:
        return None
    return [{"node": e.node, "since": e.since.isoformat(), "metric": e.metric,
             "value": e.value, "peer_median": e.peer_median, "deviation": e.deviation,
             "source": e.source, "tier": e.tier, "expires": e.expires.isoformat(),
             "job_ids": list(e.job_ids)} for e in rows]


def _held_line(h: dict, drained: set[str]) -> str:
    from rsc_health.model import ActionKind

    if h["action"] == ActionKind.GUARD_TRIPPED:
        why = "held by the mass-drain guard"
    elif h["node"] in drained:
        why = "held under a drain rsc-health does not lift"
    else:
        # A person resumed it (or Slurm did): the verdict still stands.
        why = ("held under a drain rsc-health does not lift, now lifted: drained at its next "
               "job start or sweep retry")
    return f"  {h['node']:<16} {why} (last said {h['time']}): {h['reason']}"


def _echo_drained(data: dict) -> None:
    groups: dict[str, list[dict]] = {}
    for d in data["drained"]:
        key = f"rsc_health {d['mode']}:{d['code']}" if d["ours"] else "others (not ours)"
        groups.setdefault(key, []).append(d)
    if not groups:
        echo("no drained or down nodes")
    for key in sorted(groups):
        echo(f"{key}: {len(groups[key])}")
        for d in sorted(groups[key], key=lambda d: -(d["age_s"] or 0)):
            echo(f"  {d['node']:<16} {_age(d['age_s']):>7}  {d['state']:<18} {d['reason']}")


def _echo_guards(data: dict) -> None:
    for g in data["guard"]:
        flag = "TRIPPED" if g["tripped"] else "ok"
        names = f": {', '.join(g['drained_recently'])}" if g["tripped"] else ""
        echo(f"guard {g['partition']}: {flag} ({len(g['drained_recently'])}/{g['nodes']} "
             f"drained by rsc_health in {data['guard_window_min']:g} min, "
             f"limit {g['limit']}){names}")


def _echo_held(data: dict) -> None:
    if not data["held"]:
        return
    echo(f"held: {len(data['held'])} node(s) keep a drain verdict not carried out")
    drained = {d["node"] for d in data["drained"]}
    for h in data["held"]:
        echo(_held_line(h, drained))


def _echo_suspects(data: dict) -> None:
    if not data["suspects"]:
        return
    echo(f"suspects: {len(data['suspects'])} node(s) kept from big jobs "
         "(`healthctl suspects` for the evidence)")
    for sp in data["suspects"]:
        dev = "?" if sp["deviation"] is None else f"{sp['deviation']:.3g}"
        echo(f"  {sp['node']:<16} {sp['metric']} deviation {dev} since {sp['since']} "
             f"[{sp['tier'] or 'not yet applied'}]")


def _echo_not_checking(data: dict) -> None:
    if data["historian_error"]:
        echo(f"historian unreachable: nodes not checking, held verdicts and hung probes "
             f"unknown ({data['historian_error']})")
        return
    if data["not_checking"] is None:
        echo("node freshness: no historian configured (heartbeats not checked)")
        return
    if data["not_checking"]:
        echo(f"not checking: {len(data['not_checking'])} node(s)")
    gone = data.get("not_in_slurm") or []
    if gone:
        more = ", ..." if len(gone) > _NAMES_SHOWN else ""
        echo(f"not checked: {len(gone)} node(s) the historian has heard from that Slurm no "
             f"longer has (retired or renamed): {', '.join(gone[:_NAMES_SHOWN])}{more}")
    for f in data["not_checking"]:
        why = ("stale" if f["stale"] else _CLOCK_WRONG if f["level"] == "clock_skew"
               else f"checker errors ({f['level']})")
        echo(f"  {f['node']:<16} {why}, last {f['source'] or '-'} at "
             f"{f['last_seen'] or 'never'}")


def _echo_hung(data: dict) -> None:
    if not data["probes_hung"]:  # none, or None: no historian (said by _echo_not_checking)
        return
    echo(f"probes hanging: {len(data['probes_hung'])}")
    for h in data["probes_hung"]:
        echo(f"  {h['node']:<16} {h['probe']} since {h['since']} "
             f"({', '.join(h['codes'])}; last seen {h['last_seen']})")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Drained nodes by reason and age, the mass-drain guard per partition, nodes keeping a
    drain verdict held back (by the guard, or under a drain rsc-health does not lift) and why,
    nodes whose checks stopped or cannot look, and nodes whose probes keep hanging (a mount,
    NVML). Exits 1 when a guard or a verdict is held, a node is not checking or a probe
    hangs."""
    from rsc_health.model import utcnow
    from rsc_health.slurm import SlurmError

    now = utcnow()
    try:
        data = gather_status(_slurm(ctx), ctx.obj.config, now)
    except SlurmError as exc:
        _fail(exc)
    in_slurm = data.pop(SLURM_NODES)
    data["not_checking"] = _freshness(ctx, now)
    # A node Slurm no longer has (retired, renamed) keeps its last heartbeat in the
    # historian for ever: it is not a node whose checks stopped, and listing it made status
    # exit 1 every day. Left out, and counted, when Slurm's list was read; an empty list
    # (Slurm answered about no node) proves nothing, and every node is kept.
    data["not_in_slurm"] = []
    if data["not_checking"] and in_slurm:
        data["not_in_slurm"] = [f["node"] for f in data["not_checking"]
                                if f["node"] not in in_slurm]
        data["not_checking"] = [f for f in data["not_checking"] if f["node"] in in_slurm]
    data["probes_hung"] = _hung_probes(ctx, now)
    data["held"] = _held(ctx, now)
    # Informational: a suspect is kept from big jobs, not a problem status exits 1 for.
    data["suspects"] = _suspects(ctx)
    # Configured and not read: what status vouches for (no node stopped checking, no verdict
    # held, no probe hanging) is unknown, and an exit 0 would say all is well.
    data["historian_error"] = ctx.meta.get(HISTORIAN_ERROR)
    tripped = [g for g in data["guard"] if g["tripped"]]
    problems = (bool(tripped) or bool(data["not_checking"]) or bool(data["probes_hung"])
                or bool(data["held"]) or bool(data["refused"])
                or bool(data["historian_error"]))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        if problems:
            sys.exit(1)
        return
    for part in (_echo_drained, _echo_guards, _echo_held, _echo_suspects, _echo_not_checking,
                 _echo_hung, _echo_refused):
        part(data)
    if problems:
        sys.exit(1)


def _node_main(ctx: click.Context, name: str) -> None:
    from rsc_health import nodepath

    # The node path reads its settings from the environment, as under slurmd.
    if ctx.obj.config_path:
        os.environ["RSC_HEALTH_CONFIG"] = ctx.obj.config_path
    if ctx.obj.root_arg:
        os.environ["RSC_HEALTH_ROOT"] = ctx.obj.root_arg
    sys.exit(nodepath.MAINS[name]())


@click.command()
@click.pass_context
def sweep(ctx: click.Context) -> None:
    """Run one periodic sweep on this node (what HealthCheckProgram runs)."""
    _node_main(ctx, "sweep")


@click.command()
@click.pass_context
def prolog(ctx: click.Context) -> None:
    """Run the job prolog on this node (exit 1 on a drain verdict)."""
    _node_main(ctx, "prolog")


@click.command()
@click.pass_context
def epilog(ctx: click.Context) -> None:
    """Run the job epilog on this node."""
    _node_main(ctx, "epilog")
