"""`healthctl qualify`: prove a node against its peers before it returns to service.

    healthctl qualify run --tier full      # on the node (the qualification job runs this)
    healthctl qualify baseline             # the fleet's own baseline, per GPU model and slot
    healthctl qualify show NODE            # a node's latest runs and each metric's judgement
    healthctl qualify start NODES          # the Slurm flow: reserve, resume, job, release/drain
    healthctl qualify cleanup              # what a flow cut short left: drained, reservation gone

`run` exits 0 on a pass, 3 on a fail (drain), 4 when the run proved nothing (inconclusive:
a tool missing, a timeout, too few peers and no baseline): never 0 without a judged pass. It
runs the node's own checks first (qualify/gate.py): what the node path would drain fails the
run before any test, a checker error makes it inconclusive.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import click

from rsc_health.commands import FiniteFloat
from rsc_health.commands import historian_engine as _engine
from rsc_health.model import Status
from rsc_health.terminal import echo

EXIT = {"pass": 0, "fail": 3, "inconclusive": 4}


def _identity(cfg, root: Path) -> tuple[str, str]:
    """(GPU model, driver) of this node from NVML, bounded; ("", "") when NVML cannot say."""
    from rsc_health.collect import bounded
    from rsc_health.collect.node import gpu_backend

    try:
        doc = bounded.call(gpu_backend(cfg, root).read, float(cfg.get("gpu.nvml_timeout_s")))
    except Exception:  # noqa: BLE001 - NVML's trouble is the run's: peers cannot be chosen
        return "", ""
    if not isinstance(doc, dict):
        return "", ""
    # A GPU whose name NVML could not read answers {"error": ...}: no model, never a crash
    names = [d.get("name") for d in doc.get("devices") or [] if isinstance(d, dict)]
    model = names[0] if names and all(isinstance(n, str) for n in names) \
        and len(set(names)) == 1 else ""
    driver = doc.get("driver_version")
    return model[:64], driver[:32] if isinstance(driver, str) else ""


@click.group("qualify")
def qualify() -> None:
    """Qualify nodes against their peers before they return to service."""


@qualify.command("run")
@click.option("--tier", type=click.Choice(["lite", "full", "deep"]), default="full",
              show_default=True)
@click.option("--node", default=None, help="Record as this node (default: this host's name).")
@click.option("--gpu-model", default=None, help="Peer group: GPU model (default: from NVML).")
@click.option("--driver", default=None, help="Peer group: driver version (default: from NVML).")
@click.option("--no-record", is_flag=True, help="Judge, print, store nothing.")
@click.option("--peer", default=None,
              help="Known-good peer of the pairwise tests (default: the node of the same GPU "
                   "model and driver whose pass is newest and that is not being qualified).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def run(ctx, tier, node, gpu_model, driver, no_record, peer, as_json) -> None:
    """Check this node (as `healthctl check`; a drain-level finding fails it before any
    test), run a tier's tests, judge each metric against its peers, record it."""
    from rsc_health.qualify import gate as qgate
    from rsc_health.qualify import runner, store
    from rsc_health.qualify.baseline import Baseline
    from rsc_health.qualify.judge import INCONCLUSIVE, PASS, Rules
    from rsc_health.qualify.verdict import judge_run

    node = node or os.uname().nodename.split(".")[0]
    # the config as this node sees it: its [nodes."GLOB"] tables (a GPU count, a baseline of
    # its model, its tiers), as the node's own checks and the gate read it
    cfg = ctx.obj.config.for_node(node)
    unknown = []
    if gpu_model is None or driver is None:
        found_model, found_driver = _identity(cfg, ctx.obj.root)
        if gpu_model is None and not found_model:
            unknown.append("GPU model (NVML could not say, or its GPUs name different "
                           "models: a part of another SKU)")
        if driver is None and not found_driver:
            unknown.append("driver version")
        gpu_model = found_model if gpu_model is None else gpu_model
        driver = found_driver if driver is None else driver
    try:
        specs = runner.tier_tests(cfg, tier)
    except runner.SuiteError as exc:
        raise click.ClickException(str(exc)) from exc
    base_path = cfg.get("qualify.baseline")
    try:
        baseline = Baseline.load(Path(base_path)) if base_path else None
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"[qualify] baseline {base_path}: {exc}") from exc
    # The historian first: a node that cannot reach it learns so before minutes of tests.
    engine = _engine(ctx) if ctx.obj.historian_configured else None
    # Stamped by the historian's clock, carried on by this process's monotonic one: the
    # management side compares a run's times with its own (the flow's submission, a drain, a
    # suspect episode), and this node's wall clock may be years off.
    t0 = time.monotonic()
    if engine is not None:
        from rsc_health.historian.db import historian_now

        with engine.connect() as clock_conn:
            started = historian_now(clock_conn)
    else:
        started = datetime.now(UTC).replace(tzinfo=None)
    since = store.since(started, cfg)
    # Then the node's own checks (qualify/gate.py): what the node path would drain never
    # passes, whatever the tier measures; a drain-level finding fails before any test runs.
    gate = qgate.judge(qgate.look(cfg, ctx.obj.root, node))
    good: list[str] = []
    if peer is None and engine is not None and not gate.blocks \
            and any(runner.is_pairwise(s) for s in specs):
        from rsc_health.qualify import pairwise

        with engine.connect() as pconn:
            good = pairwise.known_good(pconn, node=node, gpu_model=gpu_model, driver=driver,
                                       since=since)
        peer = good[0] if good else None
    budget_s = float(cfg.get("qualify.tier_budget_s"))
    deadline = time.monotonic() + budget_s if budget_s else None
    outcomes = [gate.outcome] if gate.outcome is not None else []
    if unknown:
        # no peer group to judge in: the baseline alone (one fleet file, a wider margin,
        # not per model) would decide, and a node 7% under its peers passed
        from rsc_health.qualify.outcome import Outcome

        outcomes.append(Outcome("identity", inconclusive=" and ".join(unknown)
                                + " unknown: its peers cannot be chosen"))
    after = None
    if not gate.blocks:
        outcomes += runner.run_tier(cfg, tier, budget_s=budget_s, peer=peer)
        # Again once the tests ran: what the stress raised (an XID 48 mid-burn) fails it too.
        after = qgate.judge(qgate.look(cfg, ctx.obj.root, node), qgate.AFTER)
        if after.outcome is not None and (after.blocks or gate.outcome is None):
            outcomes.append(after.outcome)
    conn = engine.connect() if engine is not None else None
    try:
        def peers_of(metric, test):
            if conn is None:
                return []
            return store.peers(conn, metric=metric.name, idx=metric.index,
                               gpu_model=gpu_model, driver=driver, exclude_node=node,
                               since=since, test=test)

        rules = Rules.from_config(cfg)

        def expected_of(test):
            if conn is None:
                return set()
            return store.expected(conn, test=test, gpu_model=gpu_model, driver=driver,
                                  exclude_node=node, since=since, min_peers=rules.min_peers)

        # What the node owes beside its metrics' worth: [gpu] count GPUs in each tool's own
        # list, and every metric its peers measure in the same test (verdict.missing).
        owed: dict[str, Any] = dict(gpus=int(cfg.get("gpu.count")), expected_of=expected_of,
                                    warn_passes=cfg.get("qualify.dcgm_warn") == "pass")
        judged = judge_run(outcomes, peers_of=peers_of, baseline=baseline, rules=rules, **owed)
        if len(good) > 1:
            confirmed = _confirm_pairwise_fail(judged, specs, good[1], peer, deadline,
                                               peers_of, baseline, rules, owed)
            if confirmed is not judged:
                # The re-run stressed the node again: look again after it, as after the tier.
                again = qgate.judge(qgate.look(cfg, ctx.obj.root, node), qgate.AFTER)
                if again.blocks and again.outcome is not None:
                    after = again
                    kept = [o for o in confirmed.outcomes if o.test != qgate.AFTER]
                    confirmed = judge_run([*kept, again.outcome],
                                          peers_of=peers_of, baseline=baseline,
                                          rules=rules, **owed)
            judged = confirmed
    finally:
        if conn is not None:
            conn.close()
    restarted = _restarted()
    if restarted and judged.verdict == PASS:
        # Slurm requeued the job (a node failure, a drain that requeued it) and this is a
        # later attempt under the same job id: whatever ended the first, it was the node's,
        # and the management side must not release it on this attempt's pass.
        judged.verdict = INCONCLUSIVE
        judged.reason = (f"{restarted}: a pass of a later attempt is not the job's"
                         + (f"; {judged.reason}" if judged.reason else ""))[:4000]
    ended = started + timedelta(seconds=time.monotonic() - t0)
    run_rec = store.Run(uuid.uuid4().hex, node, tier, started, ended, judged.verdict,
                        judged.reason[:4000], gpu_model, driver,
                        os.environ.get("SLURM_JOB_ID"))
    if engine is not None and not no_record:
        from rsc_health.historian import db as hdb

        with hdb.writer(engine).begin() as wconn:
            store.record(wconn, run_rec, judged.judgements)
    if as_json:
        click.echo(json.dumps(_run_doc(run_rec, judged, specs, gate, after), indent=1, default=str))
    else:
        _echo_run(run_rec, judged, gate, after)
    ctx.exit(EXIT[judged.verdict])


