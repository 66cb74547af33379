"""Site checks: the site's own programs, one finding per line they print (the `site` family).

Each executable in `[site] checks_dir` (and, with `[site] nhc_conf`, the NHC adapter,
rsc_health/site/nhc_adapter.py) runs once per prolog/epilog/sweep that lists the family, all
at once, each in its own process group, killed at `[site] timeout_s` or at the stage's budget,
whichever comes first. The format, exit-status rules and an example are in
docs/site-checks.md; in short, one line per finding:

    STATUS SEVERITY COMPONENT CODE free text reason
    fail drain_after_job /scratch scratch_missing /scratch is not mounted

STATUS/SEVERITY pairs: ok none | warn warn | fail drain_after_job | fail drain_now |
error none (the check could not look). Blank lines and lines starting with # are skipped.

A site program can do anything, so what it does wrong is the checker's problem, never a drain:
a garbled line, a hang, a crash, a non-zero exit with nothing said, too much output, a file in
the directory that cannot be run or that anyone but root (or us) could have written, each
becomes one checker finding naming the program. What runs cannot be swapped in between: every
directory on a program's path (and checks_dir's), from / down, after symlinks, must be root's
(or ours) and writable by no one else (a root-owned sticky directory such as /tmp qualifies: no
one else can rename or remove root's entries in it), and the program is opened without
following a symlink, checked on that descriptor (fstat) and run from it (/proc/self/fd/N), so
the file judged is the file executed. Programs get RSC_HEALTH_CHECKS_DIR (their $0 is the
descriptor's name, not their path). `checks_dir` empty (the default) and no
`nhc_conf`: the family is off and nothing is spawned, so the healthy prolog pays nothing.
"""

from __future__ import annotations

import os
import stat
import time

from rsc_health import lazyre
from rsc_health.checks._finding import ok
from rsc_health.collect.sysfs import pure
from rsc_health.durable import owner_refusal as _owner_refusal
from rsc_health.durable import path_refusal as _path_refusal
from rsc_health.durable import trust_refusal
from rsc_health.model import Finding, Severity, Status

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

    from rsc_health.checks.env import CollectEnv

FAMILY = "site"
NHC = "[nhc]"  # the built-in NHC adapter's name among the checks (no file can be called that)
# Where NHC sources its check functions from (its INCDIR default, $CONFDIR/scripts), under root.
NHC_INCDIR = "/etc/nhc/scripts"
NHC_ADAPTER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "site", "nhc_adapter.py")
# A line longer than this is cut (the reason loses its tail); 1 kB is far beyond a reason.
LINE_MAX = 1024
REASON_MAX = 300
# Below this many seconds left in the stage's budget, nothing is started.
MIN_LIMIT_S = 0.1
ALLOWED = {
    Status.OK: {Severity.NONE},
    Status.WARN: {Severity.WARN},
    Status.FAIL: {Severity.DRAIN_AFTER_JOB, Severity.DRAIN_NOW},
    Status.ERROR: {Severity.NONE},
}
# No regular expressions: this module is imported by every prolog, and compiling them costs
# more than the rest of the module.
_CODE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def enabled(cfg) -> bool:
    return bool(cfg.get("site.checks_dir", "") or cfg.get("site.nhc_conf", ""))


# ---- collect: run the programs ------------------------------------------------------------------
def collect(root: StrPath, env: CollectEnv | None = None) -> dict:
    """{"limit_s": float, "checks": {name: record}}; a record holds what the program printed
    (decoded with surrogateescape, so bytes survive to the parser) and how it ended."""
    if env is None:
        return {"limit_s": 0.0, "checks": {}}
    replay = str(env.cfg.get("site.replay_file", "") or "")
    if replay:  # a snapshot's record of what the programs printed: nothing is run here
        from rsc_health.collect.sysfs import read_bounded
        from rsc_health.compat import json_loads

        doc = json_loads(read_bounded(_under(os.fspath(root), replay)))
        if not isinstance(doc, dict) or not isinstance(doc.get("checks"), dict):
            raise ValueError(f"{replay}: not a record of site checks")
        return doc
    if not enabled(env.cfg):
        return {"limit_s": 0.0, "checks": {}}
    fds: dict[str, int] = {}  # the programs of checks_dir, opened once judged
    try:
        return _collect(root, env, fds)
    finally:
        for fd in fds.values():
            os.close(fd)


def capture(cfg, root: StrPath, env) -> dict:
    """What a snapshot carries for the family: the programs' outcomes, run once now (their
    output decoded as in collect), so a replay judges what they printed without running
    anything on the machine replaying it."""
    from rsc_health.checks.env import CollectEnv

    return {"site_checks": collect(root, CollectEnv(cfg))}


