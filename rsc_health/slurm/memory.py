"""Slurm in memory: the whole of CliSlurm's interface, for tests and dry runs that need no
real cluster (tests/unit/test_memory_slurm.py holds its method set to CliSlurm's).

It keeps what slurmctld keeps and answers as scontrol/squeue would: a node's compound state
(IDLE, MIXED, ALLOCATED or DOWN, then +DRAIN and any flag Slurm holds such as
REBOOT_REQUESTED; a drained node with a job left is "ALLOCATED+DRAIN", draining), its
reason with the user and the time it was set, its partitions, features and weight; jobs
running on nodes (requeue, a requeue refused for a job submitted --no-requeue, cancel, a job
that has left); reservations. Errors are the real backend's: SlurmCommandError with Slurm's
own words, JobGone, RequeueRefused, and SlurmUnavailable for every call while slurmctld is
stopped (`stop()`, `start()`, `stop_after(method)`).

`calls` lists every change asked of it, refused or not, as ("drain", node, reason),
("resume", node), ("requeue", job_id), ...; `reads` counts node-table reads (each one costs
slurmctld the table).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from rsc_health.compat import UTC
from rsc_health.slurm.api import (
    JobGone,
    JobInfo,
    NodeInfo,
    RequeueRefused,
    SlurmCommandError,
    SlurmUnavailable,
)
from rsc_health.slurm.cli_backend import _JOB_ID, _one_node, _one_word, node_update_argv

# What a node's first state word may be; the rest are flags ("DRAIN", "REBOOT_REQUESTED"...).
BASE_STATES = ("IDLE", "MIXED", "ALLOCATED", "COMPLETING", "DOWN", "FUTURE", "UNKNOWN")
# Job states squeue lists for a node (CliSlurm.jobs_on_node asks for these).
ON_NODE = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED")  # cli_backend's
UNAVAILABLE = "Unable to contact slurm controller (connect failure)"


@dataclass
class _Job:
    job_id: str
    state: str
    nodes: str = ""
    requeue: bool = True
    user: str = "root"
    partition: str = ""
    excluded: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    command: str = ""


@dataclass
class _Node:
    name: str
    state: str  # as scontrol prints it: "IDLE", "MIXED+DRAIN", "DOWN*+DRAIN"...
    reason: str = ""
    reason_user: str = ""
    reason_time: datetime | None = None
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    weight: int = 1
    jobs: list[str] = field(default_factory=list)
    next_state: str = ""
    boot_time: datetime | None = None
    active_features: tuple[str, ...] | None = None

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0]

    @property
    def flags(self) -> list[str]:
        return self.state.split("+")[1:]

    def set(self, base: str | None = None, add: Iterable[str] = (),
            drop: Iterable[str] = ()) -> None:
        gone = set(drop)
        flags = [f for f in self.flags if f not in gone]
        flags += [f for f in add if f not in flags]
        self.state = "+".join([base or self.base, *flags])

    def info(self) -> NodeInfo:
        return NodeInfo(self.name, self.state, self.reason, self.reason_user, self.reason_time,
                        self.partitions, self.features, self.weight, self.next_state,
                        self.boot_time, self.active_features)


class MemorySlurm:
    def __init__(
        self,
        nodes: Iterable[str] = (),
        *,
        partition: str = "gpu",
        user: str = "root",
        now: Callable[[], datetime] | None = None,
    ):
        self.partition = partition
        self.user = user  # who drains: Slurm stamps the reason with the caller
        self.now = now or (lambda: datetime.now(UTC))
        self.timeout_s = 10.0
        self.bin_dir = None
        self.deadline: float | None = None
        self.calls: list[tuple] = []
        self.reads = 0
        self._nodes: dict[str, _Node] = {}
        self._jobs: dict[str, _Job] = {}
        self._reservations: dict[str, tuple[str, datetime | None]] = {}
        self._reservation_users: dict[str, set[str]] = {}
        self._next_job = 1000
        self._up = True
        self._stop_after: tuple[str, bool] | None = None
        self._after: dict[str, list[Callable[[], None]]] = {}
        for name in nodes:
            self.add_node(name)

    # ---- the test's hands: what a person, slurmd or a user does ------------------------------
    def add_node(self, name: str, state: str = "IDLE", reason: str = "", *, user: str = "",
                 when: datetime | None = None, partitions: tuple[str, ...] | None = None,
                 features: tuple[str, ...] = (), weight: int = 1) -> NodeInfo:
        """A node as Slurm would hold it; `state` is any compound state scontrol prints
        ("IDLE+DRAIN+REBOOT_REQUESTED", "DOWN*+DRAIN"), `reason` set by `user` at `when`."""
        if state.split("+", 1)[0].rstrip("*~#!%$@^-") not in BASE_STATES:
            raise ValueError(f"not a Slurm node state: {state!r}")
        old = self._nodes.get(name)
        self._nodes[name] = _Node(
            name, state, reason, user or (self.user if reason else ""),
            (when or self.now()) if reason else None,
            partitions if partitions is not None else (self.partition,),
            features, weight, old.jobs if old else [])
        self._nodes[name].boot_time = old.boot_time if old else None
        return self._nodes[name].info()

    def boot(self, name: str, when: datetime | None = None) -> NodeInfo:
        """slurmd registered the node with this boot time (now when not given): a reboot, or
        the node's first registration."""
        self._nodes[self._node(name, "boot").name].boot_time = when or self.now()
        return self._nodes[name].info()

    def set_state(self, name: str, state: str, reason: str | None = None, *, user: str = "",
                  when: datetime | None = None, next_state: str = "") -> NodeInfo:
        """Slurm (or a person) changed the node: its state, and its reason when given;
        `next_state`: the state a pending reboot ends in (`scontrol reboot nextstate=RESUME`)."""
        node = self._node(name, "update")
        self.add_node(
            name, state, node.reason if reason is None else reason,
            user=user or node.reason_user, when=when or node.reason_time,
            partitions=node.partitions, features=node.features, weight=node.weight)
        self._nodes[name].next_state = next_state
        return self._nodes[name].info()

    def start_job(self, node: str, job_id: str | None = None, *, user: str = "alice",
                  requeue: bool = True, partition: str | None = None,
                  whole_node: bool = True, state: str = "RUNNING") -> str:
        """A job starts on `node` (a new one, a new one with this `job_id`, or one submitted
        earlier): the node is ALLOCATED (MIXED when the job does not take it whole)."""
        n = self._node(node, "job")
        job_id = job_id or self._new_job_id()
        if job_id not in self._jobs:
            self._jobs[job_id] = _Job(job_id, "PENDING", user=user, requeue=requeue,
                                      partition=partition or n.partitions[0])
        job = self._jobs[job_id]
        job.state, job.nodes = state, node
        n.jobs.append(job_id)
        if n.base != "DOWN":
            n.set("ALLOCATED" if whole_node and n.base == "IDLE" else
                  "MIXED" if n.base == "IDLE" else n.base)
        return job_id

    def end_job(self, job_id: str, state: str = "COMPLETED", *, listed: bool = False) -> None:
        """The job ends: it leaves the node and squeue (so job() answers None); `listed`:
        squeue still lists it in its end state (slurmctld keeps an ended job MinJobAge, 300 s
        by default, and squeue -j shows it COMPLETED, NODE_FAIL...)."""
        job = self._jobs.pop(job_id)
        self._leave(job)
        job.state = state
        if listed:
            self._jobs[job_id] = job

    def update_job(self, job_id: str, *, requeue: bool) -> None:
        """`scontrol update JobId=... Requeue=0|1`, as its owner or an admin would."""
        self._jobs[job_id].requeue = requeue

    def add_reservation(self, name: str, nodes: str, *, start: datetime | None = None,
                        users: str = "alice") -> None:
        """A reservation someone else made (`scontrol create reservation Nodes=... StartTime=...`,
        a person's maintenance or a customer's): `nodes` as scontrol prints Nodes= (a hostlist,
        "gpu[001-004]"), from `start` (now when not given). Slurm refuses none of ours over it:
        ours are MAINT,IGNORE_JOBS, which overlap any reservation."""
        _one_word("reservation", name)
        self._reservations[name] = (nodes, start or self.now())
        self._reservation_users[name] = set(users.split(","))

    def after(self, method: str, change: Callable[[], None]) -> None:
        """The world moves between two calls: `change` runs once, right after the next
        answer to `method` (a job requeued by someone else after squeue listed it)."""
        self._after.setdefault(method, []).append(change)

    @property
    def info(self) -> dict[str, NodeInfo]:
        """What slurmctld holds, node by node: the test's own eye, not a call (it counts no
        read and answers while slurmctld is stopped)."""
        return {name: n.info() for name, n in self._nodes.items()}

    def stop(self) -> None:
        """slurmctld is gone: every call raises SlurmUnavailable until start()."""
        self._up = False

    def start(self) -> None:
        self._up = True
        self._stop_after = None

    def stop_after(self, method: str, *, answered: bool = True) -> None:
        """The next `method` call takes effect, then slurmctld stops answering; with
        answered=False that call itself times out too (it landed, its answer did not)."""
        self._stop_after = (method, answered)

    # ---- SlurmAPI ----------------------------------------------------------------------------
    def node(self, name: str) -> NodeInfo:
        self._gate("node")
        _one_node("show", name)
        self.reads += 1
        info = self._node(name, "show").info()
        self._done("node")
        return info

    def nodes(self, names: list[str] | None = None) -> list[NodeInfo]:
        self._gate("nodes")
        self.reads += 1
        if names:
            for name in names:
                self._node(name, "show")
        listed = [n.info() for n in self._nodes.values() if not names or n.name in names]
        self._done("nodes")
        return listed

    def drain(self, node: str, reason: str) -> None:
        self._gate("drain")
        _one_node("update", node)
        n = self._node(node, "update")
        self.calls.append(("drain", node, reason))
        if not reason:
            raise SlurmCommandError(
                ["scontrol", "update", f"NodeName={node}"], 1,
                "You must specify a reason when DOWNING or DRAINING a node. Request denied")
        n.set(add=["DRAIN"])
        n.reason, n.reason_user, n.reason_time = reason, self.user, self.now()
        self._done("drain")

    def resume(self, node: str) -> None:
        self._gate("resume")
        _one_node("update", node)
        n = self._node(node, "update")
        self.calls.append(("resume", node))
        if "DRAIN" not in n.flags and n.base.rstrip("*~#!%$@^-") != "DOWN":
            raise SlurmCommandError(["scontrol", "update", f"NodeName={node}"], 1,
                                    "slurm_update error: Invalid node state specified")
        base = n.base if n.base.rstrip("*~#!%$@^-") != "DOWN" else (
            "ALLOCATED" if n.jobs else "IDLE")
        n.set(base, drop=["DRAIN", "NOT_RESPONDING", "FAIL"])
        n.reason, n.reason_user, n.reason_time = "", "", None
        self._done("resume")

    def undrain(self, node: str) -> None:
        """As `scontrol update State=UNDRAIN`: the DRAIN flag goes; a DOWN stays, with its
        reason; a node not drained is left so, without an error."""
        self._gate("undrain")
        _one_node("update", node)
        n = self._node(node, "update")
        self.calls.append(("undrain", node))
        if "DRAIN" in n.flags:
            n.set(drop=["DRAIN"])
            if n.base.rstrip("*~#!%$@^-") != "DOWN":
                n.reason, n.reason_user, n.reason_time = "", "", None
        self._done("undrain")

    def requeue(self, job_id: str) -> None:
        self._gate("requeue")
        argv = ["scontrol", "requeue", job_id]
        self.calls.append(("requeue", job_id))
        job = self._jobs.get(job_id)
        if job is None:
            raise JobGone(argv, 1, f"Invalid job id specified for job {job_id}")
        if job.state == "PENDING":
            return  # `scontrol requeue Incomplete` leaves it so, and exits 0
        if not job.requeue:
            raise RequeueRefused(argv, 1, "Requested operation is presently disabled "
                                          f"for job {job_id}")
        self._leave(job)
        job.state, job.nodes = "PENDING", ""
        self._done("requeue")

    def jobs_on_node(self, node: str) -> list[JobInfo]:
        self._gate("jobs_on_node")
        n = self._node(node, "squeue")
        listed = [self._info(self._jobs[j]) for j in n.jobs if self._jobs[j].state in ON_NODE]
        self._done("jobs_on_node")
        return listed

    def job(self, job_id: str) -> JobInfo | None:
        self._gate("job")
        if not _JOB_ID.match(job_id):
            raise SlurmCommandError(["squeue", "-j", job_id], 1, "not a job id")
        job = self._jobs.get(job_id)
        return self._info(job) if job else None

    # ---- what CliSlurm offers besides ----------------------------------------------------------
    def accounting(self, timeout_s: float):
        """There is no slurmdbd in memory: the historian's loaders hear it is away."""
        raise SlurmUnavailable("no slurmdbd behind an in-memory Slurm: accounting is away")

    def update_node(self, node: str, *, features: Iterable[str] | None = None,
                    weight: int | None = None, active: Iterable[str] | None = None) -> None:
        """Features and weight as one update: refused whole (CliSlurm's own checks) or
        applied whole."""
        self._gate("update_node")
        feats = None if features is None else tuple(features)
        acts = None if active is None else tuple(active)
        node_update_argv(node, feats, weight, acts)
        n = self._node(node, "update")
        self.calls.append(("update_node", node, feats, weight))
        if feats is not None:
            n.features = feats
            n.active_features = acts if acts != feats else None
        if weight is not None:
            n.weight = weight
        self._done("update_node")

    def create_reservation(self, name: str, node: str, users: str | None = None) -> None:
        """As CliSlurm's: for `users` (default: the caller, `user`)."""
        users = users or self.user
        self._gate("create_reservation")
        _one_node("reserve", node)
        _one_word("reservation", name)
        argv = ["scontrol", "create", "reservation"]
        if name in self._reservations:
            raise SlurmCommandError(argv, 1, "Error creating the reservation: "
                                             "Duplicate reservation name")
        if node not in self._nodes:
            raise SlurmCommandError(argv, 1, "Error creating the reservation: "
                                             "Invalid node name specified")
        self.calls.append(("create_reservation", name, node, users))
        self._reservations[name] = (node, self.now())
        self._reservation_users[name] = set(users.split(","))
        self._done("create_reservation")

    def delete_reservation(self, name: str) -> None:
        self._gate("delete_reservation")
        _one_word("reservation", name)
        if self._reservations.pop(name, None) is not None:
            self.calls.append(("delete_reservation", name))
        self._done("delete_reservation")

    def reservations(self) -> dict[str, tuple[str, datetime | None]]:
        """{reservation name: (its node list, its start time, aware UTC)}, as CliSlurm's."""
        self._gate("reservations")
        return dict(self._reservations)

    def submit(self, options: list[str], command: list[str]) -> str:
        """The job is queued (PENDING); start_job(node, job_id) runs it."""
        self._gate("submit")
        opts = dict(o.removeprefix("--").split("=", 1) for o in options
                    if o.startswith("--") and "=" in o)
        if "reservation" in opts and opts["reservation"] not in self._reservations:
            raise SlurmCommandError(["sbatch"], 1, "sbatch: error: Batch job submission "
                                                   "failed: Requested reservation is invalid")
        if "reservation" in opts and self.user not in self._reservation_users.get(
                opts["reservation"], ()):
            # Slurm 22.05, whatever the caller's AdminLevel (tests/slurm/test_operator_rights).
            raise SlurmCommandError(["sbatch"], 1, "sbatch: error: Batch job submission "
                                                   "failed: Access denied to requested "
                                                   "reservation")
        job_id = self._new_job_id()
        self._jobs[job_id] = _Job(job_id, "PENDING", user=self.user,
                                  requeue="--no-requeue" not in options,
                                  partition=opts.get("partition", self.partition),
                                  options=tuple(options), command=shlex.join(command))
        self.calls.append(("submit", job_id))
        self._done("submit")
        return job_id

    def cancel(self, job_id: str) -> None:
        self._gate("cancel")
        if not _JOB_ID.match(job_id):
            raise SlurmCommandError(["scancel", job_id], 1, "not a job id")
        self.calls.append(("cancel", job_id))
        if job_id in self._jobs:  # scancel of a job that is not there says nothing, exit 0
            self.end_job(job_id, "CANCELLED")
        self._done("cancel")

    # ---- plumbing ------------------------------------------------------------------------------
    def _gate(self, method: str) -> None:
        if not self._up:
            raise SlurmUnavailable(UNAVAILABLE)

    def _done(self, method: str) -> None:
        for change in self._after.pop(method, []):
            change()
        if self._stop_after and self._stop_after[0] == method:
            answered = self._stop_after[1]
            self._up, self._stop_after = False, None
            if not answered:
                raise SlurmUnavailable(f"{method}: did not answer within {self.timeout_s:g}s")

    def _node(self, name: str, verb: str) -> _Node:
        if name not in self._nodes:
            raise SlurmCommandError(["scontrol", verb, "node", name], 1,
                                    f"Node {name} not found")
        return self._nodes[name]

    def _leave(self, job: _Job) -> None:
        n = self._nodes.get(job.nodes)
        if n is None or job.job_id not in n.jobs:
            return
        n.jobs.remove(job.job_id)
        if not n.jobs and n.base in ("ALLOCATED", "MIXED", "COMPLETING"):
            n.set("IDLE")

    def _new_job_id(self) -> str:
        self._next_job += 1
        return str(self._next_job)

    @staticmethod
    def _info(job: _Job) -> JobInfo:
        return JobInfo(job.job_id, job.state, job.nodes, job.requeue, job.excluded, job.user,
                       job.partition)

    def __repr__(self) -> str:
        return f"MemorySlurm({', '.join(f'{n.name}={n.state}' for n in self._nodes.values())})"