def _restarted() -> str:
    """Why this run is a restarted Slurm job's ("" when it is not): Slurm sets
    SLURM_RESTART_COUNT in a batch job that it requeued and started again."""
    count = os.environ.get("SLURM_RESTART_COUNT", "").strip()
    try:
        n = int(count)
    except ValueError:
        return ""
    if n <= 0:
        return ""
    return (f"restarted: job {os.environ.get('SLURM_JOB_ID', '?')[:32]} was requeued and "
            f"restarted {n} time(s) by Slurm (its node failed or was drained under an earlier "
            "attempt)")


def _confirm_pairwise_fail(judged, specs, second: str, first: str | None, deadline,
                           peers_of, baseline, rules, owed):
    """A run failed only by pairwise tests against the chosen peer is run again against a
    second known-good peer: a peer degraded since its own pass (not yet caught) would
    otherwise fail, and drain, a sound node. Only when the second peer's run fails too does the
    fail stand; when it does not, its judgement is the run's, and the reason says the first
    peer's result was set aside. Likewise a run that proved nothing only because a pairwise
    test did (the peer never answered: gone down, or drained by hand, since its pass; every
    node picks the same newest peer, so the whole fleet would prove nothing while it is away):
    the second peer's judgement is the run's. A peer named with --peer is the operator's
    choice: no retry."""
    from rsc_health.qualify import runner
    from rsc_health.qualify.judge import FAIL, INCONCLUSIVE
    from rsc_health.qualify.verdict import judge_run

    pair = {s.name for s in specs if runner.is_pairwise(s)}
    if judged.verdict == FAIL:
        again_tests = {o.test for o in judged.outcomes if o.failed}
        again_tests |= {test for test, j, _u, _h in judged.judgements if j.status == FAIL}
    elif judged.verdict == INCONCLUSIVE:
        # Outcomes that proved nothing, and no metric left unjudged (a second peer would not
        # give that one peers).
        again_tests = {o.test for o in judged.outcomes if o.inconclusive}
        if any(j.status == INCONCLUSIVE for _t, j, _u, _h in judged.judgements):
            return judged
    else:
        return judged
    if not again_tests or not again_tests <= pair:
        return judged
    again = {s.name: runner.run_test(s, deadline=deadline, peer=second)
             for s in specs if s.name in again_tests}
    retried = judge_run([again.get(o.test, o) for o in judged.outcomes], peers_of=peers_of,
                        baseline=baseline, rules=rules, **owed)
    if judged.verdict == INCONCLUSIVE:
        note = f"pairwise against {first} proved nothing ({judged.reason}); against {second}"
        retried.reason = (f"{note}: {retried.reason}" if retried.reason else note)[:4000]
        return retried
    if retried.verdict == FAIL:
        retried.reason = (f"failed against two known-good peers ({first}, {second}): "
                          f"{retried.reason}")[:4000]
        return retried
    note = (f"pairwise against {first} failed ({judged.reason}); against {second} it did not: "
            f"{first}'s result set aside (is {first} itself degraded?)")
    retried.reason = f"{note}; {retried.reason}" if retried.reason else note
    return retried


