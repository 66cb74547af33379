"""The demo's fail-slow act (lab side): a suspect found and confirmed, a healthy one cleared.

A small fleet's last hour, written by the lab (rsc_health/sim/failslow.py), goes through the
product's own doors, as on a real cluster:

1. three 16-node jobs that ended a minute ago: one with a GPU stuck in HW slowdown, one with a
   congested HCA port (a fabric problem, not the node's), one with the healthy spread at its
   strongest (uneven sequence lengths, a heavier last pipeline stage) and no fault;
2. `healthctl ingest sacct --file` (the jobs, in sacct --parsable2), `healthctl spool flush`
   (the nodes' telemetry spool records, one per node and sweep, as checks/telemetry.py and
   spool.telemetry_records write them), `healthctl ingest steps` (the jobs' step-time drop
   files);
3. `healthctl suspects apply` on a MemorySlurm (the shipped one) holding the 48 nodes with the
   trusted feature: detection, then the suspect tier in Slurm;
4. `healthctl qualify auto`: each idle suspect is reserved and its qualification job runs
   `healthctl qualify run` on it; here the lab plays slurmd and the node, with stand-in tools
   (rsc_health/sim/qualify_tools.py) printing the real formats. The degraded GPU's gpu_burn
   prints its clock loss; a node whose hardware is fine prints healthy numbers. Peers come
   from earlier qualification passes of healthy nodes (`qualify run` on 8 of them first);
5. `healthctl suspects apply` again: the fail confirms (drained rsc_health:qualify:...), the
   pass clears (the trusted feature and the weight come back).

Every figure printed is read back from the historian and Slurm, never from the lab's truth;
the truth is only printed beside it. The product never imports this module.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rsc_health.policy import MAX_REASON_LEN
from rsc_health.slurm.memory import MemorySlurm

SCRIPT = ("hw_slowdown", "ib_congested", "imbalance")  # the three jobs, in order
NODES_PER_JOB = 16
SWEEPS = 14  # 70 minutes of telemetry a job
STEP_WINDOWS = 6  # step-time lines per rank per sweep (the lab's default)
PEERS = 8  # healthy nodes qualified first: [qualify] min_peers' default
HEALTHY_GFLOPS = 16950.0
HEALTHY_BUSBW = 231.0
DRIVER = "570.124.06"
GPU_MODEL = "NVIDIA H100 80GB HBM3"  # what the stand-ins print; one model fleet-wide
# The deep tier without nvbandwidth (the lab has no stand-in for it): DCGM level 3,
# all_reduce_perf and a long gpu_burn, with their real command lines.
LAB_CONFIG = """\
# The demo's fail-slow act: the packaged defaults, and the deep tier without nvbandwidth.
[qualify]
deep = ["dcgm_r3", "nccl_all_reduce", "gpu_burn_long"]
# One flow at a time: the lab's stand-in slurmd runs each job in this process through click's
# CliRunner, which swaps sys.stdout and os.environ (the node's tools on PATH) for the whole
# process; side by side, one node's job would see another's tools and output.
parallel = 1
"""


@dataclass
class FailSlowAct:
    nodes: int
    jobs: int
    injected: list[dict]  # the lab's truth: job_id, node, kind, gpu, onset
    ingested: dict[str, str]  # door -> its one-line report
    found: list[dict]  # open episodes after detection: node, metric, value, peer_median, ...
    qualified: list[dict]  # node, result, detail (the flow's)
    settled: list[dict]  # node, state, why (the second pass)
    slurm: dict[str, dict]  # suspect node -> state, reason, features, weight at the end
    tier: dict[str, dict] = field(default_factory=dict)  # the same, after the first pass
    seconds: float = 0.0
    step_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def flagged(self) -> list[str]:
        return sorted({e["node"] for e in self.found})

    def lines(self) -> list[str]:
        truth = {t["node"]: t for t in self.injected}
        out = [f"fail-slow: {self.nodes} nodes in {self.jobs} jobs, the last "
               f"{SWEEPS * 5} minutes; injected: "
               + ", ".join(f"{t['node']} {t['kind']} (gpu{t['gpu']}, from "
                           f"{t['onset'][11:16]} UTC)" for t in self.injected)]
        out.append("  ingested: " + "; ".join(self.ingested.values()))
        q = {r["node"]: r for r in self.qualified}
        s = {r["node"]: r for r in self.settled}
        for e in self.found:
            node = e["node"]
            label = ("injected " + truth[node]["kind"]) if node in truth else "NOT injected"
            out.append(f"  suspect {node} ({label}): {e['metric']} {e['value']:.3g} vs peers "
                       f"{e['peer_median']:.3g} (deviation {e['deviation']:.3g}, {e['source']})"
                       f" since {e['since'][11:16]} UTC, job {', '.join(e['job_ids'])}")
            if node in self.tier:
                t = self.tier[node]
                out.append(f"    suspect tier: {t['state']}, features "
                           f"{','.join(t['features']) or '-'}, weight {t['weight']} (kept from "
                           "big jobs, not drained)")
            if node in q:
                out.append(f"    qualified: {q[node]['result'].upper()} ("
                           + (q[node]['detail'][:110] or "every metric within its peers")
                           + ")")
            sl = self.slurm.get(node, {})
            if node in s:
                held = "DRAIN" in str(sl.get("state", ""))
                why = str(sl.get("reason") or "")[:MAX_REASON_LEN]
                out.append(f"    -> {s[node]['state']}: "
                           + (f"drained ({sl.get('state')}, reason {why!r})"
                              if held else f"not drained ({sl.get('state', '?')})")
                           + f"; features {','.join(sl.get('features', [])) or '-'}, "
                             f"weight {sl.get('weight', '?')}")
        missed = sorted(set(truth) - set(self.flagged))
        healthy = self.nodes - len(truth)
        wrong = [n for n in self.flagged if n not in truth]
        out.append(f"  healthy nodes flagged: {len(wrong)} of {healthy}"
                   + (f" ({', '.join(wrong)})" if wrong else "")
                   + (f"; missed: {', '.join(missed)}" if missed else ""))
        return out

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "jobs": self.jobs, "injected": self.injected,
                "ingested": self.ingested, "found": self.found, "flagged": self.flagged,
                "qualified": self.qualified, "settled": self.settled, "slurm": self.slurm,
                "tier": self.tier,
                "seconds": self.seconds, "step_seconds": self.step_seconds}


class StandInSlurm(MemorySlurm):
    """The shipped MemorySlurm, with the lab playing slurmd: a submitted qualification job
    runs at once on its node, with that node's stand-in tools first on PATH."""

    def __init__(self, nodes, *, run_job, **kw):
        super().__init__(nodes, **kw)
        self._run_job = run_job

    def submit(self, options: list[str], command: list[str]) -> str:
        job_id = super().submit(options, command)
        opts = dict(o.removeprefix("--").split("=", 1) for o in options
                    if o.startswith("--") and "=" in o)
        node = opts.get("nodelist", "")
        self.start_job(node, job_id)
        try:
            self._run_job(node, job_id, command)
        finally:
            self.end_job(job_id)
        return job_id


