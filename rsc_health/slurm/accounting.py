"""Slurm accounting (sacct, sacctmgr, scontrol's reservations) for the historian.

The historian reads a year of jobs at a time, so these runners hand back raw bytes: a job name
is the user's text and may hold bytes that are not UTF-8, and decoding is the parser's call
(it replaces and counts them). Times come in UTC (TZ=UTC, SLURM_TIME_FORMAT=standard) and
`sacct --json` gives epoch seconds anyway.

Every run has a timeout and fails with the typed errors of `rsc_health.slurm.api`:
SlurmUnavailable when the command is missing, does not answer in time or cannot reach
slurmdbd/slurmctld (retry later); SlurmCommandError when Slurm answered and refused.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rsc_health.slurm.api import SlurmCommandError, SlurmUnavailable
from rsc_health.slurm.command import _UNAVAILABLE, run_command

# ASCII unit separator: never in a host, user, partition, state, time or TRES. A job name could
# hold it (or a newline); the parser puts such a record back together by its field count.
PARSABLE_DELIMITER = "\x1f"


class Accounting:
    """sacct / sacctmgr / scontrol runs for the historian, with one timeout each."""

    def __init__(self, *, timeout_s: float = 600, bin_dir: str | None = None):
        self.timeout_s = timeout_s
        self.bin_dir = Path(bin_dir) if bin_dir else None

    def run(self, argv: list[str]) -> bytes:
        """stdout of one accounting command, as bytes."""
        if self.bin_dir is not None:
            argv = [str(self.bin_dir / argv[0]), *argv[1:]]
        env = {**os.environ, "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
        name = Path(argv[0]).name
        proc = run_command(argv, self.timeout_s, env)
        stderr = proc.stderr.decode("utf-8", "replace")
        if proc.returncode != 0:
            if _UNAVAILABLE.search(stderr):
                lines = stderr.strip().splitlines() or [f"exit {proc.returncode}"]
                raise SlurmUnavailable(f"{name}: {lines[-1][:300]}")
            raise SlurmCommandError(argv, proc.returncode, stderr[:500])
        return proc.stdout

    # ---- jobs --------------------------------------------------------------------------------
    def sacct_json(self, start: str, end: str, jobs: Sequence[str] = ()) -> bytes:
        """Every job instance (requeues apart: -D) in any state during [start, end], as
        `sacct --json` (structured: no delimiter or newline in a name can shift a field);
        only the job ids `jobs` (sacct -j) when given."""
        return self.run(["sacct", "-a", "-D", "--json", "-S", start, "-E", end,
                         *_only(jobs)])

    def sacct_exit_codes(self, start: str, end: str, jobs: Sequence[str] = ()) -> bytes:
        """JobIDRaw, Submit, Start and ExitCode of every instance in the window: columns no
        user text can shift. 22.05's --json reports "exit 3" as return code 0; this restores
        it, keyed like the historian's instance key."""
        return self.run(sacct_parsable_argv(start, end, ("JobIDRaw", "Submit", "Start",
                                                         "ExitCode"), jobs))

    def sacct_parsable(self, start: str, end: str, fields: tuple[str, ...],
                       jobs: Sequence[str] = ()) -> bytes:
        """The same window as `--parsable2` with the unit separator, one line per job
        allocation (-X), for releases without --json."""
        return self.run(sacct_parsable_argv(start, end, fields, jobs))

    # ---- nodes -------------------------------------------------------------------------------
    def node_events(self, start: str) -> bytes:
        """Node down/drain periods since `start` (`sacctmgr -P show event`)."""
        return self.run(
            ["sacctmgr", "-P", "show", "event", "Event=Node", f"Start={start}", "End=now"]
        )

    def reservations(self, start: str) -> bytes:
        """Reservations since `start` as slurmdbd kept them (`sacctmgr -P show reservation`):
        Name, TimeStart, TimeEnd, Flags (MAINT marks planned maintenance), NodeName."""
        return self.run(
            ["sacctmgr", "-P", "show", "reservation", f"Start={start}", "End=now",
             "format=Cluster,Name,Start,End,Flags,NodeNames"]
        )


def cluster_name(slurm_conf: str | Path | None = None) -> str:
    """ClusterName from slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf); '' when there
    is none or the file cannot be read."""
    path = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition("=")
        if key.strip().lower() == "clustername":
            return value.strip()
    return ""


def sacct_parsable_argv(start: str, end: str, fields: tuple[str, ...],
                        jobs: Sequence[str] = ()) -> list[str]:
    return [
        "sacct", "-a", "-X", "-D", "--parsable2", f"--delimiter={PARSABLE_DELIMITER}",
        f"--format={','.join(fields)}", "-S", start, "-E", end, *_only(jobs),
    ]


def _only(jobs: Sequence[str]) -> list[str]:
    """sacct's -j for these job ids (JobIDRaw: digits only, checked), none when empty."""
    for job in jobs:
        if not job.isdigit():
            raise ValueError(f"not a raw job id: {job!r}")
    return ["-j", ",".join(jobs)] if jobs else []
