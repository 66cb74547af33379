"""Where a node-path run says what it saw: stderr and syslog (`log`), the spool (findings,
job records and a heartbeat, JSON lines), the Prometheus textfile for node_exporter, and the
sweep's line on stdout.

Every way a run ends goes through here: a finished run spools before it moves the node's
state and writes the textfile after it has acted; a run ended early (a checker fault, a broken
config, the watchdog) says so in both with `say_fault`, so the fleet never reads the last good
run's verdict for a run that failed."""

from __future__ import annotations

import os
import sys
import time

from rsc_health import spool
from rsc_health.compat import datetime
from rsc_health.durable import open_regular, write_atomic
from rsc_health.model import HUNG_CODES, Finding, Level, Status, utcnow
from rsc_health.node.stage import STAGES
from rsc_health.policy import decide

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Sequence

    from rsc_health.config import Config
    from rsc_health.node.stage import Progress, Stage

TEXTFILE = "rsc_health.prom"
VERSION = "0.1.0"

_syslog_on = True


def set_syslog(on: bool) -> None:
    """[node] syslog, once the config is read (until then, and without one, syslog is on)."""
    global _syslog_on
    _syslog_on = on


def log(msg: str) -> None:
    """stderr (the sweep's log) and syslog/journald: slurmd discards a prolog's stderr.
    Never raises: a stream whose reader is gone (journald restarted under a timer, a closed
    pipe: EPIPE) or closed must not turn a log line into a checker fault that drops a verdict."""
    _say(sys.stderr, f"rsc_health: {msg}")
    if _syslog_on:
        try:
            import syslog

            syslog.openlog("rsc-health", syslog.LOG_PID, syslog.LOG_DAEMON)
            syslog.syslog(syslog.LOG_WARNING, msg[:2000])
        except Exception:  # noqa: BLE001 - logging must never break the node path
            pass


def _say(stream, line: str) -> None:
    if stream is None:  # started with the descriptor closed: print(file=None) is stdout's
        return
    try:
        print(line, file=stream, flush=True)
    except (OSError, ValueError):  # EPIPE, EIO, a closed stream: syslog still hears it
        pass


# ---- the spool ------------------------------------------------------------------------------
def write_spool(sdir: str | os.PathLike, records: list[dict]) -> bool:
    try:
        spool.append(os.path.join(sdir, "spool"), records)
        return True
    except OSError as exc:
        log(f"cannot write the spool ({exc}); node state kept, so the next run reads the same "
            f"events again")
        return False


def within_spool_cap(cfg: Config, sdir: str | os.PathLike, source: str,
                     records: list[dict]) -> tuple[list[dict], int]:
    """(records to spool, bytes the spool holds). Past [node] spool_max_mb (the historian has
    not taken the spool for a long time) only the records that carry news are kept: a fault is
    never dropped, /var never fills."""
    try:
        cap = float(cfg.get("node.spool_max_mb")) * 1024 * 1024
    except (TypeError, ValueError):
        from rsc_health.config import packaged_default

        cap = float(packaged_default("node.spool_max_mb")) * 1024 * 1024
    held = spool.size_bytes(os.path.join(sdir, "spool"))
    if held < cap:
        return records, held
    kept = [r for r in records if spool.carries_news(r)]
    log(f"{source}: spool holds {held / 1048576:.0f} MB, over [node] spool_max_mb "
        f"(is spool flush failing?): spooling {len(kept)} of {len(records)} records, "
        f"all-clear rows and heartbeat dropped")
    return kept, held


# A family's status in the textfile (HELP: 0 ok, 1 warn, 2 fail, 3 checker error): the
# highest of its findings' is its worst.
STATUS_VALUE = {Status.OK: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3}


def _worst_status(findings: list[Finding]) -> dict[str, Status]:
    worst: dict[str, Status] = {}
    for f in findings:
        if f.family not in worst or STATUS_VALUE[f.status] > STATUS_VALUE[worst[f.family]]:
            worst[f.family] = f.status
    return dict(sorted(worst.items()))


def family_status(findings: list[Finding]) -> dict[str, str]:
    """{family: its worst status word}, as heartbeats carry it."""
    return {k: v.value for k, v in _worst_status(findings).items()}


def hung_probes(findings: list[Finding]) -> dict[str, str]:
    """{probe: since when it hangs} for the probes this run found hung (collect.hangs)."""
    return {str(f.data["probe"]): str(f.data["since"]) for f in findings
            if f.code in HUNG_CODES and isinstance(f.data, dict)
            and "probe" in f.data and "since" in f.data}


def heartbeat(stage: Stage, node: str, now, level: Level, findings: list[Finding],
              duration_s: float) -> dict:
    hung = hung_probes(findings)
    gpus = _gpu_bus_ids(findings)
    versions = _versions(findings)
    return spool.record(
        "heartbeat", node, now, source=stage.name, level=level.label,
        checker_errors=sum(f.status is Status.ERROR for f in findings),
        duration_s=round(duration_s, 3), families=family_status(findings), version=VERSION,
        **({"hung": hung} if hung else {}), **({"gpus": gpus} if gpus else {}),
        **({"versions": versions} if versions else {}),
    )


