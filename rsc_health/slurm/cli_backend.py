"""SlurmAPI over Slurm's commands. Works on 22.05 (whose Debian build has no --json) and newer.

Every call is an argument list (never a shell: job names and reasons are not ours to quote) with
a timeout; a timeout or "cannot contact the controller" becomes SlurmUnavailable so callers can
retry on the next sweep instead of mistaking silence for an answer.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

from rsc_health.compat import UTC
from rsc_health.slurm.api import (
    JobGone,
    JobInfo,
    NodeInfo,
    RequeueRefused,
    ShadowMode,
    SlurmCommandError,
    SlurmUnavailable,
)
from rsc_health.slurm.command import (  # noqa: F401 - read from here too
    _UNAVAILABLE,
    MAX_OUTPUT,
    STDERR_KEEP,
    CommandResult,
    run_command,
)

_REQUEUE_REFUSED = re.compile(r"presently disabled|not requeue|Requeue.*disabled", re.IGNORECASE)
# What `scontrol requeue` says of a job that left the node after squeue listed it.
_JOB_GONE = re.compile(r"invalid job id|already completing|pending execution", re.IGNORECASE)
# `Reason=text with spaces [user@2026-11-22T01:22:26]`; the text may contain anything but "[".
# Slurm's own stamp after the reason's first line: [user@YYYY-MM-DDTHH:MM:SS] (SLURM_TIME_FORMAT
# standard, no zone). A person's text holding a bracket of another shape (a zone, a date past
# the calendar) is the reason's text, not its stamp.
_REASON = re.compile(r"\bReason=(?P<text>.*?)\s*\[(?P<user>[^@\]]*)@"
                     r"(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]")
# The job states that hold an allocation on the node: a drain-now requeues each. STOPPED is a
# job its user stopped (`scancel -s STOP`): it keeps the node's GPUs, and runs on when sent CONT.
ON_NODE_STATES = "RUNNING,CONFIGURING,COMPLETING,SUSPENDED,STOPPED"
# A job's states once it has ended (squeue -o %T), the ones `requeue Incomplete` leaves alone.
_FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                       "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"})
# What `scontrol requeue` says of a het job's component other than its leader.
_NOT_HET_LEADER = re.compile(r"not heterogeneous job leader", re.IGNORECASE)
# What `scontrol delete` says of a reservation that is not there (already deleted).
_NO_RESERVATION = re.compile(r"not found|invalid reservation|reservation is invalid",
                             re.IGNORECASE)
_KEY = re.compile(r"(?:^|\s)(?P<key>[A-Za-z][\w/:]*)=")
_JOB_ID = re.compile(r"^\d+(?:_\d+|_\[[\d,\-%]+\])?(?:\+\d+)?$")


def parse_kv(line: str) -> dict[str, str]:
    """One `scontrol -o show ...` record: Key=Value pairs; a value may contain spaces."""
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.setdefault(m["key"], line[m.end() : end].strip())
    return out


_NODE_NAME = re.compile(r"NodeName=(\S+)")


def slurm_time(text: str | None) -> datetime | None:
    """A time scontrol printed without a zone, aware. We run it with TZ=UTC (SlurmCli._run),
    so it is UTC: read as local time, the hour a DST fall-back repeats is ambiguous (a
    reboot at the second 01:30 would read as an hour before it, older than the boot we
    noted, and its lift of our drain missed). A time that carries a zone keeps it."""
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        when = datetime.fromisoformat(text)
        return (when.replace(tzinfo=UTC) if when.tzinfo is None else when).astimezone(UTC)
    except (ValueError, OverflowError):
        # not a time, or one past the calendar's edge once in UTC (9999-12-31T23:59:59-01:00
        # in a person's reason text): unknown, never the whole listing's failure
        return None


# What Slurm prints after a node's fixed fields, in this order (22.05 to 24.x): a person's or
# Slurm's free text. Nothing we read about a node is taken from here but the Reason itself.
_TAIL_KEYS = ("Reason", "Comment", "Extra", "InstanceId", "InstanceType", "ReservationName")
# Always in the fixed part, once: the line is ambiguous if one is missing or repeated there.
_HEAD_KEYS = ("NodeName", "State", "CfgTRES")


class AmbiguousNode(SlurmCommandError):
    """A node's line holds Key=Value text inside a field (its Features, say) that reads like
    one of the fields we decide on: refused rather than guessed at."""

    def __init__(self, name: str, why: str):
        self.node = name
        super().__init__(["scontrol", "show", "node", name], 1,
                         f"ambiguous scontrol output for node {name!r}: {why}; "
                         "fix the node's Features/Comment/Extra text")


def parse_node_line(line: str) -> NodeInfo:
    """One record of `scontrol -o show node`. Slurm prints the fixed fields first and a
    person's text last (Reason, Comment, Extra): the fixed fields come from the part before
    the first of those, each key exactly once there, and the reason only from a Reason= that
    opens that part. Features (printed among the fixed fields) that read "a State=IDLE"
    repeat a key: the node is refused (AmbiguousNode), never read as IDLE."""
    keys = list(_KEY.finditer(line))
    name = line.split(" ", 1)[0].partition("=")[2] if line.startswith("NodeName=") else "?"
    cut = next((i for i, m in enumerate(keys) if m["key"] in _TAIL_KEYS), len(keys))
    why = _head_problem(keys[:cut])
    if why:
        raise AmbiguousNode(name, why)
    kv = parse_kv(line[:keys[cut].start() if cut < len(keys) else len(line)])
    reason, user, when = _reason(line, keys, cut)
    weight = kv.get("Weight", "1")
    return NodeInfo(
        name=kv["NodeName"],
        state=kv.get("State", ""),
        reason=reason if reason != "(null)" else "",
        reason_user=user,
        reason_time=when,
        partitions=_listed(kv.get("Partitions", "")),
        features=_listed(kv.get("AvailableFeatures", "")),
        weight=int(weight) if weight.isdigit() else 1,
        next_state=kv.get("NextState", ""),
        boot_time=slurm_time(kv.get("BootTime")),
        active_features=(_listed(kv["ActiveFeatures"]) if "ActiveFeatures" in kv
                         and kv["ActiveFeatures"] != kv.get("AvailableFeatures") else None),
    )


def _head_problem(head: list) -> str | None:
    """Why the fixed fields (the key matches before the free text) cannot be trusted: a key
    printed twice, one missing, or a record that does not open with NodeName; None if fine."""
    seen: dict[str, int] = {}
    for m in head:
        seen[m["key"]] = seen.get(m["key"], 0) + 1
    twice = sorted(k for k, n in seen.items() if n > 1)
    missing = [k for k in _HEAD_KEYS if k not in seen]
    if twice:
        return f"{', '.join(twice)} printed twice"
    if missing or not head or head[0].start() != 0 or head[0]["key"] != "NodeName":
        return f"no {', '.join(missing) or 'NodeName'} before the free text"
    return None


def _reason(line: str, keys: list, cut: int) -> tuple[str, str, datetime | None]:
    """(reason, user, time) from a Reason= that opens the free text; empty without one.
    Slurm writes the first line of the reason, then " [user@time]", then any further lines
    (joined by spaces with -o): the reason is that first line."""
    if cut >= len(keys) or keys[cut]["key"] != "Reason":
        return "", "", None
    m = _REASON.match(line[keys[cut].start():].lstrip())
    if m:
        return m["text"].strip(), m["user"], slurm_time(m["time"])
    nxt = keys[cut + 1].start() if cut + 1 < len(keys) else len(line)
    return line[keys[cut].end():nxt].strip(), "", None


def _listed(text: str) -> tuple[str, ...]:
    """A comma-separated Slurm list, without Slurm's "(null)" for none."""
    return tuple(p for p in text.split(",") if p and p != "(null)")