def _run_doc(run_rec, judged, specs, gate, after) -> dict:
    """`qualify run --json`: the run, the node's own checks that were not ok (drains, checker
    errors, warnings) before and after the tests, its judged metrics and its tests'
    outcomes."""
    return {
        "run_id": run_rec.run_id, "node": run_rec.node, "tier": run_rec.tier,
        "verdict": judged.verdict, "reason": judged.reason, "gpu_model": run_rec.gpu_model,
        "driver": run_rec.driver, "tests": [s.name for s in specs],
        "results": [dict(test=t, metric=j.metric, index=j.index, value=j.value, unit=u,
                         status=j.status, basis=j.basis, median=j.median,
                         threshold=j.threshold, percentile=j.percentile, peers=j.peers,
                         reason=j.reason) for t, j, u, _h in judged.judgements],
        "outcomes": [dict(test=o.test, failed=o.failed, inconclusive=o.inconclusive,
                          warned=o.warned) for o in judged.outcomes],
        "node_checks": [f.to_dict() for f in gate.findings if f.status is not Status.OK],
        "node_checks_after": [f.to_dict() for f in (after.findings if after else ())
                              if f.status is not Status.OK],
    }


def _echo_run(run_rec, judged, gate, after) -> None:
    """`qualify run`: the node's own warnings (they do not block), a line per judged metric and
    per failed or inconclusive test (the node's checks among them), then the verdict."""
    from rsc_health.qualify import gate as qgate

    said = {qgate.one(f) for f in gate.warnings}
    for f in gate.warnings:
        echo(f"{'warn':12s} {qgate.TEST}: {qgate.one(f)}")
    for f in after.warnings if after else ():
        if qgate.one(f) not in said:  # the first look's are still there: read-only
            echo(f"{'warn':12s} {qgate.AFTER}: {qgate.one(f)}")
    for t, j, _u, _h in judged.judgements:
        idx = f"[{j.index}]" if j.index else ""
        echo(f"{j.status:12s} {t}: {j.metric}{idx} = {j.value:.6g}  {j.reason}")
    for o in judged.outcomes:
        if o.failed or o.inconclusive:
            echo(f"{'fail' if o.failed else 'inconclusive':12s} {o.test}: "
                 f"{o.failed or o.inconclusive}")
        elif o.warned:
            echo(f"{'warn':12s} {o.test}: {o.warned}")
    echo(f"qualify {run_rec.tier} on {run_rec.node}: {judged.verdict.upper()}"
         + (f" ({judged.reason[:300]})" if judged.reason else ""))


