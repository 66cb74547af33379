"""The suspect tier's plan (rsc_health/suspects.py `plan`, pure) on random fleets: whatever
the nodes, their states, partitions, features and weights, and the open episodes, in whatever
order Slurm and the historian list them, the plan is the same; no partition gets more
suspects than the guard allows; a node a person or Slurm drained or downed is never made a
suspect in Slurm (only given back what the tier took);
shadow mode writes nothing (a pilot's shadow nodes neither, and take no live node's place
in the guard, unless the tier's marks are still on them); only the trusted feature is ever
taken or given; a node is given back only what the tier took. Hypothesis draws the fleets."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rsc_health.actions import guard_limit
from rsc_health.historian.suspects import Episode
from rsc_health.model import ActionKind, SuspectState
from rsc_health.policy import is_ours
from rsc_health.slurm.api import NodeInfo
from rsc_health.suspects import APPLIED, HELD, PERSON, SHADOW, TierRules, plan

T = datetime(2026, 11, 26, 10, 0)
TRUSTED, WEIGHT = "rsc_trusted", 1000
STATES = ["IDLE", "MIXED", "ALLOCATED", "IDLE+DRAIN", "MIXED+DRAIN", "DOWN*", "DOWN+DRAIN",
          "IDLE+DRAIN"]
REASONS = ["", "maintenance by ops", "rsc_health:now:xid79:gpu3 XID 79 (fallen off the bus)"]


def _fleet(seed: int):
    rng = random.Random(seed)
    nodes, episodes, restore = [], [], {}
    for i in range(rng.randint(1, 40)):
        name = f"n{i:03d}"
        state = rng.choice(STATES)
        reason = rng.choice(REASONS) if "DRAIN" in state or "DOWN" in state else ""
        parts = tuple(rng.sample(["a", "b", "c"], rng.randint(0, 2)))
        feats = tuple(f for f in (TRUSTED, "site_x", "ib") if rng.random() < 0.7)
        weight = rng.choice([1, 1, 5, WEIGHT])
        nodes.append(NodeInfo(name, state, reason, partitions=parts, features=feats,
                              weight=weight))
        if rng.random() < 0.4:
            episodes.append(Episode(
                id=i, node=name, state=SuspectState.SUSPECT, since=T, last_evidence=T,
                expires=T + timedelta(hours=24), metric="sm_clock_ratio",
                value=0.7, peer_median=0.97, deviation=rng.choice([4.5, 6.0, 6.0, 30.0]),
                job_ids=("1",), source=rng.choice(["telemetry", "steps"]), detail="",
                changed=T, changed_by="t", change_reason="", tier=rng.choice(
                    ["", APPLIED, SHADOW, HELD, PERSON]),
                slurm_weight=rng.choice([None, 1, 5])))
        if rng.random() < 0.3:
            restore[name] = rng.choice([1, 5])
    if rng.random() < 0.2:  # an episode of a node Slurm no longer lists
        episodes.append(Episode(
            id=999, node="gone", state=SuspectState.SUSPECT, since=T, last_evidence=T,
            expires=T, metric="m", value=None, peer_median=None, deviation=None, job_ids=(),
            source="telemetry", detail="", changed=T, changed_by="t", change_reason="",
            tier="", slurm_weight=None))
    enabled = rng.random() < 0.8
    live = None
    if rng.random() < 0.3:  # a pilot: [nodes."GLOB".actions] enabled on some nodes only
        chosen = {n.name for n in nodes if rng.random() < 0.5}
        live = chosen.__contains__
    rules = TierRules(TRUSTED, WEIGHT, rng.choice([0.05, 0.2, 0.5, 1.0]), enabled, live)
    return nodes, episodes, rules, restore


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), order=st.integers(0, 2**32 - 1))
def test_the_plan_keeps_its_promises_on_any_fleet(seed, order):
    nodes, episodes, rules, restore = _fleet(seed)
    changes = plan(nodes, episodes, rules, restore)
    # any order in, the same plan out
    mixed_nodes, mixed_eps = list(nodes), list(episodes)
    random.Random(order).shuffle(mixed_nodes)
    random.Random(order + 1).shuffle(mixed_eps)
    assert sorted(map(repr, plan(mixed_nodes, mixed_eps, rules, restore))) == sorted(
        map(repr, changes))

    info = {n.name: n for n in nodes}
    writes = [c for c in changes if c.features is not None or c.weight is not None]
    for c in writes:
        assert rules.writes(c.node), c  # shadow mode: a write to Slurm is a write
        n = info[c.node]
        person = (n.drain_set and not is_ours(n.reason)) or n.down
        # never taken off one a person or Slurm holds (giving back what the tier took is not
        # a change to their state: the node stays drained, and is whole when they resume it)
        assert not person or c.kind is ActionKind.SUSPECT_RESTORE, c
        if c.features is not None:  # only the trusted feature moves
            assert set(c.features) ^ set(n.features) <= {TRUSTED}, c
        if c.kind is ActionKind.SUSPECT_RESTORE:
            assert c.node in restore and c.weight == restore[c.node]
    # the guard: per partition, suspects the tier holds in Slurm after the plan (a shadow
    # node's would_suspect is none: it never takes a live node's place)
    members: dict[str, int] = {}
    for n in nodes:
        for p in n.partitions:
            members[p] = members.get(p, 0) + 1
    held = {c.node for c in changes if c.kind is ActionKind.SUSPECT_HELD}
    # a shadow node whose marks the tier left in Slurm (applied before it turned shadow) is
    # kept from big jobs all the same: it takes a place, and nothing can give it back
    saved = {**restore, **{e.node: e.slurm_weight for e in episodes
                           if e.slurm_weight is not None}}
    stuck = [n for n in nodes if not rules.writes(n.name) and n.name in saved
             and TRUSTED not in n.features
             and (n.weight == WEIGHT or n.weight != saved[n.name])]
    suspects = [info[e.node] for e in episodes
                if e.node in info and e.node not in held and rules.writes(e.node)] + stuck
    for p, total in members.items():
        assert sum(p in n.partitions for n in suspects) <= max(guard_limit(
            total, rules.max_share), sum(p in n.partitions for n in stuck)), p
    # and a live node the guard held found one of its partitions full of live suspects
    for c in changes:
        if c.kind is ActionKind.SUSPECT_HELD and c.why.startswith("guard:") \
                and rules.writes(c.node):
            # a node in no partition is in the plan's partition "" (counted as one node)
            assert any(sum(p in (n.partitions or ("",)) for n in suspects)
                       >= guard_limit(members.get(p, 1), rules.max_share)
                       for p in info[c.node].partitions or ("",)), c


def test_the_drawn_fleets_exercise_each_branch():
    kinds = set()
    for seed in range(200):
        nodes, episodes, rules, restore = _fleet(seed)
        kinds |= {c.kind for c in plan(nodes, episodes, rules, restore)}
    assert {ActionKind.SUSPECT, ActionKind.SUSPECT_HELD, ActionKind.SUSPECT_RESTORE,
            ActionKind.WOULD_SUSPECT} <= kinds
