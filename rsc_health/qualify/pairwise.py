"""Pairwise tests: the node under test against a known-good peer: perftest's `ib_write_bw`
client here and its server on the peer (server_command), or nccl-tests launched on both from
here (`mpirun -H <node>,{peer}`: no server_command; the ranks must sit on two hosts, the peer
one of them). The peer is a node whose newest qualification run within
[qualify] peer_days passed, of the same GPU model and driver, that is not itself being
qualified now (no qualification started since that pass) and not the node itself.

A run that proves nothing about the node is inconclusive, never a fail and never a pass: no
known-good peer, a peer name that is not a host name (it goes into an argv: a name starting
with '-' would be an option), a peer that never answers or is busy (the server cannot start,
times out or exits non-zero), a garbled result, or a setup mismatch (the two ends report a
different link type, MTU, connection type, transport or message size: a number measured under
one setup says nothing of the other). The client's bandwidth is named `ib-pair/...` and judged
against the other nodes' pairwise results like any metric (judge.py).
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import replace

from sqlalchemy import and_, func, select

from rsc_health.model import LEGACY_LEMON_DRAIN, ActionKind, SuspectState
from rsc_health.qualify import parse
from rsc_health.qualify.judge import PASS
from rsc_health.qualify.nccl_tests import untagged
from rsc_health.qualify.outcome import Outcome

PEER = "{peer}"
# Output past procs' max_bytes is cut there: what came after (the largest message size's row,
# its wrong results, the summary) was never read, so the rows before it are no result. A wrong
# result read before the cut still fails.
MAX_OUTPUT = 1 << 20
_CUT = "{who} output cut at " + str(MAX_OUTPUT) + " bytes: the result was not all read"
# A Slurm node name as a host name: letters, digits, '.', '-', '_'; never a leading '-'.
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_RANK_HOST = re.compile(r"^#\s+Rank\s+\d+\s.*?\son\s+(\S+)\s+device", re.M)
# A pairwise metric is named apart from the same tool's single-node one: judged against other
# nodes' pairwise results only.
_PAIR_NAME = {"ib-loopback": "ib-pair", "nccl-bw": "nccl-pair"}
_SETUP = re.compile(r"^\s*(Link type|Mtu|Connection type|Transport type)\s*:\s*(\S+)", re.M)


def valid_peer(name: str) -> bool:
    return bool(name) and _HOST.fullmatch(name) is not None


def known_good(conn, *, node: str, gpu_model: str, driver: str, since) -> list[str]:
    """Nodes whose newest run since `since` passed (same model and driver), with no
    qualification started after that run ended, newest pass first."""
    from rsc_health.historian import schema

    r, a = schema.qualify_runs, schema.node_actions
    newest = (
        select(r.c.node, r.c.verdict, r.c.ended,
               func.row_number().over(partition_by=r.c.node,
                                      order_by=r.c.ended.desc()).label("n"))
        .where(and_(r.c.gpu_model == gpu_model, r.c.driver == driver, r.c.node != node,
                    r.c.ended >= since))
        .subquery()
    )
    qualifying = select(a.c.id).where(and_(
        a.c.node == newest.c.node, a.c.action == ActionKind.QUALIFY_START,
        a.c.time > newest.c.ended)).exists()
    # Judged bad since its pass (drained, or a drain verdict held, guarded or only recorded in
    # shadow mode) or slow now (an open suspect episode): its link would be the one measured,
    # and a healthy node paired with it fails.
    faulted = select(a.c.id).where(and_(
        a.c.node == newest.c.node, a.c.action.in_(JUDGED_BAD),
        a.c.time > newest.c.ended)).exists()
    suspect = select(schema.suspects.c.id).where(and_(
        schema.suspects.c.node == newest.c.node,
        schema.suspects.c.state == SuspectState.SUSPECT)).exists()
    rows = conn.execute(select(newest.c.node)
                        .where(and_(newest.c.n == 1, newest.c.verdict == PASS, ~qualifying,
                                    ~faulted, ~suspect))
                        .order_by(newest.c.ended.desc(), newest.c.node)).scalars()
    return [peer for peer in rows if valid_peer(peer)]


# What rsc-health (or a person, through it) judged of a node that unmakes its last pass.
JUDGED_BAD = tuple(str(k) for k in (
    ActionKind.DRAIN_NOW, ActionKind.DRAIN_AFTER_JOB, ActionKind.GUARD_TRIPPED,
    ActionKind.HELD_UNDER_DRAIN, ActionKind.LEMON_DRAIN, ActionKind.MANUAL_DRAIN,
    ActionKind.WOULD_DRAIN, ActionKind.QUALIFY_DRAIN)) + (LEGACY_LEMON_DRAIN,)


def _argv(template, peer: str) -> list[str]:
    return [str(t).replace(PEER, peer) for t in template]


def _setup(text: str) -> dict[str, str]:
    return {k: v for k, v in _SETUP.findall(text)}


def run_pair(name: str, plugin: str, client: list[str], server: list[str], peer: str | None,
             *, timeout_s: float, server_wait_s: float = 2.0, here: str | None = None) -> Outcome:
    """The server (on the peer) first, then after server_wait_s the client (here), each bounded
    by timeout_s and run in its own process group (collect/procs). `here`: this host's name as
    the ranks print it (gethostname, short; the default)."""
    from rsc_health.collect import procs

    if not peer:
        return Outcome(name, inconclusive="no known-good peer (none with a recent pass that is "
                       "not being qualified)")
    if not valid_peer(peer):
        return Outcome(name, inconclusive=f"peer name is not a host name: {peer[:40]!r}")
    here = here or os.uname().nodename
    if peer.split(".")[0].lower() == here.split(".")[0].lower():
        # ib_write_bw to itself is the HCA's loopback: no cable, no switch port measured.
        return Outcome(name, inconclusive=f"peer {peer} is this node: nothing between two "
                       "nodes would be measured")
    s_argv, c_argv = _argv(server, peer), _argv(client, peer)
    if not server:  # one launcher for both ends (nccl-tests under mpirun -H node,peer)
        c = procs.run_all({"client": c_argv}, timeout_s={"client": timeout_s},
                          max_bytes=MAX_OUTPUT)["client"]
        return _launched(name, plugin, c, c_argv, peer, timeout_s, here)
    done: dict[str, procs.Outcome] = {}

    def serve() -> None:
        done.update(procs.run_all({"server": s_argv}, timeout_s={"server": timeout_s},
                                  max_bytes=MAX_OUTPUT))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    time.sleep(server_wait_s)
    c = procs.run_all({"client": c_argv}, timeout_s={"client": timeout_s},
                      max_bytes=MAX_OUTPUT)["client"]
    thread.join(timeout_s + server_wait_s + 5)
    s = done.get("server")
    why = _unfinished(name, peer, timeout_s, (("client", c), ("peer's server", s)))
    if why is not None:
        return why
    if c.truncated:
        return Outcome(name, inconclusive=_CUT.format(who="client"))
    assert s is not None  # the loop above returned when it was
    c_text = c.stdout.decode("utf-8", "replace")
    s_text = s.stdout.decode("utf-8", "replace")
    mine, theirs = _setup(c_text), _setup(s_text)
    differ = sorted(k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k])
    if differ:
        k = differ[0]
        return Outcome(name, inconclusive=f"setup mismatch with {peer}: {k} {mine[k][:20]} "
                       f"here, {theirs[k][:20]} there")
    out = parse(plugin, c_text, c_argv[0])
    theirs_out = parse(plugin, s_text, s_argv[0])
    if not out.inconclusive and not out.failed and not theirs_out.inconclusive:
        sizes = {m.name.split("_")[2] for m in out.metrics + theirs_out.metrics
                 if m.name.count("_") >= 3}
        if len(sizes) > 1:
            return Outcome(name, inconclusive=f"setup mismatch with {peer}: message sizes "
                           f"{', '.join(sorted(sizes))}")
    return _renamed(name, out)


def _renamed(name: str, out: Outcome) -> Outcome:
    out.test = name
    out.metrics = [replace(m, name=_PAIR_NAME.get(m.name.split("/", 1)[0],
                                                  m.name.split("/", 1)[0] + "-pair")
                           + "/" + m.name.split("/", 1)[-1]) for m in out.metrics]
    return out


def _unfinished(name, peer, timeout_s, ends) -> Outcome | None:
    for who, p in ends:
        if p is None:
            return Outcome(name, inconclusive=f"{who} never finished")
        if p.start_error:
            return Outcome(name, inconclusive=f"{who} could not start: {p.start_error[:120]}")
        if p.timed_out:
            return Outcome(name, inconclusive=f"{who} timed out after {timeout_s:.0f} s "
                           f"(peer {peer} busy or unreachable?)")
        if p.returncode != 0:
            err = p.stderr.decode("utf-8", "replace").strip().splitlines()
            return Outcome(name, inconclusive=f"{who} exit {p.returncode}"
                           + (f": {err[-1][:120]}" if err else ""))
    return None


def _launched(name: str, plugin: str, c, argv: list[str], peer: str,
              timeout_s: float, here: str) -> Outcome:
    """Both ends from one launcher: the ranks' hosts must include the peer and this node (else
    the run measured this node alone, or the peer with some third host and not this node at
    all: inconclusive, never a pass); wrong results fail as in a single-node run."""
    text = c.stdout.decode("utf-8", "replace")
    out = parse(plugin, text, argv[0])
    if out.failed:
        out.test = name
        return out
    why = _unfinished(name, peer, timeout_s, (("launcher", c),))
    if why is not None:
        return why
    if c.truncated:  # the last rows (largest size, its #wrong) and the summary went with it
        return Outcome(name, inconclusive=_CUT.format(who="launcher"))
    hosts = {h.split(".")[0].lower() for h in _RANK_HOST.findall(untagged(text))}
    me, them = here.split(".")[0].lower(), peer.split(".")[0].lower()
    if them not in hosts or me not in hosts or me == them:
        on = ", ".join(sorted(hosts))[:80] or "no host"
        return Outcome(name, inconclusive=f"setup mismatch: ranks on {on}, not on this node "
                       f"({me[:40]}) and {peer}")
    if out.inconclusive:
        out.test = name
        return out
    return _renamed(name, out)