@qualify.command("baseline")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def baseline_cmd(ctx, as_json) -> None:
    """The fleet's own baseline: passing results per GPU model, driver, metric and slot."""
    from rsc_health.qualify import store

    engine = _engine(ctx)
    with engine.connect() as conn:
        rows = store.baseline(conn, since=store.since(datetime.now(UTC).replace(tzinfo=None),
                                                        ctx.obj.config))
    if as_json:
        click.echo(json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        echo("no passing qualification results yet")
        return
    for r in rows:
        idx = f"[{r['idx']}]" if r["idx"] else ""
        echo(f"{r['gpu_model'] or '?':24s} {r['driver'] or '?':12s} {r['metric']}{idx}: "
             f"median {r['median']:.6g} {r['unit']}, spread {r['spread_pct']}%, "
             f"{r['nodes']} nodes")


@qualify.command("show")
@click.argument("node")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show(ctx, node, as_json) -> None:
    """A node's latest qualification runs and each metric's judgement."""
    from rsc_health.qualify import store

    with _engine(ctx).connect() as conn:
        runs = store.latest_runs(conn, node)
    if as_json:
        click.echo(json.dumps(runs, indent=1, default=str))
        return
    if not runs:
        echo(f"{node}: never qualified")
    for r in runs:
        echo(f"{r['ended']:%Y-%m-%d %H:%M} {r['tier']:5s} {r['verdict'].upper():12s} "
             f"{r['reason'][:200]}")
        for x in r["results"]:
            idx = f"[{x['idx']}]" if x["idx"] else ""
            pct = f" p{x['percentile']:.0f}" if x["percentile"] is not None else ""
            echo(f"    {x['status']:12s} {x['metric']}{idx} = {x['value']:.6g} {x['unit']}"
                 f"{pct} ({x['basis']}, {x['peers']} peers)")


def _flow_parts(ctx):
    from rsc_health.qualify.flow import HistorianSide
    from rsc_health.slurm import from_config

    injected = getattr(ctx.obj, "slurm", None)
    window = float(ctx.obj.config.get("qualify.strikes_window_days"))
    return (injected or from_config(ctx.obj.config)), HistorianSide(_engine(ctx), window)


def _flow(cfg, slurm, history, tier: str, timeout_s: float | None = None):
    """A Flow with the site's strikes and the mass-drain guard over its fail drains."""
    from rsc_health.qualify.flow import Flow, mass_drain_guard

    return Flow(slurm, history, command=list(cfg.get("qualify.node_command")), tier=tier,
                timeout_s=timeout_s or float(cfg.get("qualify.flow_timeout_s")),
                enabled=cfg.actions_enabled, strikes=int(cfg.get("qualify.strikes")),
                guard=mass_drain_guard(slurm, cfg))


@qualify.command("start")
@click.argument("nodes")
@click.option("--tier", type=click.Choice(["lite", "full", "deep"]), default="full",
              show_default=True)
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Seconds to wait for each node's result ([qualify] flow_timeout_s).")
@click.option("--parallel", type=click.IntRange(min=1), default=None,
              help="Flows at once, each on its own node ([qualify] parallel).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def start(ctx, nodes, tier, timeout_s, parallel, as_json) -> None:
    """Qualify NODES (a hostlist of nodes rsc-health drained) in Slurm, side by side in
    batches of [qualify] parallel (--parallel 1: one after another)."""
    from rsc_health.hostlist import HostlistError, expand
    from rsc_health.qualify.flow import run_batches

    cfg = ctx.obj.config
    try:
        names = list(dict.fromkeys(expand(nodes)))  # a node named twice is qualified once
    except HostlistError as exc:
        raise click.ClickException(f"NODES: {exc}") from exc
    slurm, history = _flow_parts(ctx)
    flow = _flow(cfg, slurm, history, tier, timeout_s)

    def said(r) -> None:
        if not as_json:
            echo(f"{r.node}: {r.result}" + (f" ({r.detail[:300]})" if r.detail else "")
                 + (f" [{', '.join(r.actions)}]" if r.actions else ""))

    results = run_batches([(name, partial(flow.run, name)) for name in names],
                          parallel or int(cfg.get("qualify.parallel")), said)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=1, default=list))
    ctx.exit(0 if all(r.result in ("pass", "would_qualify") for r in results) else 1)


