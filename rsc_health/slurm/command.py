"""Running one Slurm command (scontrol, sacct, sacctmgr...): its own process group, a
timeout, its output whole or refused, and the words that mean the controller is not there.
Shared by the node-facing backend (cli_backend) and the historian's accounting runner, below
both (tests/unit/test_import_graph.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rsc_health.slurm.api import SlurmCommandError, SlurmUnavailable

# What Slurm's commands print when the controller (or slurmdbd) is not there to answer.
_UNAVAILABLE = re.compile(
    r"Unable to contact slurm controller|Connection refused|Socket timed out|"
    r"Zero Bytes were transmitted|slurm_persist_conn_open|Unable to establish|"
    r"Communication connection failure|Connection timed out|"
    # configless slurmd/clients that cannot find slurmctld (DNS SRV) to fetch slurm.conf from
    r"Could not establish a configuration source",
    re.IGNORECASE,
)

# A Slurm command's output is taken whole or not at all: a fleet's `scontrol show node` is a
# few MB and a year of `sacct --json` some hundreds; past this it is refused, never cut.
MAX_OUTPUT = 4 << 30
STDERR_KEEP = 1 << 20


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: bytes
    stderr: bytes


def run_command(argv: list[str], timeout_s: float, env: dict[str, str]) -> CommandResult:
    """One Slurm command in its own process group, read to the end of its output: a site's
    wrapper (a shell script around scontrol or sacct) that hangs at the timeout is killed with
    what it started, and so is a child it left holding its output (its answer may not be
    whole). Raises SlurmUnavailable when it cannot start or does not finish in time."""
    from rsc_health.collect import procs

    name = Path(argv[0]).name
    out = procs.run_all({name: argv}, timeout_s={name: timeout_s}, max_bytes=MAX_OUTPUT,
                        env=env, exit_grace_s=None, stderr_keep=STDERR_KEEP)[name]
    if out.start_error:
        raise SlurmUnavailable(f"{argv[0]} cannot be run ({out.start_error}): "
                               "is Slurm installed here?")
    if out.timed_out:
        raise SlurmUnavailable(f"{argv[0]} did not answer within {timeout_s:g}s")
    if out.truncated:
        raise SlurmCommandError(argv, out.returncode or 0,
                                f"output larger than {MAX_OUTPUT} bytes: refused, not cut")
    return CommandResult(out.returncode or 0, out.stdout, out.stderr)