def node_records(out: str) -> list[str]:
    """`scontrol -o show node` output as one string per node: a line that does not open with
    NodeName= is the rest of the one before (a newline inside a Comment or Extra)."""
    records: list[str] = []
    for line in out.splitlines():
        if line.startswith("NodeName=") or not records:
            records.append(line)
        else:
            records[-1] += " " + line
    return [r for r in records if r.startswith("NodeName=")]


_SAID_ERROR = re.compile(r"^(?:\S+: )?(?:error|fatal)\b|\binvalid\b", re.IGNORECASE | re.MULTILINE)


def _error_lines(stderr: str) -> set[str]:
    """The lines of `stderr` that say error (or fatal, or invalid), without the command's
    name before them ("scontrol: ", "squeue: ")."""
    return {re.sub(r"^\S+: ", "", ln.strip(), count=1) for ln in stderr.splitlines()
            if _SAID_ERROR.search(ln)}


def _reads(argv: list[str]) -> bool:
    """Whether a command only reads Slurm: squeue, sinfo, sacct, `scontrol [-o] show|ping`,
    `sacctmgr [-flags] show|list`. Anything else may change something."""
    head, rest = argv[0], [a for a in argv[1:] if not a.startswith("-")]
    verb = rest[0] if rest else ""
    if head in ("squeue", "sinfo", "sacct"):
        return True
    if head == "scontrol":
        return verb in ("show", "ping")
    if head == "sacctmgr":
        return verb in ("show", "list")
    return False