def _due(cfg, nodes, history, now, limit: int,
         reserved: dict[str, str] | None = None) -> tuple[list, set[str], set[str]]:
    """`qualify auto`'s nodes, in order, with why: repairs closed and retries first, then idle
    suspects, then (with [qualify] on_driver_change) nodes whose driver or firmware changed;
    at most `limit`; never a node in `reserved` (a reservation not ours). Also which of them
    are suspects and which driver changes."""
    from rsc_health.historian import suspects as hs
    from rsc_health.qualify.flow import auto_candidates, suspect_candidates

    backoff = {"retry_min": float(cfg.get("qualify.retry_min")),
               "retry_max_min": float(cfg.get("qualify.retry_max_min"))}
    reserved = reserved or {}
    due = auto_candidates(nodes, history, now, limit=limit,
                          stuck_after=int(cfg.get("qualify.inconclusive_ticket_after")),
                          reserved=reserved, **backoff)
    suspect_due = suspect_candidates(nodes, hs.active(history.engine), history, now,
                                     limit=max(0, limit - len(due)), reserved=reserved,
                                     **backoff)
    due = due + suspect_due
    if not cfg.get("qualify.on_driver_change"):
        return due, {n for n, _ in suspect_due}, set()
    from rsc_health.historian import versions
    from rsc_health.qualify.flow import driver_candidates

    with history.engine.connect() as conn:
        changed = versions.changes(conn)
    taken = {n for n, _ in due}
    driver_due = driver_candidates(nodes, {n: c for n, c in changed.items() if n not in taken},
                                   history, now, limit=max(0, limit - len(due)),
                                   reserved=reserved, **backoff)
    return due + driver_due, {n for n, _ in suspect_due}, {n for n, _ in driver_due}