def _slurm_view(slurm: MemorySlurm, node: str) -> dict:
    """What slurmctld holds for `node` (the test's eye, not a call)."""
    info = slurm.info[node]
    return {"state": info.state, "reason": info.reason, "features": list(info.features),
            "weight": info.weight}


def standin_bin(bin_dir: Path, *, gflops: list[float], busbw: float) -> None:
    """One node's tools: scripts that print the stand-ins' output in the real formats."""
    from rsc_health.sim import qualify_tools as standin

    bin_dir.mkdir(parents=True, exist_ok=True)
    outputs = {
        "dcgmi": standin.dcgm_diag({name: ["Pass"] * len(gflops) for name in
                                    ("Memory", "PCIe", "Targeted Stress", "Targeted Power")}),
        "all_reduce_perf": standin.nccl(busbw),
        "gpu_burn": standin.gpu_burn(gflops),
    }
    for tool, text in outputs.items():
        (bin_dir / f"{tool}.out").write_text(text)
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\nexec cat "{bin_dir}/{tool}.out"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)


def sacct_text(fleet) -> str:
    """The lab's jobs as `sacct -a -X -D --parsable2` prints them (COMPLETED, 8 GPUs a node)."""
    import pandas as pd

    from rsc_health.hostlist import compress
    from rsc_health.sim.writers import SACCT_FIELDS

    def t(x) -> str:
        return f"{x:%Y-%m-%dT%H:%M:%S}"

    lines = ["|".join(SACCT_FIELDS)]
    for job in fleet.jobs.itertuples():
        nodes = sorted(fleet.membership.loc[fleet.membership["job_id"] == job.job_id, "node"])
        n = len(nodes)
        start, end = pd.Timestamp(job.start).to_pydatetime(), pd.Timestamp(job.end).to_pydatetime()
        lines.append("|".join([
            job.job_id, job.job_id, "pretrain", "user001", "learn", "COMPLETED", "0:0",
            t(start - timedelta(minutes=5)), t(start - timedelta(minutes=5)), t(start), t(end),
            str(n), compress(nodes),
            f"billing={8 * n},cpu={96 * n},gres/gpu={8 * n},mem={1024 * n}G,node={n}"]))
    return "\n".join(lines) + "\n"