class CliSlurm:
    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        bin_dir: str | None = None,
        deadline: float | None = None,
        read_only: bool = False,
        shadow_node=None,
    ):
        self.timeout_s = timeout_s
        # Shadow mode: only READS run (from_config); anything else raises ShadowMode.
        self.read_only = read_only
        # Per node (a pilot's `[nodes."GLOB".actions] enabled = false`; from_config): a change
        # naming a node this is true of raises ShadowMode before any command runs.
        self.shadow_node = shadow_node
        self.bin_dir = Path(bin_dir) if bin_dir else None
        # time.monotonic() after which no call may start (the sweep's budget), or None.
        self.deadline = deadline
        # The nodes the last listing refused as ambiguous (AmbiguousNode): left out of it.
        self.refused_nodes: list[str] = []
        # Error lines a read printed with exit 0: what every command says (slurm.conf's own
        # complaints), never a change's refusal.
        self._config_noise: set[str] = set()

    def accounting(self, timeout_s: float):
        """The historian's runner (sacct, sacctmgr) from the same Slurm: the same bin_dir."""
        from rsc_health.slurm.accounting import Accounting

        return Accounting(timeout_s=timeout_s, bin_dir=str(self.bin_dir or "") or None)

    # ---- plumbing --------------------------------------------------------------------------
    def _node_writes(self, node: str) -> None:
        """ShadowMode when `node` is in shadow mode by its own config (shadow_node)."""
        if self.shadow_node is not None and self.shadow_node(node):
            raise ShadowMode(["scontrol", "update", f"NodeName={node}"], 1,
                             f"shadow mode for {node} ([nodes.\"GLOB\".actions] enabled = "
                             "false): rsc-health changes nothing of it in Slurm; not run")

    def _run(self, argv: list[str], timeout_s: float | None = None) -> str:
        changes, said = not _reads(argv), argv[0]
        if self.read_only and changes:
            raise ShadowMode(argv, 1, "shadow mode ([actions] enabled = false): rsc-health "
                                      "changes nothing in Slurm; not run")
        if self.bin_dir is not None:
            argv = [str(self.bin_dir / argv[0]), *argv[1:]]
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0.05:
                raise SlurmUnavailable(f"no time left in the budget for {argv[0]}")
        # Times in UTC, one format (as the accounting's sacct): never a local hour that a DST
        # change repeats or skips. A site's wrapper in [slurm] bin_dir must pass TZ on.
        raw = run_command(argv, timeout, dict(os.environ, SLURM_TIME_FORMAT="standard",
                                              TZ="UTC"))
        # Bytes, decoded here: a job name or reason in Latin-1 (any user can set one) must
        # not stop the sweep or the prolog with a UnicodeDecodeError.
        proc = subprocess.CompletedProcess(
            argv, raw.returncode, raw.stdout.decode("utf-8", "replace"),
            raw.stderr.decode("utf-8", "replace"),
        )
        if proc.returncode != 0:
            if _UNAVAILABLE.search(proc.stderr):
                raise SlurmUnavailable(proc.stderr.strip().splitlines()[-1])
            raise SlurmCommandError(argv, proc.returncode, proc.stderr)
        errors = _error_lines(proc.stderr)
        if not changes:
            self._config_noise |= errors
        elif said == "scontrol" and errors - self._config_noise:
            # scontrol update can refuse a field, say so on stderr and still exit 0 (22.05: a
            # Weight past its largest is dropped while the features sent with it land): a
            # change Slurm only partly took is not a change made. Not so an error line a read
            # printed too: every client reading a slurm.conf whose node line has CPUs that
            # match no Sockets*Cores*Threads says "error: ... Resetting CPUs." and exits 0.
            raise SlurmCommandError(argv, 1, proc.stderr)
        return proc.stdout

    # ---- nodes -----------------------------------------------------------------------------
    def nodes(self, names: list[str] | None = None) -> list[NodeInfo]:
        # -a (--all): without it slurmctld leaves out, for any user but root, SlurmUser and
        # operators, the nodes whose partitions are all Hidden or AllowGroups they are not
        # in. Status would call such a node retired, the guard and the tier would miss it.
        argv = ["scontrol", "-a", "-o", "show", "node"]
        if names:
            argv.append(",".join(names))
        infos, self.refused_nodes = [], []
        for rec in node_records(self._run(argv)):
            try:
                try:
                    infos.append(parse_node_line(rec))
                except (ValueError, OverflowError, IndexError) as exc:
                    # a record no rule above foresaw (a person's text in a shape we misread):
                    # that node refused, as an ambiguous one, never the whole listing
                    name = _NODE_NAME.match(rec)
                    raise AmbiguousNode(name[1] if name else rec[:64],
                                        f"record not read: {type(exc).__name__}: {exc}") from exc
            except AmbiguousNode as exc:
                # One node's Features/Comment text that reads like a field we decide on is
                # that node refused, not the listing: every other node's first drain, the
                # guard and the tier read this listing, and a dead GPU elsewhere must still
                # drain. The node itself stays refused wherever it is asked for alone.
                if names and exc.node in names:
                    raise
                self.refused_nodes.append(exc.node)
        # A Comment or Extra holding a newline and then "NodeName=node05 State=IDLE ..." lists
        # node05 twice. Asked alone, Slurm prints the node's own record first: that one.
        count: dict[str, int] = {}
        for n in infos:
            count[n.name] = count.get(n.name, 0) + 1
        twice = {name: self.node(name) for name, k in count.items() if k > 1}
        out, done = [], set()
        for n in infos:
            if n.name in twice:
                if n.name not in done:
                    out.append(twice[n.name])
                    done.add(n.name)
            else:
                out.append(n)
        return out

    def node(self, name: str) -> NodeInfo:
        """The node's own record: the first of that name when it is asked for alone (a
        further NodeName= line of the same name is text inside its own Comment or Extra)."""
        _one_node("show", name)
        for rec in node_records(self._run(["scontrol", "-a", "-o", "show", "node", name])):
            if rec.startswith(f"NodeName={name} "):
                info = parse_node_line(rec)
                if info.name == name:
                    return info
        raise SlurmCommandError(["scontrol", "show", "node", name], 1, "no such node")

    def drain(self, node: str, reason: str) -> None:
        _one_node("update", node)
        self._node_writes(node)
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])

    def resume(self, node: str) -> None:
        _one_node("update", node)
        self._node_writes(node)
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    def undrain(self, node: str) -> None:
        """Lift the node's drain and nothing else: a DOWN (a person's, or Slurm's own) set
        since the caller read the node stays, with its reason (RESUME would lift it too).
        Exit 0 on a node not drained (22.05)."""
        _one_node("update", node)
        self._node_writes(node)
        self._run(["scontrol", "update", f"NodeName={node}", "State=UNDRAIN"])

    def update_node(self, node: str, *, features=None, weight: int | None = None,
                    active=None) -> None:
        """The node's features (available; `active` the active ones, the same when None: a
        node_features plugin's node has modes available that are not active) and its weight,
        in one `scontrol update`: slurmctld applies one update_node message under its node
        write lock, so no scheduling pass (nor reader) sees one without the other, and a
        refused or lost call leaves neither. None: left as it is."""
        self._node_writes(node)
        self._run(node_update_argv(node, features, weight, active))

    # ---- jobs ------------------------------------------------------------------------------
    def requeue(self, job_id: str) -> None:
        """Requeue the job if it has not finished; a heterogeneous job's component (squeue
        lists each on its own node under its own id) through its leader: Slurm requeues a het
        job whole, from the leader only ("Job not heterogeneous job leader").

        `Incomplete`: Slurm requeues a finished job too (COMPLETED, CANCELLED, FAILED: it runs
        again), and a job may end between squeue's listing and this call; with it, slurmctld
        itself requeues only a job still CONFIGURING, RUNNING, STOPPED or SUSPENDED, and
        leaves any other alone, exit 0 (a pending one too)."""
        try:
            self._run(["scontrol", "requeue", "Incomplete", job_id])
        except SlurmCommandError as exc:
            leader = self._het_leader(job_id) if _NOT_HET_LEADER.search(exc.stderr) else None
            if leader is not None:
                return self.requeue(leader)
            if _JOB_GONE.search(exc.stderr):
                raise JobGone(exc.argv, exc.returncode, exc.stderr) from None
            if not _REQUEUE_REFUSED.search(exc.stderr):
                raise
            raise RequeueRefused(exc.argv, exc.returncode, exc.stderr) from None
        self._requeued_or_gone(job_id)

    def _requeued_or_gone(self, job_id: str) -> None:
        """`scontrol requeue Incomplete` exits 0 whether it requeued the job or left a finished
        one alone: squeue's state of it says which (JobGone for one that had ended). When
        squeue cannot say (slurmctld gone since), what slurmctld answered stands: requeued."""
        argv = ["scontrol", "requeue", job_id]
        try:
            out = self._run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"])
        except SlurmUnavailable:
            return
        except SlurmCommandError as exc:
            if _JOB_GONE.search(exc.stderr):  # purged already
                raise JobGone(argv, exc.returncode, exc.stderr) from None
            raise
        states = set(out.split())
        if states and states <= _FINISHED:
            raise JobGone(argv, 0, f"job {job_id} had ended ({','.join(sorted(states))}) "
                                   "before the requeue: left so")

    def _het_leader(self, job_id: str) -> str | None:
        """The leader's id of the het job `job_id` is a component of (squeue's HetJobID: a
        field no user can fill), or None when it is not another job's component."""
        if not _JOB_ID.match(job_id):
            return None
        out = self._run(["squeue", "-h", "-j", job_id, "-O", "HetJobID:|"])
        leader = out.strip().split("|", 1)[0].strip()
        return leader if leader.isdigit() and leader != job_id else None

    def jobs_on_node(self, node: str) -> list[JobInfo]:
        """The jobs on `node`. Only fields no user can fill are asked for (never the job name,
        comment or work dir): a name holding a newline and a forged `id|RUNNING|node|...` row
        cannot add a job to this list, so it cannot get another user's job requeued. An array
        task also gets its <array>_<task> name (JobInfo.array_task), which a requeue names."""
        out = self._run(
            ["squeue", "-h", "-w", node, "-t", ON_NODE_STATES,
             "-O", "JobID:|,State:|,NodeList:|,Requeue:|,UserName:|,Partition:|,ArrayJobID:|,"
                   "ArrayTaskID:"]
        )
        jobs = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) < 8 or not _JOB_ID.match(parts[0]):
                continue
            jid, state, nodes, requeue, user, partition, array_job, task = parts[:8]
            array_task = f"{array_job}_{task}" if array_job.isdigit() and task.isdigit() else ""
            jobs.append(JobInfo(jid, state, nodes, requeue == "1", (), user, partition,
                                array_task=array_task))
        return jobs

    def job(self, job_id: str) -> JobInfo | None:
        """One job, from squeue fields no user can fill, and its excluded nodes from squeue's
        own %x: never from `scontrol show job`'s Key=Value line, where a job named
        "x ExcNodeList=node0[1-6] Requeue=0" puts its forged keys before the real ones."""
        if not _JOB_ID.match(job_id):
            raise SlurmCommandError(["squeue", "-j", job_id], 1, "not a job id")
        try:
            # -t all: squeue -j lists an ended job (COMPLETED, NODE_FAIL...; kept MinJobAge)
            # only when asked for every state (Slurm 22.05; measured by test_qualify_flow.py)
            out = self._run(["squeue", "-h", "-t", "all", "-j", job_id, "-O",
                             "JobID:|,State:|,NodeList:|,Requeue:|,UserName:|,Partition:"])
            exc_nodes = self._run(["squeue", "-h", "-t", "all", "-j", job_id, "-o",
                                   "%x"]).strip()
        except SlurmCommandError as exc:
            if "Invalid job id" in exc.stderr:
                return None
            raise
        row = next((ln for ln in out.splitlines()
                    if _JOB_ID.match(ln.split("|", 1)[0].strip())), "")
        if not row:
            return None
        jid, state, nodes, requeue, user, partition = ([p.strip() for p in row.split("|")]
                                                       + [""] * 6)[:6]
        return JobInfo(
            job_id=jid,
            state=state,
            nodes=nodes,
            requeue=requeue == "1",
            excluded=tuple(_expand(exc_nodes)) if exc_nodes not in ("", "(null)") else (),
            user=user,
            partition=partition,
        )

    # ---- reservations and jobs of our own (qualification) -------------------------------------
    def create_reservation(self, name: str, node: str, users: str | None = None) -> None:
        """A maintenance reservation of one node for `users` only (default: the user this
        process runs as, whose jobs are the only ones to go in: Slurm refuses a job into a
        reservation not naming its user, an Administrator's too), from now, without end: no
        ordinary job can start there while it stands (IGNORE_JOBS: a job still running on a
        draining node does not stop it being made)."""
        if users is None:
            import pwd

            users = pwd.getpwuid(os.geteuid()).pw_name
        _one_node("reserve", node)
        self._node_writes(node)
        _one_word("reservation", name)
        _one_word("user", users)
        self._run(["scontrol", "create", "reservation", f"ReservationName={name}",
                   f"Nodes={node}", "StartTime=now", "Duration=infinite", f"Users={users}",
                   "Flags=MAINT,IGNORE_JOBS"])

    def delete_reservation(self, name: str) -> None:
        _one_word("reservation", name)
        try:
            self._run(["scontrol", "delete", f"ReservationName={name}"])
        except SlurmCommandError as exc:
            # 22.05 says "Requested reservation is invalid" of one that is gone.
            if not _NO_RESERVATION.search(exc.stderr):
                raise

    def reservations(self) -> dict[str, tuple[str, datetime | None]]:
        """{reservation name: (its node list, its start time, aware UTC, or None)}."""
        out = self._run(["scontrol", "-o", "show", "reservation"])
        found = {}
        for line in out.splitlines():
            kv = parse_kv(line)
            if "ReservationName" in kv:
                found[kv["ReservationName"]] = (kv.get("Nodes", ""),
                                                _utc_time(kv.get("StartTime", "")))
        return found

    def submit(self, options: list[str], command: list[str]) -> str:
        """sbatch OPTIONS --wrap COMMAND (argv, quoted for the shell sbatch hands it to);
        the job id."""
        import shlex

        out = self._run(["sbatch", "--parsable", *options, "--wrap", shlex.join(command)])
        job_id = out.strip().split(";")[0]
        if not _JOB_ID.match(job_id):
            raise SlurmCommandError(["sbatch"], 0, f"no job id in {out[:80]!r}")
        return job_id

    def cancel(self, job_id: str) -> None:
        if not _JOB_ID.match(job_id):
            raise SlurmCommandError(["scancel", job_id], 1, "not a job id")
        self._run(["scancel", job_id])