def _versions(findings: list[Finding]) -> dict:
    """{"driver": "580.95.05", "vbios": ["96.00.AF.00.01"], "inforom": ["G520.0200.00.05"]}:
    the driver and the distinct firmware versions of the GPUs NVML answered for this run (the
    gpu family's per-GPU findings carry them; about 100 bytes on a node whose boards agree),
    so the historian sees a driver or firmware change (qualification's trigger, [qualify]
    on_driver_change)."""
    out: dict = {}
    seen: dict = {}
    for f in findings:
        if not (f.family == "gpu" and isinstance(f.data, dict) and f.component.startswith("gpu")
                and f.component[3:].isdigit()):
            continue
        if isinstance(f.data.get("driver"), str):
            out["driver"] = f.data["driver"]
        for key in ("vbios", "inforom"):
            if isinstance(f.data.get(key), str):
                seen.setdefault(key, set()).add(f.data[key])
    for key, values in seen.items():
        out[key] = sorted(values)
    return out


def _gpu_bus_ids(findings: list[Finding]) -> dict[str, str]:
    """{"1": "00000000:1A:00.0"}: the bus id of each GPU index NVML answered for this run
    (the gpu family's per-GPU findings carry it), so the historian names a GPU one way
    (rsc_health.gpuname) whichever half a finding knew."""
    out: dict[str, str] = {}
    for f in findings:
        # checks.gpu names each GPU gpu_name(index) = "gpuN" (parsed here rather than by
        # rsc_health.gpuname: one module less on every job start).
        if (f.family == "gpu" and isinstance(f.data, dict) and f.data.get("bus_id")
                and f.component.startswith("gpu") and f.component[3:].isdigit()):
            out[f.component[3:]] = str(f.data["bus_id"])[:32]
    return out


# ---- a run ended early ----------------------------------------------------------------------
def spool_fault(run: Progress, finding: Finding, found: Sequence[Finding] = ()) -> str | None:
    """A checker record, and a checker_error heartbeat unless this run already spooled one, so
    the historian sees a node that could not look rather than a silent one. `found`: what the
    run judged before it ended (the watchdog's), spooled with it when nothing was yet, the
    heartbeat at their verdict when it drains. Returns why it could not be spooled, or None."""
    if run.sdir is None or run.node is None:
        return "no state dir yet"
    now = utcnow()
    judged = [*found, finding] if not run.spooled else [finding]
    records = spool.check_records(judged, node=run.node, source=run.stage.name, time=now,
                                  job_id=run.job_id)
    if not run.spooled:
        records.append(heartbeat(run.stage, run.node, now, decide(judged).level, judged,
                                 time.monotonic() - run.started))
    try:
        spool.append(os.path.join(run.sdir, "spool"), records)
    except OSError as err:
        return str(err)
    run.spooled = True
    return None


def say_fault(run: Progress, finding: Finding, cfg: Config | None = None,
              root: str | os.PathLike | None = None, pending: bool | None = None,
              found: Sequence[Finding] = ()) -> str | None:
    """A run ended early (a checker fault, a broken config, the watchdog) says so where a
    working run would: the spool (a checker record and heartbeat) and the textfile, else the
    textfile goes on showing the last good run's verdict. `cfg` is the config whose textfile
    dir to use (the run's, else the fallback a broken config gets). Returns why it could not
    be spooled, or None."""
    unspooled = spool_fault(run, finding, found)
    cfg = cfg if cfg is not None else run.cfg
    if cfg is not None and run.node is not None and run.step != "textfile":
        if root is None:
            from rsc_health.config import node_root

            root = node_root()
        spool_bytes = (spool.size_bytes(os.path.join(run.sdir, "spool"))
                       if run.sdir is not None else None)
        try:
            judged = [*found, finding]
            write_textfile(cfg, root, run.node, run.stage, decide(judged).level, judged,
                           time.monotonic() - run.started,
                           pending=run.unacted_drain if pending is None else pending,
                           spool_bytes=spool_bytes, families=set())
        except Exception:  # noqa: BLE001 - said in the log and the spool
            pass
    return unspooled


# ---- stdout ---------------------------------------------------------------------------------
def sweep_line(stage: Stage, node: str, level: Level, reason: str, actions: list) -> None:
    """The sweep's one line on stdout (HealthCheckProgram's log, the timer's journal)."""
    if stage.name != "sweep":
        return
    summary = ", ".join(f"{a.action}{' ' + a.job_id if a.job_id else ''}" for a in actions)
    _say(sys.stdout, f"rsc_health sweep {node}: {level.name} {reason} {summary}".rstrip())


