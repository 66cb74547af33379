"""Run the site's LBNL NHC (github.com/mej/nhc) as a site check; print its failures as findings.

    python3 rsc_health/site/nhc_adapter.py --nhc /usr/sbin/nhc --conf /etc/nhc/nhc.conf \
        [--severity drain_after_job] [--timeout 10]

The `site` family runs this itself when `[site] nhc_conf` is set; run by hand it shows what
rsc-health would make of this node's NHC. What it relies on in NHC (the `nhc` driver script):

- `die()` reports a failure as `ERROR:  $NAME:  Health check failed:  $*` on the caller's stdout
  (via `oecho` when output goes to NHC's log file, `log` otherwise), and checks call
  `die 1 "$FUNCNAME:  <what>"`, e.g. `check_fs_mount:  /scratch not mounted` (scripts/lbnl_fs.nhc).
  Checks written as NHC's README shows (`die 1 "Stuff is not working"`) name no function: such a
  failure is a finding of component `nhc`, code `nhc_check`. A check that fails without calling
  die (a function returning 1, `* || /bin/false`, a function no script defines) becomes
  `Check <line> returned <N>`; the watchdog's ALRM becomes
  `die 142 "Script timed out while executing "<line>"."`, signals exit 129/130/143.
  In detached mode the parent prints `ERROR Health check failed:  <msg>` instead.
- The adapter does not pass `-a` (NHC_CHECK_ALL=1): in that mode NHC says nothing of a check
  that fails without die and exits 0, so such a failure would pass. NHC stops at the first
  failure, as it does as HealthCheckProgram; a conf or settings file that sets NHC_CHECK_ALL=1
  is a checker error (NHC still runs).
- `-t N` sets its watchdog; `VAR=value` arguments are evaluated before /etc/sysconfig/nhc and
  nhc.conf, which may set them again (NHC's own precedence). SYSCONFIGDIR=, INCDIR= say where
  its settings file and its *.nhc check functions are: the ones the site family judged.
- A missing config file means no checks and exit 0, so the adapter checks the file itself.

NHC is told not to act: MARK_OFFLINE=0 OFFLINE_NODE=: ONLINE_NODE=: (as `nhc -e` does), so it
neither drains nor resumes the node; rsc-health's policy decides. A conf that sets them back is
reported as a checker error (and still run). Started by the site family (which says its
deadline in RSC_HEALTH_SITE_DEADLINE), NHC runs in the adapter's process group, which the family
kills at that deadline and when the adapter exits, so a hung NHC never outlives the run; the
adapter is NHC's watchdog and kills it a little before (_in_our_group). Run by hand, NHC has a
session of its own, its own watchdog, and is killed with its group at --timeout. Standard
library and rsc_health.collect.procs only.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: import the rsc_health this file belongs to
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from rsc_health.collect import procs  # noqa: E402 - after the path fix above
from rsc_health.model import FINDING_SEVERITIES, Severity, Status  # noqa: E402

# `die()`'s line, and the detached-mode parent's.
FAILED = re.compile(r"^ERROR:?\s+(?:\S+:\s+)?Health check failed:\s+(?P<msg>.*)$")
NON_FATAL = re.compile(r"^(?P<check>[A-Za-z_]\w*):\s+(?P<msg>.*)\s\(non-fatal\)$")
CHECK_MSG = re.compile(r"^(?P<check>[A-Za-z_]\w*):\s+(?P<msg>.*)$")
RETURNED = re.compile(r"^Check (?P<check>\S+).* returned (?P<rc>\d+)$")
CODE = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # what a finding's code may be (checks.site)
CHECK_ALL = re.compile(r"(?:^|[\s;|&])(?:export\s+)?NHC_CHECK_ALL\s*=\s*['\"]?1")
# A watchdog of NHC's own (TIMEOUT= in its settings file wins over the adapter's -t 0): NHC puts
# it in a process group of its own, so it outlives a hung NHC the family killed by up to that
# many seconds, then signals NHC's old pid (helper-135).
OWN_WATCHDOG = re.compile(r"^\s*(?:export\s+)?TIMEOUT\s*=\s*(?P<value>[^#\s]*)")
TIMED_OUT = re.compile(r"^Script timed out(?: while executing \"(?P<check>[^\s\"]+)[^\"]*\")?")
NHC_ITSELF = re.compile(r"^(Terminated by signal|Watchdog timer unable|Unable to overwrite)")
SELF_ACTING = re.compile(
    r"\|\|\s*(?:export\s+)?(?:MARK_OFFLINE\s*=\s*['\"]?[1-9]|OFFLINE_NODE\s*=|ONLINE_NODE\s*=)")
QUIET = ("MARK_OFFLINE=0", "OFFLINE_NODE=:", "ONLINE_NODE=:", "DETACHED_MODE=0")
MAX_BYTES = 256 * 1024
# NHC is killed this long before the site family's deadline, so what it said is printed in time;
# with less than MIN_RUN_S left before that, it is not started.
MARGIN_S = 0.3
MIN_RUN_S = 0.2
REASON_MAX = 240


def line(status: str, severity: str, component: str, code: str, reason: str) -> str:
    """One finding in the site-check line format (docs/site-checks.md)."""
    text = " ".join(reason.split())[:REASON_MAX] or code
    # NHC's output may hold anything; a control character would make the line garbage.
    text = "".join(c if c.isprintable() else "?" for c in text)
    return f"{status} {severity} {component[:128] or 'nhc'} {code[:64]} {text}"


def error(code: str, reason: str, component: str = "nhc") -> str:
    return line("error", "none", component, code, reason)


def findings(stdout: str, stderr: str, severity: str) -> list[str]:
    """NHC's output -> finding lines: one per failing check function (several failures of
    the same function join into one finding), a checker error for NHC's own troubles."""
    status = Status.WARN if Severity.parse(severity) is Severity.WARN else Status.FAIL
    failed: dict[str, list[str]] = {}
    warned: dict[str, list[str]] = {}
    errors: list[str] = []
    for raw in (stdout + "\n" + stderr).splitlines():
        text = raw.strip()
        m = FAILED.match(text)
        if not m:
            nf = NON_FATAL.match(text)
            if nf:
                warned.setdefault(nf["check"], []).append(nf["msg"])
            continue
        msg = " ".join(m["msg"].split())
        if t := TIMED_OUT.match(msg):
            errors.append(error("nhc_timeout", f"NHC watchdog: {msg}", t["check"] or "nhc"))
        elif NHC_ITSELF.match(msg):
            errors.append(error("nhc_error", f"NHC: {msg}"))
        elif r := RETURNED.match(msg):  # `* || /bin/false`: the component is the command
            failed.setdefault(r["check"], []).append(msg)
        elif c := CHECK_MSG.match(msg):
            failed.setdefault(c["check"], []).append(f"{c['check']}: {c['msg']}")
        else:  # a check's die without "$FUNCNAME:" (NHC's README example does that)
            failed.setdefault("nhc", []).append(msg)
    out = [line(status, severity, check, check if check != "nhc" and CODE.fullmatch(check)
                else "nhc_check", "; ".join(msgs))
           for check, msgs in failed.items()]
    out += [line("warn", "warn", check, check, f"{'; '.join(msgs)} (non-fatal)")
            for check, msgs in warned.items() if check not in failed]
    return out + errors