# Slurm's largest node weight. scontrol 22.05 takes a larger one as an error of its own: it
# prints "Weight value (...) is greater than 4294967280", exits 0 and sends the rest of the
# update without it (measured: tests/slurm/test_suspect_tier.py).
MAX_WEIGHT = 0xFFFFFFF0


def node_update_argv(node: str, features, weight: int | None, active=None) -> list[str]:
    """`scontrol update` of a node's features and/or weight, or SlurmCommandError before any
    call: one node, each feature one word (one reading "a State=IDLE" would make the node
    ambiguous), a weight Slurm takes whole."""
    _one_node("update", node)
    argv = ["scontrol", "update", f"NodeName={node}"]
    if features is not None:
        feats = list(features)
        for f in feats:
            _one_feature(f)
        joined = ",".join(feats)
        acts = feats if active is None else list(active)
        for f in acts:
            _one_feature(f)
        argv += [f"AvailableFeatures={joined}", f"ActiveFeatures={','.join(acts)}"]
    if weight is not None:
        if (not isinstance(weight, int) or isinstance(weight, bool)
                or not 0 <= weight <= MAX_WEIGHT):
            raise SlurmCommandError(argv[:3], 2, f"Invalid weight {weight!r}")
        argv.append(f"Weight={weight}")
    if len(argv) == 3:
        raise SlurmCommandError(argv, 2, "no features nor weight: nothing to update")
    return argv