def spool_records(fleet) -> list[dict]:
    """The lab's samples as the node path spools them: one `telemetry` record per node and
    sweep ({metric: {value, component}}), with the job it ran in (spool.telemetry_records)."""
    import pandas as pd

    from rsc_health.spool import record

    job_of = dict(zip(fleet.membership["node"], fleet.membership["job_id"], strict=True))
    out = []
    samples = fleet.samples.sort_values(["node", "time"], kind="stable")
    for (node, when), rows in samples.groupby(["node", "time"], sort=False):
        metrics = {m: {"value": float(v), "component": str(c)}
                   for m, v, c in zip(rows["metric"], rows["value"], rows["component"],
                                      strict=True)}
        at = pd.Timestamp(when).to_pydatetime().replace(tzinfo=UTC)
        out.append(record("telemetry", node, at, source="sweep", job_id=job_of.get(node),
                          interval_s=300, metrics=metrics))
    return out


def run_failslow_act(out_dir: Path, *, seed: int = 0, now: datetime | None = None,
                     progress=None) -> FailSlowAct:
    from rsc_health.sim.failslow import FailSlowConfig, simulate_failslow, write_failslow
    from rsc_health.spool import append

    say = progress or (lambda _msg: None)
    t_all = time.perf_counter()
    timings: dict[str, float] = {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # A run before this one (another seed) left its own files: the act starts from none.
    import shutil

    for name in ("spool", "bin", "steps"):
        if (out / name).is_dir() and not (out / name).is_symlink():
            shutil.rmtree(out / name)
    for name in ("historian.db", "historian.db-wal", "historian.db-shm"):
        (out / name).unlink(missing_ok=True)
    now = (now or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None, microsecond=0)
    # The jobs ended a minute ago: `suspects apply` reads the last [failslow] lookback_min.
    start = now - timedelta(seconds=SWEEPS * 300 + 120 + 60)
    say("fail-slow: simulating three 16-node jobs' telemetry and step times")
    t0 = time.perf_counter()
    fleet = simulate_failslow(FailSlowConfig(
        jobs=len(SCRIPT), seed=seed, script=SCRIPT, sizes=(NODES_PER_JOB,), size_weights=(1.0,),
        sweeps=(SWEEPS, SWEEPS), steps_share=1.0, step_windows=STEP_WINDOWS,
        start=f"{start:%Y-%m-%dT%H:%M:%S}", start_within_s=0))
    write_failslow(fleet, out)
    (out / "sacct.txt").write_text(sacct_text(fleet))
    spool_dir = out / "spool"
    spool_dir.mkdir(exist_ok=True)
    append(spool_dir, spool_records(fleet))
    config = out / "config.toml"
    # The lab plays nv-hostengine too: qualification asks dcgmi only where root or the asking
    # user listens (checks.dcgm.host_door), so the act holds a listener of its own, on a port
    # the kernel picks, and points the stand-in dcgmi there.
    import socket

    hostengine = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hostengine.bind(("127.0.0.1", 0))
    hostengine.listen(1)
    host = f"127.0.0.1:{hostengine.getsockname()[1]}"
    config.write_text(LAB_CONFIG + f"""
[qualify.tests.dcgm_r3]
plugin = "dcgm_diag"
command = ["dcgmi", "diag", "-r", "3", "-j", "--host", "{host}"]
timeout_s = 1800
""")
    timings["lab"] = time.perf_counter() - t0
    try:
        return _act(out, fleet, config, seed, now, say, timings, t_all)
    finally:
        hostengine.close()


def _act(out, fleet, config, seed, now, say, timings, t_all) -> FailSlowAct:
    from click.testing import CliRunner

    from rsc_health.cli import AppContext, cli
    from rsc_health.commands.qualify import qualify as qualify_cmd
    from rsc_health.commands.suspects import suspects as suspects_cmd
    from rsc_health.config import load_config
    from rsc_health.historian import db as hdb
    from rsc_health.historian import suspects as hs

    url = f"sqlite:///{out / 'historian.db'}"
    runner = CliRunner()

    def door(*args: str, **kw) -> str:
        res = runner.invoke(cli, ["--config", str(config), "--db", url, *args], **kw)
        if res.exit_code != 0:
            raise RuntimeError(f"healthctl {' '.join(args)}: {res.output[-400:]}")
        return res.output.strip()

    say("fail-slow: ingesting jobs, the nodes' telemetry spool and the jobs' step times")
    t0 = time.perf_counter()
    door("db", "upgrade")
    spool_dir = out / "spool"
    ingested = {
        "sacct": door("ingest", "sacct", "--file", str(out / "sacct.txt")).splitlines()[0],
        "spool": door("spool", "flush", "--dir", str(spool_dir)).splitlines()[0],
        "steps": door("ingest", "steps", str(out / "steps")).splitlines()[0],
    }
    timings["ingest"] = time.perf_counter() - t0

    truth = fleet.truth
    degraded = {r.node: r for r in truth.itertuples() if r.kind in ("hw_slowdown", "thermal")}
    bins = out / "bin"

    def node_bin(node: str) -> Path:
        d = bins / node
        if not d.is_dir():
            gflops = [HEALTHY_GFLOPS * (1 + 0.002 * ((i * 7 + len(node)) % 5 - 2))
                      for i in range(8)]
            if node in degraded:  # the stuck GPU runs at its clock's share
                gflops[int(degraded[node].gpu)] /= float(degraded[node].slow)
            standin_bin(d, gflops=gflops, busbw=HEALTHY_BUSBW)
        return d

    def run_on_node(node: str, job_id: str, command: list[str]) -> None:
        """slurmd's part: the job's command on its node, as that node (its tools on PATH,
        its identity as NVML would give it)."""
        env = {"PATH": f"{node_bin(node)}{os.pathsep}{os.environ.get('PATH', '')}",
               "SLURM_JOB_ID": job_id}
        runner.invoke(cli, ["--config", str(config), "--db", url, *command[1:],
                            "--gpu-model", GPU_MODEL, "--driver", DRIVER], env=env)

    names = sorted(fleet.membership["node"])
    slurm = StandInSlurm([], run_job=run_on_node, partition="learn")
    trusted = str(load_config(config).get("suspects.trusted_feature"))
    for n in names:  # slurm.conf's nodes: every one trusted, weight 1
        slurm.add_node(n, features=(trusted,), weight=1)

    def obj() -> AppContext:
        o = AppContext(config_path=str(config), db_url=url)
        setattr(o, "slurm", slurm)  # noqa: B010 - the hook commands.slurm_handle reads
        return o

    say("fail-slow: healthy nodes' earlier qualification passes (the peers)")
    t0 = time.perf_counter()
    imbalance_job = fleet.jobs.loc[fleet.jobs["kind"] == "imbalance", "job_id"].iloc[0]
    earlier = sorted(fleet.membership.loc[fleet.membership["job_id"] == imbalance_job, "node"])
    for node in earlier[:PEERS]:
        run_on_node(node, "", ["healthctl", "qualify", "run", "--tier", "deep", "--node", node])
    timings["peers"] = time.perf_counter() - t0

    def healthctl(command, *args: str) -> dict:
        """`healthctl COMMAND ARGS --json` on the lab's historian and Slurm: its JSON."""
        res = runner.invoke(command, [*args, "--json"], obj=obj())
        if res.exit_code != 0:
            raise RuntimeError(f"healthctl {command.name} {' '.join(args)}: "
                               f"{res.output[-400:]}")
        return json.loads(res.output)

    say("fail-slow: `healthctl suspects apply` (detect, then the suspect tier in Slurm)")
    t0 = time.perf_counter()
    healthctl(suspects_cmd, "apply")
    engine = hdb.connect(url, create_missing=True)
    try:
        found = [e.as_dict() for e in hs.active(engine)]
    finally:
        engine.dispose()
    tier = {e["node"]: _slurm_view(slurm, e["node"]) for e in found}
    timings["detect"] = time.perf_counter() - t0

    say("fail-slow: `healthctl qualify auto` (idle suspects, stand-in tools)")
    t0 = time.perf_counter()
    qualified = [{"node": r["node"], "result": r["result"], "detail": r["detail"]}
                 for r in healthctl(qualify_cmd, "auto")["results"]]
    settled = healthctl(suspects_cmd, "apply")["settled"]
    timings["qualify"] = time.perf_counter() - t0

    end_state = {e["node"]: _slurm_view(slurm, e["node"]) for e in found}
    injected = [{"job_id": r.job_id, "node": r.node, "kind": r.kind, "gpu": int(r.gpu),
                 "onset": f"{r.onset:%Y-%m-%dT%H:%M:%S}"} for r in truth.itertuples()]
    return FailSlowAct(
        nodes=len(names), jobs=len(fleet.jobs), injected=injected, ingested=ingested,
        found=found, qualified=qualified, settled=settled, slurm=end_state, tier=tier,
        seconds=time.perf_counter() - t_all, step_seconds=timings)