def conf_problems(conf: Path, settings: Path | None = None) -> tuple[list[str], bool]:
    """(checker-error lines about the conf and NHC's settings file, whether NHC can run)."""
    try:
        text = conf.read_text(errors="replace")
    except FileNotFoundError:
        return [error("nhc_conf", f"{conf}: missing (NHC would run no checks and pass)")], False
    except OSError as exc:
        return [error("nhc_conf", f"{conf}: {exc.strerror or exc}")], False
    lines = [ln.strip() for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    problems = []
    acting = [ln for ln in lines if SELF_ACTING.search(ln)]
    if acting:
        problems.append(error("nhc_conf", f"{conf} sets {acting[0]!r}: NHC may drain or resume "
                                          f"the node itself; remove it"))
    try:
        said = settings.read_text(errors="replace") if settings else ""
    except OSError:  # none (NHC's usual) or unreadable: NHC reads nothing from it either
        said = ""
    for where, found in ((conf, lines), (settings, said.splitlines())):
        every = [ln.strip() for ln in found
                 if not ln.lstrip().startswith("#") and CHECK_ALL.search(ln)]
        if every:
            problems.append(error("nhc_conf", f"{where} sets {every[0]!r}: NHC then says nothing "
                                              f"of a check that fails without die; remove it"))
    own = [ln.strip() for ln in said.splitlines() if (m := OWN_WATCHDOG.search(ln))
           and m.group("value").strip("'\"").lstrip("0") != ""]
    if own:
        problems.append(error("nhc_conf", f"{settings} sets {own[0]!r}: NHC's own watchdog then "
                                          "outlives a hung NHC rsc-health killed, and signals "
                                          "its old pid; remove it (rsc-health bounds NHC)"))
    return problems, True


def run(nhc: str, conf: Path, severity: str, timeout_s: float, *, sysconfig_dir: str = "",
        incdir: str = "", deadline: float | None = None) -> list[str]:
    """The finding lines for one NHC run. `sysconfig_dir`, `incdir`: where NHC is to read its
    settings file and check functions from (the ones the site family judged); NHC's own
    defaults when empty. `deadline`: the time.monotonic() (CLOCK_MONOTONIC, the same clock in
    every process) at which the site family kills our process group; `timeout_s` otherwise."""
    settings = Path(sysconfig_dir, os.path.basename(nhc)) if sysconfig_dir else None
    problems, runnable = conf_problems(conf, settings)
    if not runnable:
        return problems
    where = [f"{name}={shlex.quote(value)}" for name, value in (
        ("SYSCONFIGDIR", sysconfig_dir), ("INCDIR", incdir)) if value]  # NHC evals VAR=value
    # The watchdog first (NHC's ALRM trap names the check that hung), our kill a little later,
    # both inside the site family's limit.
    if deadline is not None and os.getpgrp() == os.getpid():
        hard = deadline - time.monotonic() - MARGIN_S
        if hard < MIN_RUN_S:
            return problems + [error("nhc_timeout", f"{max(0.0, hard + MARGIN_S):.2f}s left "
                                                    f"before the site family's deadline; nhc "
                                                    f"not started")]
        outcome = _in_our_group(nhc, conf, where, hard)
    else:  # by hand: nothing kills our group, so NHC has a session of its own
        hard = max(0.2, timeout_s - MARGIN_S)
        argv = [nhc, "-c", str(conf), "-t", str(max(1, int(hard - 1.0))), *QUIET, *where]
        outcome = procs.run_all({"nhc": argv}, timeout_s={"nhc": hard},
                                max_bytes=MAX_BYTES)["nhc"]
    if outcome.start_error:
        return problems + [error("nhc_error", f"cannot start {nhc}: {outcome.start_error}")]
    stdout = outcome.stdout.decode("utf-8", "replace")
    stderr = outcome.stderr.decode("utf-8", "replace")
    seen = findings(stdout, stderr, severity)
    out = problems + seen
    if outcome.timed_out:
        out.append(error("nhc_timeout", f"nhc still running after {hard:.2f}s; killed"))
    elif outcome.returncode == -signal.SIGALRM:  # the watchdog came before NHC's ALRM trap
        out.append(error("nhc_timeout", "NHC watchdog: killed by SIGALRM before it could say "
                                        "which check it was running"))
    elif outcome.returncode and not seen:
        tail = " ".join((stdout + " " + stderr).split())[-200:]
        out.append(error("nhc_error", f"nhc exited {outcome.returncode} without naming a "
                                      f"failed check{': ' + tail if tail else ''}"))
    return out


def _in_our_group(nhc: str, conf: Path, where: list[str], hard: float) -> procs.Outcome:
    """Run NHC in our process group, which the site family kills at its deadline (and as soon
    as we exit), so nothing of NHC can outlive us: FORCE_SETSID=0 keeps NHC from re-executing
    itself under setsid, and `-t 0` from starting its own watchdog, which it would put in a
    process group of its own (`set -m`). We are its watchdog instead, as NHC's is when NHC
    leads its group: SIGALRM to the group (the hung command dies, NHC's trap says which check
    it was running), then at `hard` SIGKILL to NHC; the family kills the rest of the group."""
    argv = [nhc, "-c", str(conf), "-t", "0", *QUIET, "FORCE_SETSID=0", *where]
    fired: list[bool] = []

    def watchdog(signum, frame) -> None:
        if not fired:  # the group's ALRM comes back to us once: that one is not passed on
            fired.append(True)
            os.killpg(0, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, watchdog)  # NHC gets SIGALRM's default on exec
    signal.setitimer(signal.ITIMER_REAL, hard - min(1.0, hard / 3))
    try:
        return procs.run_all({"nhc": argv}, timeout_s={"nhc": hard}, max_bytes=MAX_BYTES,
                             new_session=False)["nhc"]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def deadline_from_env() -> float | None:
    """The site family's kill time (RSC_HEALTH_SITE_DEADLINE, time.monotonic() seconds)."""
    try:
        return float(os.environ["RSC_HEALTH_SITE_DEADLINE"])
    except (KeyError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nhc", default="/usr/sbin/nhc")
    ap.add_argument("--conf", default="/etc/nhc/nhc.conf")
    ap.add_argument("--severity", default="drain_after_job",
                    choices=[s.severity_word for s in FINDING_SEVERITIES if s is not Severity.NONE])
    ap.add_argument("--sysconfig-dir", default="",
                    help="the directory NHC sources its settings ($NAME) from; NHC's choice if "
                         "unset")
    ap.add_argument("--incdir", default="",
                    help="the directory of NHC's *.nhc check functions; NHC's default if unset")
    ap.add_argument("--timeout", type=float,
                    default=float(os.environ.get("RSC_HEALTH_SITE_TIMEOUT_S") or 30))
    args = ap.parse_args(argv)
    for ln in run(args.nhc, Path(args.conf), args.severity, args.timeout,
                  sysconfig_dir=args.sysconfig_dir, incdir=args.incdir,
                  deadline=deadline_from_env()):
        print(ln)
    return 0  # what NHC found is in the lines; a non-zero exit would only repeat it


if __name__ == "__main__":
    sys.exit(main())