def _one_node(verb: str, name: str) -> None:
    """scontrol expands a hostlist in NodeName=: a name from a database or a file that reads
    `gpu[01-64]` or `a,b` would act on every node it names. One node per call, or no call."""
    from rsc_health.hostlist import is_one_node

    if not is_one_node(name):
        raise SlurmCommandError(["scontrol", verb, "node", repr(name)[:80]], 2,
                                "not one Slurm node name: refused")


def _utc_time(text: str) -> datetime | None:
    """scontrol's wall time (SLURM_TIME_FORMAT=standard, TZ=UTC), as aware UTC."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return None


# A node feature as the site's slurm.conf may spell it (`ib:hdr`, `gpu+nvl`, `rack/3`: Slurm
# itself judges them): printable ASCII, one word, never a comma (it would split one feature in
# two in AvailableFeatures=) nor '='.
_FEATURE = re.compile(r"[!-+\--<>-~]{1,256}")


def _one_feature(name: str) -> None:
    if not isinstance(name, str) or not _FEATURE.fullmatch(name):
        raise SlurmCommandError(["scontrol", "feature", repr(name)[:80]], 2,
                                "not a feature name")


def _one_word(what: str, name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise SlurmCommandError(["scontrol", what, repr(name)[:80]], 2, f"not a {what} name")


def _expand(nodelist: str) -> list[str]:
    from rsc_health.hostlist import expand

    return expand(nodelist)
