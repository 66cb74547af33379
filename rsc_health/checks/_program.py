"""One bounded program a family runs (the fabric family's `systemctl is-active`, the dcgm
family's `dcgmi`), recorded as plain JSON so a snapshot carries what it printed and a replay
judges that instead of running anything. The program is refused, never run, when anyone but
root (or us) could have written it or a directory on its path (checks.site's rule: it runs as
root under slurmd). Run in its own process group through collect.procs, output capped, killed
with its group at its deadline."""

from __future__ import annotations

import os
import time

from rsc_health.collect.sysfs import pure

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

# Bytes of stderr kept in a record.
STDERR_KEEP = 512


def run(root: StrPath, program: str, args: list[str], *, timeout_s: float,
        deadline: float | None, max_bytes: int) -> dict:
    """{"argv", "returncode", "stdout", "stderr", "timed_out", "truncated", "refused",
    "start_error", "elapsed_s"}; never raises for the program's behaviour."""
    from rsc_health.checks.site import _refusal

    path = pure(os.path.join(root, program.lstrip("/")))  # str(Path(root) / program)
    rec: dict = {"argv": [program, *args], "returncode": None, "stdout": "", "stderr": "",
                 "timed_out": False, "truncated": False, "refused": "", "start_error": "",
                 "elapsed_s": 0.0}
    why = _refusal(path)
    if why:
        rec["refused"] = f"{path}: {why}"
        return rec
    limit = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
    if limit < 0.1:
        rec["refused"] = "no time left in the stage's budget to run it"
        return rec
    from rsc_health.collect import procs  # only now: the family is on and has work

    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C",
           "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""}
    out = procs.run_all({"p": [str(path), *args]}, timeout_s={"p": limit},
                        max_bytes=max_bytes, env=env, cwd=root, exit_grace_s=None,
                        stderr_keep=STDERR_KEEP)["p"]
    rec.update(returncode=out.returncode, timed_out=out.timed_out, truncated=out.truncated,
               start_error=out.start_error, elapsed_s=round(out.elapsed_s, 3),
               stdout=out.stdout.decode("utf-8", "replace"),
               stderr=out.stderr[:STDERR_KEEP].decode("utf-8", "replace"))
    return rec


def trouble(rec: dict, what: str) -> str | None:
    """Why a recorded run says nothing about the node (a checker error), or None."""
    if not isinstance(rec, dict):
        return f"{what}: no record of it"
    if rec.get("refused"):
        return f"{what} not run: {str(rec['refused'])[:200]}"
    if rec.get("untrusted"):  # it ran, and who answered it cannot be told (checks.dcgm)
        return f"{what}'s answer not believed: {str(rec['untrusted'])[:200]}"
    if rec.get("start_error"):
        return f"{what} could not start: {str(rec['start_error'])[:200]}"
    if rec.get("timed_out"):
        return f"{what} did not answer in time (killed)"
    if rec.get("truncated"):
        return f"{what} printed more than the family reads; not judged"
    return None