def _collect(root: StrPath, env: CollectEnv, fds: dict[str, int]) -> dict:
    cfg = env.cfg
    root = os.fspath(root)
    records: dict[str, dict] = {}
    commands: dict[str, list[str]] = {}
    directory = str(cfg.get("site.checks_dir", "") or "")
    if directory:
        _from_directory(_under(root, directory), records, commands, fds)
    if cfg.get("site.nhc_conf", ""):
        nhc = _under(root, str(cfg.get("site.nhc_path", "/usr/sbin/nhc")))
        conf = _under(root, str(cfg.get("site.nhc_conf")))
        sysconfig_dir = _nhc_sysconfig_dir(root)
        incdir = _under(root, NHC_INCDIR)
        why = _refusal(nhc)
        why = f"{nhc}: {why}" if why else _nhc_sources_refusal(
            conf, os.path.join(sysconfig_dir, os.path.basename(nhc)), incdir)
        if why:
            records[NHC] = {"refused": why}
        else:
            import sys

            from rsc_health.compat import zip_archive

            archive = zip_archive()  # the node zipapp runs its own copy of the adapter
            adapter = [archive, "nhc-adapter"] if archive else [NHC_ADAPTER]
            commands[NHC] = [
                sys.executable, *adapter, "--nhc", nhc,
                "--conf", conf, "--sysconfig-dir", sysconfig_dir, "--incdir", incdir,
                "--severity", str(cfg.get("site.nhc_severity", "drain_after_job")),
            ]
    limit = float(cfg.get("site.timeout_s", 10.0))
    if env.deadline is not None:
        limit = min(limit, env.deadline - time.monotonic())
    if commands and limit < MIN_LIMIT_S:
        for name in commands:
            records[name] = {"refused": "no time left in the stage's budget to run it"}
        return {"limit_s": round(max(limit, 0.0), 3), "checks": records}
    if commands:
        from rsc_health.collect import procs  # only now: the family is on and has work

        child_env = dict(os.environ, RSC_HEALTH_ROOT=pure(root),
                         RSC_HEALTH_SITE_TIMEOUT_S=f"{limit:.1f}",
                         RSC_HEALTH_SITE_DEADLINE=f"{time.monotonic() + limit:.3f}",
                         RSC_HEALTH_CHECKS_DIR=_under(root, directory))
        outcomes = procs.run_all(
            commands, timeout_s={name: limit for name in commands},
            max_bytes=int(cfg.get("site.max_output_bytes", 65536)), env=child_env, cwd=root,
            pass_fds=fds, group_ends_with={NHC},  # NHC runs in the adapter's group
        )
        for name, out in outcomes.items():
            records[name] = {
                "returncode": out.returncode, "timed_out": out.timed_out,
                "truncated": out.truncated, "start_error": out.start_error,
                "stdout": out.stdout.decode("utf-8", "surrogateescape"),
                "stderr": out.stderr.decode("utf-8", "replace"), "elapsed_s": out.elapsed_s,
            }
    return {"limit_s": round(limit, 3), "checks": dict(sorted(records.items()))}


def _under(root: str, rel: str) -> str:
    """str(Path(root) / rel.lstrip("/")): a configured path under the node's root."""
    return pure(os.path.join(root, rel.lstrip("/")))


def _from_directory(directory: str, records: dict, commands: dict, fds: dict) -> None:
    why = _dir_refusal(directory)
    if why:
        records[str(directory)] = {"refused": why}
        return
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.startswith("."):  # editors' swap files; a leading dot disables a check
            continue
        path = pure(entry.path)
        if os.path.isdir(path):  # room for a helper library next to the checks; never run
            continue
        opened = _refusal(path) or _open_program(path)
        if isinstance(opened, str):
            records[entry.name] = {"refused": opened}
        else:
            fds[entry.name] = opened
            commands[entry.name] = [f"/proc/self/fd/{opened}"]


