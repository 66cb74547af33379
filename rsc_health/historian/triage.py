"""Failed-job triage (issue 23 item 6): every failed job labelled `host`, `user` or `unknown`,
with its evidence. Computed on read from what the historian already holds (jobs, job_nodes,
check_results, node_actions, node_events): nothing is stored, so a late import (events, a
ticket system's history) changes the labels of the jobs it explains.

The evidence, each looked for on the job's own nodes inside the attribution window
[end - before_s, end + after_s] ([attribution], the window `healthctl attribute` uses):

  host   a failing check (a drain-severity failure, or an XID that is not of the application
         class) on one of its nodes; rsc-health draining or requeuing one of its nodes (a
         `rsc_health:` reason); one of its nodes going DOWN or FAIL (node_events; a planned
         maintenance reason makes it the site's, not the node's: no node is blamed); Slurm's
         own NODE_FAIL or BOOT_FAIL
  user   an application-class XID (xid_catalog.toml: 13, 31, 43, ...: the program's error,
         never the node's); OUT_OF_MEMORY, TIMEOUT, DEADLINE; a FAILED job whose exit code is
         non-zero without a signal (the program exited with an error) or whose signal is a
         program's crash (SIGSEGV, SIGABRT, SIGFPE, SIGILL)
  unknown everything else: a FAILED job killed by SIGKILL or SIGBUS (the OOM killer, a person,
         or the hardware: nothing says which), CANCELLED or REQUEUED without host evidence,
         FAILED with exit 0:0

Host evidence wins over user evidence (the job's own error after its GPU fell off the bus is
not its fault); every piece of evidence found is listed either way. `nodes` names the nodes a
`host` label blames (none for NODE_FAIL without other evidence, or maintenance): the lemon
features count them (`host_failed_jobs`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
from sqlalchemy import Engine, or_, select

from rsc_health.historian import schema
from rsc_health.historian.attribute import (
    ACTING_KINDS,
    HOST_FAIL_STATES,
    Window,
    failing_check,
)
from rsc_health.historian.outages import OutageRules, planned_pattern
from rsc_health.model import REASON_PREFIX

HOST, USER, UNKNOWN = "host", "user", "unknown"
LABELS = (HOST, USER, UNKNOWN)
# The end states of a job that did not succeed (sacct's first word of State).
FAILED_JOB_STATES = ("FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE",
                     "CANCELLED", "REQUEUED")
SLURM_HOST_STATES = HOST_FAIL_STATES
USER_STATES = {"OUT_OF_MEMORY": "OUT_OF_MEMORY: the job ran out of the memory it asked for",
               "TIMEOUT": "TIMEOUT: the job ran past its time limit",
               "DEADLINE": "DEADLINE: the job ran past its deadline"}
# Signals a program's own crash raises (signal.h numbers, as sacct prints them).
CRASH_SIGNALS = {4: "SIGILL", 6: "SIGABRT", 8: "SIGFPE", 11: "SIGSEGV"}
UNKNOWN_SIGNALS = {7: "SIGBUS", 9: "SIGKILL"}
COLUMNS = ["job_pk", "job_id", "user", "state", "exit_code", "end", "label", "nodes",
           "evidence"]

J, JN, C, E, NA = (schema.jobs, schema.job_nodes, schema.check_results, schema.node_events,
                   schema.node_actions)


def triage(engine: Engine, lo: datetime, hi: datetime, *, window: Window | None = None,
           rules: OutageRules | None = None, node: str | None = None) -> pd.DataFrame:
    """The failed jobs that ended in [lo, hi) (COLUMNS; `nodes` and `evidence` are lists),
    oldest first. `node`: only the jobs that ran on it."""
    window = window or Window()
    rules = rules or OutageRules()
    jobs_q = select(J.c.id, J.c.job_id, J.c.user, J.c.state, J.c.exit_code, J.c.end).where(
        J.c.state.in_(FAILED_JOB_STATES), J.c.end >= lo, J.c.end < hi)
    if node is not None:
        jobs_q = jobs_q.where(J.c.id.in_(select(JN.c.job_pk).where(JN.c.node == node)))
    before, after = timedelta(seconds=window.before_s), timedelta(seconds=window.after_s)
    with engine.connect() as conn:
        jobs = _frame(conn.execute(jobs_q.order_by(J.c.end, J.c.id)),
                      ["job_pk", "job_id", "user", "state", "exit_code", "end"])
        if jobs.empty:
            return pd.DataFrame(columns=COLUMNS)
        found = [_frame(conn.execute(q), ["node", "a", "b", "t0", "t1"])
                 for q in _evidence_queries(lo - before, hi + after, node)]
        nodes = sorted(set().union(*(f["node"] for f in found)))
        pairs = _job_nodes(conn, jobs_q.with_only_columns(J.c.id, J.c.end), nodes)
    checks, acts, downs = (_in_window(f, pairs, before, after) for f in found)
    book = _Evidence(rules.application_xids)
    book.read(checks, acts, downs, lambda reason: planned_pattern(reason, rules) is not None)
    labelled = [book.label(pk, state, exit_code) for pk, state, exit_code
                in zip(jobs["job_pk"], jobs["state"], jobs["exit_code"], strict=True)]
    jobs["label"] = [x[0] for x in labelled]
    jobs["nodes"] = [x[1] for x in labelled]
    jobs["evidence"] = [x[2] for x in labelled]
    return jobs[COLUMNS]


def _evidence_queries(span_lo: datetime, span_hi: datetime, node: str | None) -> list:
    """Failing checks, rsc-health's own drains and DOWN/FAIL events over the whole span (they
    are few), matched to each job's nodes and window afterwards: a join per job and node
    walked every check row of the node before the window (9.4 s of 15 at the paper's scale)."""
    checks_q = select(C.c.node, C.c.check, C.c.code, C.c.time, C.c.last_seen).where(
        failing_check(), C.c.time <= span_hi, C.c.last_seen >= span_lo)
    acts_q = select(NA.c.node, NA.c.action, NA.c.reason, NA.c.time, NA.c.time.label("t1")).where(
        NA.c.time >= span_lo, NA.c.time <= span_hi, NA.c.action.in_(ACTING_KINDS),
        NA.c.reason.like(REASON_PREFIX + "%"))
    downs_q = select(E.c.node, E.c.state, E.c.reason, E.c.start, E.c.end).where(
        E.c.start <= span_hi, or_(E.c.end.is_(None), E.c.end >= span_lo),
        or_(E.c.state.like("DOWN%"), E.c.state.like("FAIL%")))
    if node is None:
        return [checks_q, acts_q, downs_q]
    return [checks_q.where(C.c.node == node), acts_q.where(NA.c.node == node),
            downs_q.where(E.c.node == node)]


class _Evidence:
    """What was found against each failed job (by its key): the host's side, the user's, and
    the nodes the host evidence blames."""

    def __init__(self, application_xids: tuple[str, ...]) -> None:
        self.application_xids = frozenset(application_xids)
        self.host: dict[int, list[str]] = {}
        self.user: dict[int, list[str]] = {}
        self.blamed: dict[int, set[str]] = {}

    def _host(self, pk: int, node: str, text: str) -> None:
        self.host.setdefault(pk, []).append(text)
        self.blamed.setdefault(pk, set()).add(node)

    def read(self, checks, acts, downs, maintenance) -> None:
        app_codes = self.application_xids
        for pk, n, check, code in checks:
            if check == "xid" and code in app_codes:
                self.user.setdefault(pk, []).append(
                    f"{code} on {n}: an application-class XID (the job's own error)")
            else:
                self._host(pk, n, f"failing check {check} {code} on {n}".replace("  ", " ")
                           .strip())
        for pk, n, action, reason in acts:
            self._host(pk, n, f"rsc-health {action} {n}: {reason}")
        for pk, n, state, reason in downs:
            if maintenance(reason or ""):  # said, but blames no node
                self.host.setdefault(pk, []).append(
                    f"{n} {state} for planned maintenance ({reason}): not the node's")
            else:
                self._host(pk, n, f"{n} {state} in the window" + (f": {reason}" if reason
                                                                  else ""))

    def label(self, pk: int, state: str, exit_code) -> tuple[str, list[str], list[str]]:
        """(label, blamed nodes, evidence) of one failed job."""
        found_host = list(self.host.get(pk, ()))
        if state in SLURM_HOST_STATES:
            found_host.insert(0, f"Slurm: {state}")
        found_user = self.user.get(pk, [])
        if found_host:
            return HOST, sorted(self.blamed.get(pk, ())), found_host + found_user
        if found_user:
            return USER, [], found_user
        label, said = _by_state(state, exit_code)
        return label, [], said


def _job_nodes(conn, jobs_q, nodes: list[str]) -> pd.DataFrame:
    """job_pk, end, node of the failed jobs (`jobs_q`: id, end) on `nodes`. Read by the jobs'
    end (their index) and filtered here: asked by node, SQLite walked each node's whole
    history of jobs (6.3 s of 9 at the paper's scale)."""
    q = jobs_q.add_columns(JN.c.node).join_from(J, JN, JN.c.job_pk == J.c.id)
    pairs = _frame(conn.execute(q), ["job_pk", "end", "node"])
    return pairs[pairs["node"].isin(nodes)]


def _frame(result, columns: list[str]) -> pd.DataFrame:
    """A result's rows as a DataFrame, by plain tuples (pandas probing each Row for fields
    cost 1.4 s at the paper's scale)."""
    return pd.DataFrame([tuple(r) for r in result], columns=columns)


def _in_window(found: pd.DataFrame, pairs: pd.DataFrame, before: timedelta,
               after: timedelta) -> list[tuple]:
    """(job_pk, node, a, b) for each piece of evidence (node, a, b, t0, t1: an interval)
    overlapping a failed job's window [end - before, end + after] on one of its nodes."""
    if found.empty or pairs.empty:
        return []
    m = pairs.merge(found, on="node")
    end = pd.to_datetime(m["end"])
    t1 = pd.to_datetime(m["t1"])  # NaT: still open
    hit = m[(pd.to_datetime(m["t0"]) <= end + after) & (t1.isna() | (t1 >= end - before))]
    hit = hit.drop_duplicates(["job_pk", "node", "a", "b"])
    return list(zip(hit["job_pk"], hit["node"], hit["a"], hit["b"], strict=True))


def _by_state(state: str, exit_code: str) -> tuple[str, list[str]]:
    """No evidence in the window: what the job's own end says."""
    if state in USER_STATES:
        return USER, [USER_STATES[state]]
    if state != "FAILED":
        return UNKNOWN, [f"{state} with no host evidence in the window"]
    code, signal = _exit(exit_code)
    if code is None:
        return UNKNOWN, [f"FAILED, exit code {exit_code!r} unreadable"]
    if signal in CRASH_SIGNALS:
        return USER, [f"FAILED by {CRASH_SIGNALS[signal]} (the program crashed), no host "
                      "evidence in the window"]
    if signal in UNKNOWN_SIGNALS:
        return UNKNOWN, [f"FAILED by {UNKNOWN_SIGNALS[signal]} (the OOM killer, a person or "
                         "the hardware), no host evidence in the window"]
    if signal:
        return UNKNOWN, [f"FAILED by signal {signal}, no host evidence in the window"]
    if code:
        return USER, [f"FAILED with exit code {code}, no host evidence in the window"]
    return UNKNOWN, ["FAILED with exit code 0:0, no host evidence in the window"]


def _exit(text: str) -> tuple[int | None, int]:
    """sacct's ExitCode "code:signal" -> (code, signal); (None, 0) when unreadable."""
    head, _, tail = (text or "").partition(":")
    try:
        return int(head), int(tail or 0)
    except ValueError:
        return None, 0


def host_failed_jobs(frame: pd.DataFrame) -> pd.Series:
    """Per node: the failed jobs labelled host that blame it (a lemon feature input)."""
    if frame.empty:
        return pd.Series(dtype="float64")
    blamed = frame[frame["label"] == HOST].explode("nodes").dropna(subset=["nodes"])
    return blamed.groupby("nodes").size().astype("float64").rename_axis("node")


def summary(frame: pd.DataFrame) -> dict[str, int]:
    """Jobs per label, every label present."""
    counts = frame["label"].value_counts() if not frame.empty else pd.Series(dtype=int)
    return {label: int(counts.get(label, 0)) for label in LABELS}