# ---- the Prometheus textfile ----------------------------------------------------------------
HELP = {
    "rsc_health_verdict_level": "Verdict of the latest run: 0 ok, 1 warn, 2 drain after job, "
                                "3 drain now, 4 checker error.",
    "rsc_health_family_status": "Worst status of a check family in the latest run: 0 ok, "
                                "1 warn, 2 fail, 3 checker error.",
    "rsc_health_last_run_timestamp_seconds": "When the entry point last ran (Unix time).",
    "rsc_health_run_duration_seconds": "How long the entry point's latest run took.",
    "rsc_health_checker_errors": "Findings the checker could not look at in the latest run.",
    "rsc_health_pending_drain": "1 while a drain verdict waits (Slurm away, the guard, or "
                                "someone else's drain).",
    "rsc_health_spool_bytes": "Bytes in the node's spool not yet delivered to the historian.",
    "rsc_health_probe_hung_since_seconds": "Since when (Unix time) a probe (a mount's statvfs, "
                                           "NVML) has not answered, per probe still hanging.",
    "rsc_health_telemetry": "The latest telemetry sample, per metric: the worst GPU's or HCA "
                            "port's value (docs/telemetry.md).",
}


def write_textfile(cfg: Config, root: str | os.PathLike, node: str, stage: Stage, level: Level,
                   findings: list[Finding], duration_s: float, *, pending: bool,
                   spool_bytes: int | None = None, families: set[str] | None = None) -> None:
    """node_exporter textfile collector: the latest run per entry point, written atomically
    (durable.write_atomic: a scrape never reads half a file, nothing planted in the directory
    is followed, a directory others may write without the sticky bit is refused).

    Every line is this run's or still the latest word: each entry point's own lines come from
    its latest run, and a check family's line from the latest run that looked at it
    (`families`, None for all of them; one it looked at and heard nothing from is dropped).
    Checker errors (family "checker") are said by every run: 3, or 0 once they are gone."""
    directory = str(cfg.get("node.textfile_dir") or "")
    if not directory:
        return
    path = os.path.join(root, directory.lstrip("/"), TEXTFILE)
    try:
        from rsc_health.checks import FAMILIES

        now = time.time()
        samples = {
            f'rsc_health_last_run_timestamp_seconds{{source="{stage.name}"}}': f"{now:.3f}",
            f'rsc_health_run_duration_seconds{{source="{stage.name}"}}': f"{duration_s:.3f}",
            f'rsc_health_verdict_level{{source="{stage.name}"}}': str(level.exit_code),
            f'rsc_health_checker_errors{{source="{stage.name}"}}':
                str(sum(f.status is Status.ERROR for f in findings)),
        }
        samples["rsc_health_pending_drain"] = "1" if pending else "0"
        if spool_bytes is not None:
            samples["rsc_health_spool_bytes"] = str(spool_bytes)
        for family, status in {"checker": Status.OK, **_worst_status(findings)}.items():
            samples[_family_key(family)] = str(STATUS_VALUE[status])
        sample = spool.telemetry_sample(findings)
        for metric, got in (sample["metrics"] if sample else {}).items():
            samples[f'rsc_health_telemetry{{source="{stage.name}",'
                    f'metric="{_label(metric)}"}}'] = f"{float(got['value']):.6g}"
        hung_key = f'rsc_health_probe_hung_since_seconds{{source="{stage.name}",probe='
        for probe, since in hung_probes(findings).items():
            try:
                samples[f'{hung_key}"{_label(probe)}"}}'] = (
                    f"{datetime.fromisoformat(since).timestamp():.0f}")
            except ValueError:
                continue
        unlooked = set() if families is None else set(FAMILIES) - families
        still = {_family_key(f) for f in unlooked}
        others = tuple(f'source="{other}"' for other in STAGES if other != stage.name)
        kept = {k: v for k, v in _read_samples(path).items()
                if k in still or k.partition("{")[2].startswith(others)}
        write_atomic(path, exposition({**kept, **samples}), sync_dir=False)
    except OSError as exc:
        log(f"cannot write the textfile {path}: {exc}")


def _family_key(family: str) -> str:
    return f'rsc_health_family_status{{family="{_label(family)}"}}'


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(samples: dict[str, str]) -> str:
    """The Prometheus text format (0.0.4) of {series: value}, one HELP and TYPE per metric."""
    lines = []
    for metric in HELP:
        mine = sorted(k for k in samples if k == metric or k.startswith(metric + "{"))
        if not mine:
            continue
        lines.append(f"# HELP {metric} {HELP[metric]}")
        lines.append(f"# TYPE {metric} gauge")
        lines.extend(f"{k} {samples[k]}" for k in mine)
    return "\n".join(lines) + "\n"


def _read_samples(path: str) -> dict[str, str]:
    """The previous textfile's samples, if it is a file of ours (a symlink planted at its name
    is not followed, a FIFO not waited on, a file someone else made not believed)."""
    try:
        with open(open_regular(path), "rb") as fh:
            if os.fstat(fh.fileno()).st_uid != os.geteuid():
                return {}
            text = fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and " " in line:
            key, _, value = line.rpartition(" ")
            out[key] = value
    return out