def _open_program(path: str) -> int | str:
    """A descriptor of the program `path` names now, or why not. Opened without following a
    symlink and judged again on the descriptor: what runs is what was judged."""
    try:
        fd = os.open(os.path.realpath(path),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot open: {exc.strerror or exc}"
    st = os.fstat(fd)
    why = (_owner_refusal(st, "") if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111
           else "changed while it was judged; refused")
    if why:
        os.close(fd)
        return why
    return fd


def _dir_refusal(directory: str) -> str:
    try:
        st = os.stat(directory)
    except OSError as exc:
        return f"checks_dir {directory}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"checks_dir {directory}: not a directory"
    return (_owner_refusal(st, f"checks_dir {directory}")
            or _path_refusal(directory, f"checks_dir {directory}"))


def _refusal(path: StrPath) -> str:
    """Why `path` must not be run, or "". stat, never open: opening a FIFO would block."""
    try:
        st = os.stat(path)  # follows a symlink to what would actually run
    except FileNotFoundError:
        return "broken symlink" if os.path.islink(path) else "missing"
    except OSError as exc:
        return f"cannot stat: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({_kind(st.st_mode)}); only executables are run"
    if not os.access(path, os.X_OK):
        return "not executable (chmod +x it, or rename it with a leading dot to disable it)"
    return trust_refusal(st, path)


def _nhc_sysconfig_dir(root: str) -> str:
    """The directory NHC sources `$NAME` (its settings) from, chosen as NHC's init_env does."""
    if os.path.exists(_under(root, "/etc/debian_version")):
        return _under(root, "/etc/default")
    for candidate in ("/etc/sysconfig", "/etc/default"):
        if os.path.isdir(_under(root, candidate)):
            return _under(root, candidate)
    return _under(root, "/etc/nhc/sysconfig")


def _nhc_sources_refusal(conf: str, sysconfig: str, incdir: str) -> str:
    """Why NHC must not run as root with these files, or "": bash evaluates every line of
    nhc.conf and sources its settings file and each INCDIR/*.nhc, so each (and every directory
    on its way, where someone could swap it) must be root's and writable by no one else. A
    missing conf is the adapter's to say; a missing settings file or INCDIR is NHC's normal."""
    why = _sourced_refusal(conf, f"nhc_conf {conf}") or _sourced_refusal(
        sysconfig, f"NHC settings {sysconfig}") or _sourced_refusal(incdir, f"NHC INCDIR {incdir}",
                                                                   directory=True)
    if not why:
        why = _settings_elsewhere(sysconfig)
    if why or not os.path.isdir(incdir):
        return why
    for entry in sorted(os.scandir(incdir), key=lambda e: e.name):
        if not entry.name.startswith(".") and entry.name.endswith(".nhc"):  # bash's *.nhc
            why = _sourced_refusal(pure(entry.path), f"NHC script {pure(entry.path)}")
            if why:
                return why
    return ""


# An assignment in NHC's settings file to where it reads its checks from: NHC sources the file
# after the VAR=value arguments the adapter gives it, so these win over the ones judged here.
_NHC_ELSEWHERE = lazyre.compile(
    r"^\s*(?:export\s+|declare\s+-x\s+)?(?P<var>INCDIR|CONFDIR|CONFFILE|SYSCONFIGDIR)\s*=",
    lazyre.MULTILINE)


def _settings_elsewhere(sysconfig: str) -> str:
    """Why NHC must not run: its settings file names another conf or checks directory than the
    ones judged here (an INCDIR of shared scripts on NFS, often not root's), which NHC would
    source as root unjudged (helper-135); or "". A file not there sets nothing."""
    try:
        with open(sysconfig, "rb") as fh:
            text = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""
    found = _NHC_ELSEWHERE.search(text)
    if not found:
        return ""
    return (f"NHC settings {sysconfig} sets {found.group('var')}: NHC would read files from "
            "there that rsc-health did not judge; refused (keep NHC's checks in /etc/nhc/scripts "
            "and its conf at [site] nhc_conf)")


def _sourced_refusal(path: str, what: str, *, directory: bool = False) -> str:
    """Why root must not let bash read `path` (a file, or with `directory` a directory whose
    entries it reads), or "". Nothing there: why someone else could put something there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _absent_refusal(path, what)
    except OSError as exc:
        return f"{what}: {exc.strerror or exc}; refused"
    if not (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        return f"{what}: not a {'directory' if directory else 'regular file'}; refused"
    return trust_refusal(st, path, what)


def _absent_refusal(path: str, what: str) -> str:
    """Nothing at `path`: why someone else could make it (its nearest existing directory is
    not root's, or is writable by others; sticky is no help here), or ""."""
    here = path
    while not os.path.lexists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    if here == path:  # a symlink to nothing: whoever can write where it points
        return _path_refusal(path, what)
    try:
        st = os.stat(here)
    except OSError as exc:
        return f"{what}: {here}: {exc.strerror or exc}; refused"
    return _owner_refusal(st, f"{what}: {here}") or _path_refusal(here, what)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


# ---- check: what they printed -> findings -------------------------------------------------------
def check(state, cfg: dict) -> list[Finding]:
    data = state.extra.get(FAMILY)
    if not data:
        return []
    limit = data.get("limit_s", 0.0)
    max_lines = int((cfg.get("site") or {}).get("max_lines", 200))
    out: list[Finding] = []
    for name, rec in (data.get("checks") or {}).items():
        out.extend(judge(name, rec, limit_s=limit, max_lines=max_lines))
    return out


def judge(name: str, rec: dict, *, limit_s: float, max_lines: int) -> list[Finding]:
    """One program's record -> its findings (and at most one checker finding per problem)."""
    if rec.get("refused"):
        return [_error(name, f"site check {name}: {rec['refused']}")]
    if rec.get("start_error"):
        return [_error(name, f"site check {name}: cannot start: {rec['start_error']}"
                             f"{' (no #! line?)' if 'format' in rec['start_error'] else ''}")]
    findings, garbage, extra = parse(name, rec.get("stdout", ""), max_lines=max_lines,
                                     cut_last=bool(rec.get("truncated")))
    out = list(findings)
    if garbage:
        first_no, first_line = garbage[0]
        more = f" (and {len(garbage) - 1} more such lines)" if len(garbage) > 1 else ""
        out.append(_error(name, f"site check {name}: line {first_no} is not 'STATUS SEVERITY "
                                f"COMPONENT CODE reason': {first_line!r}{more}"))
    if extra:
        out.append(_error(name, f"site check {name}: {extra} lines past max_lines={max_lines} "
                                f"ignored"))
    code = rec.get("returncode")
    said = any(f.status in (Status.WARN, Status.FAIL) for f in findings)
    if rec.get("timed_out"):
        out.append(_error(name, f"site check {name}: still running after {limit_s:g}s; "
                                f"killed with its process group"))
    elif rec.get("truncated"):
        out.append(_error(name, f"site check {name}: printed more than max_output_bytes; "
                                f"the rest was not read"))
    elif code is not None and code < 0:
        out.append(_error(name, f"site check {name}: killed by signal {-code}"))
    elif code and not said:
        err = " ".join(str(rec.get("stderr") or "").split())[:200]
        out.append(_error(name, f"site check {name}: exited {code} without a warn or fail "
                                f"line{': ' + err if err else ''}"))
    if not out:
        out.append(ok(FAMILY, name, f"{name} ok", check=name))
    return out


def parse(name: str, text: str, *, max_lines: int,
          cut_last: bool = False) -> tuple[list[Finding], list[tuple[int, str]], int]:
    """(findings, garbage lines as (line number, text), lines past max_lines)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif cut_last and lines:
        lines.pop()  # cut off mid-line by max_output_bytes: not a line
    findings: list[Finding] = []
    garbage: list[tuple[int, str]] = []
    counted = 0
    extra = 0
    for no, raw in enumerate(lines, 1):
        line = _decode(raw)[:LINE_MAX].strip()
        if not line or line.startswith("#"):
            continue
        counted += 1
        if counted > max_lines:
            extra += 1
            continue
        finding = parse_line(name, line)
        if finding is None:
            garbage.append((no, line[:80]))
        else:
            findings.append(finding)
    return findings, garbage, extra


def _decode(raw: str) -> str:
    """UTF-8 as it came; a line that was not UTF-8 is read as Latin-1 (old scripts, `sensors`
    output in a Latin-1 locale) rather than turned into replacement characters."""
    try:
        raw.encode("utf-8")
        return raw
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8
        return raw.encode("utf-8", "surrogateescape").decode("latin-1")


def parse_line(name: str, line: str) -> Finding | None:
    """One `STATUS SEVERITY COMPONENT CODE reason` line, or None when it is not one."""
    if not line.replace("\t", " ").isprintable():
        return None  # binary output, a terminal escape, C1 controls: not a finding
    parts = line.split(None, 4)
    if len(parts) < 4:
        return None
    status, sev_text, component, code = (p for p in parts[:4])
    reason = (parts[4] if len(parts) > 4 else code)[:REASON_MAX]
    try:
        st = Status(status.lower())
        severity = Severity.parse(sev_text)
    except (KeyError, ValueError):
        return None
    if severity not in ALLOWED[st]:
        return None
    if not 0 < len(code) <= 64 or not _CODE_CHARS.issuperset(code) or len(component) > 128:
        return None
    data = {"check": name}
    if st is Status.ERROR:
        return Finding("checker", component, st, Severity.NONE, f"{name}: {reason}", code,
                       False, data)
    return Finding(FAMILY, component, st, severity, reason, code, False, data)


def _error(name: str, reason: str) -> Finding:
    """The site check could not be run or read: loud, never a drain (policy.decide)."""
    return Finding("checker", name, Status.ERROR, Severity.NONE, reason[:500], "site_error",
                   False, {"check": name})
