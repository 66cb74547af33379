"""A historian filled the way an operator's is: the nodes' spools (check records, heartbeats
and the actions rsc-health took, each as the node path writes them) delivered by `healthctl
spool flush`, sacct's --parsable2 text by `healthctl ingest sacct --file`, sacctmgr's events by
`healthctl ingest events --file`, then `healthctl attribute`.

XID findings come from the real parser and check (collect.kmsg, checks.xid, the shipped
catalog) reading kernel lines in the driver's format (`NVRM: Xid (PCI:dddd:bb:dd): N, pid=...,
name=..., text`, as in tests/fixtures/nodes/README.md); the drain reason a sweep gives Slurm is
policy.decide's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from click.testing import CliRunner

from rsc_health import spool
from rsc_health.checks import xid as xid_check
from rsc_health.checks._finding import gpu_name, ok
from rsc_health.cli import cli
from rsc_health.collect import kmsg
from rsc_health.model import ActionKind, Finding, Level, Status, Verdict
from rsc_health.node.sinks import _gpu_bus_ids
from rsc_health.policy import decide
from rsc_health.xid import load_catalog

SACCT_HEADER = ("JobIDRaw|JobID|JobName|User|Partition|State|ExitCode|Submit|Eligible|Start|End|"
                "NNodes|NodeList|AllocTRES")
EVENTS_HEADER = "Cluster|NodeName|TimeStart|TimeEnd|State|Reason|User"


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S")


def xid_line(bus: str, code: int, text: str, pid: int = 4242, name: str = "python3") -> str:
    """One kernel line as the NVIDIA driver prints it."""
    return f"NVRM: Xid (PCI:{bus}): {code}, pid={pid}, name={name}, {text}"


def xid_findings(lines: list[str], gpus: dict[str, int]) -> list[Finding]:
    """The xid family's findings for these kernel lines on a node whose NVML lists `gpus`
    (NVML bus id "00000000:1A:00.0" -> index)."""
    events = [ev for ev in (kmsg.parse_line(line, "/dev/kmsg") for line in lines) if ev]
    state = SimpleNamespace(
        gpu=SimpleNamespace(gpus=[SimpleNamespace(index=i, pci_bus_id=b)
                                  for b, i in gpus.items()]),
        extra={"xid": SimpleNamespace(events=events)},
    )
    return xid_check.check(state, {"xid_catalog": load_catalog()})


def gpu_findings(gpus: dict[str, int]) -> list[Finding]:
    """The gpu family's all-clear findings for the GPUs NVML lists, as checks.gpu makes them
    (each carrying its bus id)."""
    return [ok("gpu", gpu_name(i), f"gpu{i} NVIDIA H100 80GB HBM3 ok", bus_id=bus)
            for bus, i in sorted(gpus.items(), key=lambda kv: kv[1])]


def run_records(node: str, when: datetime, stage: str, findings: list[Finding], *,
                job_ids: tuple[str, ...] = (), shadow: bool = False,
                guard_held: bool = False, gpus: dict[str, int] | None = None) -> list[dict]:
    """What one prolog/epilog/sweep spools: its check records, its heartbeat (with the bus id
    of each GPU in `gpus`, through the node path's own node.sinks._gpu_bus_ids) and the actions
    of its verdict (a drain and the requeue of each job on the node, a shadow mode's
    would_drain, or the guard's hold)."""
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
    findings = list(findings) + (gpu_findings(gpus) if gpus else [])
    verdict: Verdict = decide(findings)
    recs = spool.check_records(findings, node=node, source=stage, time=when,
                               job_id=job_ids[0] if job_ids and stage != "sweep" else None)
    recs.append(spool.record(
        "heartbeat", node, when, source=stage, level=verdict.level.name.lower(),
        checker_errors=sum(f.status is Status.ERROR for f in findings), duration_s=0.4,
        families={}, version="test", **({"gpus": bus_ids} if (bus_ids := _gpu_bus_ids(
            findings)) else {})))
    if verdict.drains:
        if shadow:
            recs.append(spool.record("action", node, when, action=ActionKind.WOULD_DRAIN.value,
                                     reason=verdict.reason, job_id=None, detail=""))
        elif guard_held:
            recs.append(spool.record("action", node, when,
                                     action=ActionKind.GUARD_TRIPPED.value,
                                     reason=verdict.reason, job_id=None, detail=""))
        else:
            kind = (ActionKind.DRAIN_NOW if verdict.level is Level.DRAIN_NOW
                    else ActionKind.DRAIN_AFTER_JOB)
            recs.append(spool.record("action", node, when, action=kind.value,
                                     reason=verdict.reason, job_id=None, detail=""))
            if kind is ActionKind.DRAIN_NOW:
                recs.extend(spool.record("action", node, when, action=ActionKind.REQUEUE.value,
                                         reason=verdict.reason, job_id=j, detail="")
                            for j in job_ids)
    return recs


def action_record(node: str, when: datetime, kind: ActionKind, reason: str) -> dict:
    """An operator command's action (healthctl resume / drain), as actions.spool_action."""
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when
    return spool.record("action", node, when, action=kind.value, reason=reason, job_id=None,
                        detail="")


def healthctl(url: str, *args: str, config: Path | None = None) -> str:
    head = ["--config", str(config)] if config is not None else []
    result = CliRunner().invoke(cli, [*head, "--db", url, *args])
    assert result.exit_code == 0, result.output
    return result.output


def flush(url: str, spool_dir: Path, records: list[dict]) -> None:
    """The node spools the records; its timer runs `healthctl spool flush`."""
    spool.append(spool_dir, records)
    healthctl(url, "spool", "flush", "--dir", str(spool_dir))


def ingest_sacct(url: str, tmp: Path, rows: list[str]) -> None:
    path = tmp / "sacct.txt"
    path.write_text("\n".join([SACCT_HEADER, *rows]) + "\n")
    healthctl(url, "ingest", "sacct", "--file", str(path))


def ingest_events(url: str, tmp: Path, rows: list[str]) -> None:
    path = tmp / "events.txt"
    path.write_text("\n".join([EVENTS_HEADER, *rows]) + "\n")
    healthctl(url, "ingest", "events", "--file", str(path))


def sacct_row(job: str, state: str, start: datetime, end: datetime, nodelist: str,
              nnodes: int, gpus: int, name: str = "train_llm") -> str:
    return (f"{job}|{job}|{name}|alice|gpu|{state}|0:0|{iso(start)}|{iso(start)}|{iso(start)}|"
            f"{iso(end)}|{nnodes}|{nodelist}|billing={gpus},cpu={12 * gpus},gres/gpu={gpus},"
            f"node={nnodes}")