@qualify.command("auto")
@click.option("--json", "as_json", is_flag=True)
@click.option("--dry-run", is_flag=True, help="Say which nodes would be qualified, and why.")
@click.pass_context
def auto(ctx, as_json, dry_run) -> None:
    """Qualify the nodes that are due: repair ticket closed after our drain, a retry of a
    run that proved nothing (back-off from [qualify] retry_min), an idle suspect node
    ([suspects] qualify_tier; a pass clears it, a fail drains it), or, with [qualify]
    on_driver_change, an idle node whose driver or GPU firmware changed since its last pass
    (full tier, undrained). First, a node drained [qualify] strikes times in production since
    its last pass goes to repair instead, and a drained node whose last [qualify]
    inconclusive_ticket_after runs proved nothing for the same reason gets a repair ticket
    instead of another run."""
    from rsc_health.qualify.flow import run_batches, strike_candidates, stuck_candidates

    cfg = ctx.obj.config
    slurm, history = _flow_parts(ctx)
    now = datetime.now(UTC).replace(tzinfo=None)
    nodes = slurm.nodes()
    limit = int(cfg.get("qualify.auto_max_nodes"))
    struck = strike_candidates(nodes, history, strikes=int(cfg.get("qualify.strikes")),
                               limit=limit)
    repairs = []
    if not dry_run:
        info = {n.name: n for n in nodes}
        repairs = [_flow(cfg, slurm, history, "full").repair(node, info[node], n)
                   for node, n in struck]
        if struck:
            nodes = slurm.nodes()
    stuck = stuck_candidates(nodes, history,
                             after=int(cfg.get("qualify.inconclusive_ticket_after")))
    stuck_results = []
    if not dry_run:
        info = {n.name: n for n in nodes}
        stuck_results = [_flow(cfg, slurm, history, "full").stuck(node, info[node], k, why)
                         for node, k, why in stuck]
    from rsc_health.qualify.flow import FINISH_SLACK_S, reserved_by_others

    reserved = reserved_by_others(
        slurm.reservations(),
        horizon_s=float(cfg.get("qualify.flow_timeout_s")) + FINISH_SLACK_S)
    due, suspect_nodes, driver_nodes = _due(cfg, nodes, history, now, limit, reserved)
    # Due but for a reservation not ours: named, so a repaired node a technician's forgotten
    # reservation keeps drained is not a silent "no node is due" (helper-124).
    held = [(n, why, reserved[n]) for n, why in _due(
        cfg, [i for i in nodes if i.name in reserved], history, now, limit, {})[0]] \
        if reserved else []
    results: list = []
    if not dry_run:
        def flow(tier):
            return _flow(cfg, slurm, history, tier)

        def one(node: str):
            if node in suspect_nodes:
                return flow(str(cfg.get("suspects.qualify_tier"))).run(node, suspect=True)
            # A driver/firmware change: the node is in service; qualified undrained.
            return flow("full").run(node, suspect=node in driver_nodes)

        results = run_batches([(node, partial(one, node)) for node, _why in due],
                              int(cfg.get("qualify.parallel")))
    if as_json:
        click.echo(json.dumps({"due": [{"node": n, "why": w} for n, w in due],
                               "results": [r.__dict__ for r in results],
                               "repair": [{"node": n, "strikes": k} for n, k in struck],
                               "repair_results": [r.__dict__ for r in repairs],
                               "stuck": [{"node": n, "runs": k, "reason": w}
                                         for n, k, w in stuck],
                               "stuck_results": [r.__dict__ for r in stuck_results],
                               "held": [{"node": n, "why": w, "held_by": by}
                                        for n, w, by in held]},
                              indent=1, default=list))
        return
    for (node, k), r in zip(struck, repairs or [None] * len(struck), strict=True):
        echo(f"{node}: {k} production failures since its last pass -> "
             + (f"repair ({r.detail[:200]})" if r else "repair (dry run)"))
    for (node, k, why), r in zip(stuck, stuck_results or [None] * len(stuck), strict=True):
        echo(f"{node}: {k} inconclusive runs in a row ({why[:200]}) -> "
             + (f"{r.detail[:200]} [{', '.join(r.actions)}]" if r else "repair ticket (dry run)"))
    for node, why, by in held:
        echo(f"{node}: {why} -> left alone: {by}, a reservation not qualification's")
    if not due:
        echo("no node is due for qualification")
    for (node, why), r in zip(due, results or [None] * len(due), strict=True):
        echo(f"{node}: {why}" + (f" -> {r.result} ({r.detail[:200]})" if r else " (dry run)"))


@qualify.command("cleanup")
@click.option("--json", "as_json", is_flag=True)
@click.option("--older-than", "older_than_s", type=FiniteFloat(min=0), default=None,
              help="Only reservations older than this many seconds (default: [qualify] "
                   "flow_timeout_s plus 5 minutes, and past the end of the flow's own "
                   "timeout, a longer `qualify start --timeout` included: a flow still within "
                   "it is left alone).")
@click.pass_context
def cleanup_cmd(ctx, as_json, older_than_s) -> None:
    """Drain the node of every reservation a qualification flow left, and remove it."""
    from rsc_health.qualify.flow import cleanup

    if not ctx.obj.config.get("actions.enabled"):
        echo("shadow mode ([actions] enabled = false): nothing touched")
        return
    slurm, history = _flow_parts(ctx)
    own = older_than_s is None  # a person's explicit cut-off is taken as given
    if older_than_s is None:
        older_than_s = float(ctx.obj.config.get("qualify.flow_timeout_s")) + 300
    results = cleanup(slurm, history, older_than_s=older_than_s, own_deadlines=own)
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=1, default=list))
    if not as_json and not results:
        echo("no reservation left behind by a qualification flow")
    for r in results if not as_json else ():
        echo(f"{r.node}: {r.result} ({r.detail})")
