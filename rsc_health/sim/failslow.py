"""Fail-slow lab: multi-node jobs' telemetry and per-rank step times, with slow nodes injected
and the healthy spread a detector must not flag (the lab; the product never imports it).

Each job runs on its own nodes for `sweeps` sweeps of `slot_s` seconds; every node samples the
telemetry vocabulary once a sweep at its own phase (HealthCheckNodeState=CYCLE spreads them).

Healthy spread:
- per-node offsets (clock bins, a rack's cooling: temperature), per-sample noise, one-sweep
  jitters (a clock dip, a throttle spike), PCIe links idling down on the nodes that sample
  during a checkpoint,
- job-wide shifts (a phase that runs hotter or clocks lower on every node; fabric congestion
  on every node, or on one leaf switch's share of them),
- step times: per-step noise from uneven sequence lengths across data-parallel ranks, a
  slowly drifting per-rank imbalance, a heavier last pipeline stage, job-wide slow phases
  (evaluation, checkpoints).

Injected fail-slow nodes (one a job, two in a few big ones), from an onset time on:
- hw_slowdown: one GPU stuck in HW slowdown: SM clock ratio down 20-50%, HW slowdown most
  of every interval, its rank's steps slower by the clock loss;
- pcie_x8: a GPU's PCIe link downtrained x16 -> x8 (link ratio 0.5), steps 3-10% slower;
- ib_congested: one HCA port congested: xmit_wait 4-20x its peers, steps 5-30% slower;
- thermal: a GPU running 12-20 C hotter in SW thermal slowdown, clocks down 8-20%;
- nvlink_degraded: a GPU whose NVLink carries 5-60% of its peers' bytes (links down or NVLink
  P2P lost: NCCL moves its traffic to PCIe), steps 5-30% slower. A synchronous job's nodes move
  the same bytes per step, so a node's NVLink throughput is off its peers' only when its traffic
  went elsewhere; a link that is merely slower slows every node alike and shows in step times;
- ib_port_errors: one HCA port's symbol/link errors rising (6 to 60 per sweep at onset, growing
  up to 30% a sweep, capped at 1/s) while its peers' ports count none, steps 2-15% slower.

NVLink throughput: a job's GPUs answer NOT_SUPPORTED for the throughput fields on a share of
jobs (`nvlink_unsupported_share`; the real H200 does): no nvlink_data_rate sample at all, never a
zero. Its healthy spread: a job's traffic level, a per-node offset of a few percent, per-sample
noise, checkpoints that idle part of each node's interval (by its phase), a pipeline's last stage
moving less, job-wide phases. IB errors' healthy spread (ib_error_rate: the link's own physical
errors): most ports count none, a few count a trickle, one-sweep bursts on a random port of at
most what the infiniband family keeps in service (HEALTHY_BURST_MAX), fabric events on every
port of the job or a leaf's (a switch flapping: its links recover or go down and retrain).
The draws of both come from a generator of their own (seed, job), so the other metrics, the
kinds' parameters and step times of a seed stay as they were.

Workload-imbalance jobs (`imbalance_share`) carry the healthy spread at its strongest and no
fault: a detector should flag none of their nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rsc_health.checks.infiniband import DEFAULT_LIMITS
from rsc_health.checks.telemetry import IB_ERRORS

# The most physical errors (symbol, link recovery, link downed, link integrity: what
# ib_error_rate sums) a port counts in one sweep and stays in service by the infiniband
# family's own per-sweep limits (10 + 1 + 0 + 10 = 21); past any of them the family drains the
# node after its job as a bad cable. A healthy port's one-sweep burst stays under it.
HEALTHY_BURST_MAX = sum(DEFAULT_LIMITS[c] for c in IB_ERRORS)

# Of a job's nodes that sample during a checkpoint, the share whose GPU still reads busy
# (its utilization sample holding the kernels it just finished) while its PCIe link has
# already idled down to Gen1: the collector judges a busy GPU's link speed, an idle one's
# width only.
TRANSITION_SHARE = 0.05

# The tags of the draws that have a generator of their own per (seed, job) (`_own_rng`), so a
# draw added to one leaves every other figure of a seed as it was; one tag each, never reused.
LINKS_STREAM = 25  # healthy NVLink throughput and IB errors (`_links`)
TRANSITION_STREAM = 26  # which caught GPUs read busy as their link idles down (TRANSITION_SHARE)

KINDS = ("hw_slowdown", "pcie_x8", "ib_congested", "thermal", "nvlink_degraded",
         "ib_port_errors")


@dataclass
class FailSlowConfig:
    jobs: int = 120
    seed: int = 0
    start: str = "2024-03-01T00:00:00"
    slot_s: int = 300
    sweeps: tuple[int, int] = (12, 36)  # a job's length in sweeps (uniform)
    sizes: tuple[int, ...] = (4, 8, 16, 32, 64)
    size_weights: tuple[float, ...] = (0.25, 0.3, 0.25, 0.12, 0.08)
    gpus_per_node: int = 8
    fault_share: float = 0.4  # jobs with an injected fail-slow node
    imbalance_share: float = 0.25  # jobs with the strongest healthy spread and no fault
    steps_share: float = 0.5  # jobs that write per-rank step times
    step_windows: int = 6  # step-time lines per rank per sweep
    step_s: float = 10.0  # a healthy step's seconds
    kinds: tuple[str, ...] = KINDS
    first_job_id: int = 5000
    node_prefix: str = "fs"
    # Each job's kind in order, instead of the draw (the demo's fixed acts): a fault kind of
    # KINDS (one node of that fault), "imbalance" or "plain"; jobs past its end are drawn.
    script: tuple[str, ...] = ()
    start_within_s: int = 86400  # jobs start at random within this many seconds of `start`
    # jobs whose GPUs answer NOT_SUPPORTED for NVLink throughput (no nvlink_data_rate samples)
    nvlink_unsupported_share: float = 0.3
    # every fault on from the job's first sweep (a node slow before the job began: no onset
    # inside it; bench_failslow.py --from-start); the jobs stay as drawn
    from_start: bool = False
    # telemetry metrics written (the contract's vocabulary)
    metrics: tuple[str, ...] = field(default=(
        "sm_clock_ratio", "throttle_hw_frac", "throttle_power_frac", "gpu_temp_c",
        "power_ratio", "pcie_link_ratio", "pcie_replay_rate", "nvlink_error_rate",
        "ib_xmit_wait_rate", "ib_link_ratio", "nvlink_data_rate", "ib_error_rate"))


@dataclass
class FailSlowFleet:
    samples: pd.DataFrame  # node, time, metric, value, component
    membership: pd.DataFrame  # job_id, node, start, end, gpu_model, stage
    steps: pd.DataFrame  # job_id, rank, node, stage, step, seconds, time
    truth: pd.DataFrame  # job_id, node, kind, onset, gpu (the fault's), slow (step factor)
    jobs: pd.DataFrame  # job_id, nodes, start, end, kind (fault | imbalance | plain), steps


def _job_plan(cfg: FailSlowConfig, rng: np.random.Generator) -> list[dict]:
    w = np.asarray(cfg.size_weights, dtype=float)
    plans = []
    t0 = np.datetime64(cfg.start, "s")
    for j in range(cfg.jobs):
        n = int(rng.choice(cfg.sizes, p=w / w.sum()))
        sweeps = int(rng.integers(cfg.sweeps[0], cfg.sweeps[1] + 1))
        u = rng.random()
        kind = ("fault" if u < cfg.fault_share else
                "imbalance" if u < cfg.fault_share + cfg.imbalance_share else "plain")
        fault_kind = None
        if j < len(cfg.script):
            fault_kind = cfg.script[j] if cfg.script[j] in KINDS else None
            kind = "fault" if fault_kind else cfg.script[j]
        pp = int(rng.choice([p for p in (1, 2, 4) if n // p >= 4]))
        plans.append({
            "job_id": str(cfg.first_job_id + j), "n": n, "sweeps": sweeps, "kind": kind,
            "pp": pp, "steps": bool(rng.random() < cfg.steps_share),
            "start": t0 + np.timedelta64(int(rng.integers(0, 86400)) * cfg.start_within_s
                                         // 86400, "s"),
            "gpu_model": str(rng.choice(["H100-SXM5-80GB", "A100-SXM4-80GB"])),
            "fault_kind": fault_kind,
        })
    return plans


def _faults(plan: dict, cfg: FailSlowConfig, rng: np.random.Generator) -> list[dict]:
    if plan["kind"] != "fault":
        return []
    count = 2 if plan["n"] >= 32 and rng.random() < 0.15 else 1
    if plan.get("fault_kind"):
        count = 1
    nodes = rng.choice(plan["n"], size=count, replace=False)
    out = []
    for node in nodes.tolist():
        sweeps = plan["sweeps"]
        onset = int(rng.integers(max(1, sweeps // 5), max(2, sweeps - 4)))
        onset = 0 if cfg.from_start else onset
        kind = str(rng.choice(cfg.kinds))
        kind = plan.get("fault_kind") or kind
        f = {"node": node, "kind": kind, "onset_sweep": onset,
             "gpu": int(rng.integers(0, cfg.gpus_per_node)),
             "hca": int(rng.integers(0, 8))}
        if kind == "hw_slowdown":
            f.update(clock=rng.uniform(0.5, 0.8), hw=rng.uniform(0.6, 1.0))
            f["slow"] = 1 / f["clock"]
        elif kind == "pcie_x8":
            f.update(slow=rng.uniform(1.03, 1.10))
        elif kind == "ib_congested":
            f.update(wait=rng.uniform(4, 20), slow=rng.uniform(1.05, 1.3))
        elif kind == "thermal":
            f.update(temp=rng.uniform(12, 20), hw=rng.uniform(0.3, 0.8),
                     clock=rng.uniform(0.8, 0.92))
            f["slow"] = 1 / f["clock"]
        elif kind == "nvlink_degraded":
            f.update(nvl=rng.uniform(0.05, 0.6), slow=rng.uniform(1.05, 1.3))
        else:  # ib_port_errors: errors per second at onset, growth per sweep
            f.update(err=rng.uniform(0.02, 0.2), growth=rng.uniform(0.0, 0.3),
                     slow=rng.uniform(1.02, 1.15))
        out.append(f)
    return out


def _telemetry(plan: dict, faults: list[dict], names: list[str], cfg: FailSlowConfig,
               rng: np.random.Generator) -> tuple[pd.DataFrame, np.ndarray, str]:
    n, s = plan["n"], plan["sweeps"]
    phase = rng.integers(0, cfg.slot_s, size=n)
    times = (plan["start"] + np.timedelta64(60, "s")
             + (np.arange(s)[None, :] * cfg.slot_s + phase[:, None]).astype("timedelta64[s]"))
    strong = plan["kind"] == "imbalance"
    shape = (n, s)

    def jitter(p: float) -> np.ndarray:
        return rng.random(shape) < p

    # Healthy: a job's base level, each node's own offset, per-sample noise, one-sweep jitters.
    clock = (rng.uniform(0.93, 1.0) + rng.normal(0, 0.006, (n, 1)) + rng.normal(0, 0.006, shape))
    clock = np.where(jitter(0.02), clock * rng.uniform(0.85, 0.95, shape), clock)
    hw = np.where(jitter(0.01), rng.uniform(0.02, 0.4, shape), 0.0)
    power_frac = np.clip(rng.uniform(0, 0.3) + rng.normal(0, 0.05, shape), 0, 1)
    temp = rng.uniform(55, 72) + rng.normal(0, 2.5, (n, 1)) + rng.normal(0, 1.2, shape)
    hot_rack = rng.random(n) < 0.05  # a node in a warm spot of its rack: healthy, hotter
    temp[hot_rack] += rng.uniform(4, 8)
    power = np.clip(rng.uniform(0.6, 0.95) + rng.normal(0, 0.03, shape), 0, 1.1)
    # A checkpoint idles every GPU of the job at once, and an idle GPU's link drops to Gen1.
    # The collector reads an idle GPU's link width only (checks/telemetry._pcie_link_ratio:
    # its utilization sample under [telemetry] busy_util_pct), so of the nodes that sample
    # during it only a few read Gen1 (a quarter of Gen4's rate): those whose utilization
    # sample still holds the kernels the GPU just finished while its link has already
    # dropped, TRANSITION_SHARE of them (no source gives the rate: the harsh side). The draw
    # is a generator of its own (seed, job), so every other figure of a seed stays as it was.
    ckpt = rng.random(s) < 0.03
    caught = ckpt[None, :] & (rng.random(shape) < rng.uniform(0.3, 1.0))
    busy = _own_rng(cfg, plan, TRANSITION_STREAM).random(shape)
    pcie = np.where(caught & (busy < TRANSITION_SHARE), 0.25, 1.0)
    replay = np.where(jitter(0.01), rng.uniform(0, 0.5, shape), 0.0)
    nvl = np.zeros(shape)
    wait = (np.exp(rng.uniform(np.log(2e5), np.log(2e6))) * np.exp(rng.normal(0, 0.1, (n, 1)))
            * np.exp(rng.normal(0, 0.25, shape)))
    ib_link = np.ones(shape)
    # Job-wide shifts: every node (or a leaf switch's share of them) at once.
    shift = ""
    if strong or rng.random() < 0.2:
        a = int(rng.integers(0, s - 2))
        b = int(rng.integers(a + 2, s + 1))
        what = int(rng.integers(0, 3))
        shift = f"{('phase', 'fabric', 'leaf')[what]} sweeps {a}-{b}"
        if what == 0:  # a hotter, lower-clocked phase on every node
            clock[:, a:b] *= rng.uniform(0.8, 0.92)
            temp[:, a:b] += rng.uniform(4, 10)
            hw[:, a:b] = np.maximum(hw[:, a:b], rng.uniform(0.0, 0.3))
        elif what == 1:  # fabric congestion everywhere
            wait[:, a:b] *= rng.uniform(3, 10)
        else:  # one leaf switch's nodes congested: 30-50% of the job
            leaf = np.zeros(n, dtype=bool)
            leaf[rng.choice(n, size=max(2, int(np.ceil(rng.uniform(0.3, 0.5) * n))),
                            replace=False)] = True
            wait[np.ix_(leaf, np.arange(a, b))] *= rng.uniform(3, 10)
    comp = {m: np.full(shape, "node", dtype=object) for m in cfg.metrics}
    gpu_names = np.asarray([f"gpu{i}" for i in range(cfg.gpus_per_node)], dtype=object)
    for m in ("sm_clock_ratio", "throttle_hw_frac", "gpu_temp_c", "power_ratio",
              "pcie_link_ratio", "pcie_replay_rate", "throttle_power_frac",
              "nvlink_error_rate"):
        comp[m] = gpu_names[rng.integers(0, cfg.gpus_per_node, shape)]
    comp["ib_xmit_wait_rate"] = np.asarray([f"mlx5_{i}:1" for i in range(8)],
                                           dtype=object)[rng.integers(0, 8, shape)]
    comp["ib_link_ratio"] = comp["ib_xmit_wait_rate"]
    nvl_rate, ib_err = _links(plan, faults, shift, ckpt, cfg, comp)
    slow = np.ones(shape)
    for f in faults:
        i, on = f["node"], slice(f["onset_sweep"], s)
        gpu = f"gpu{f['gpu']}"
        if f["kind"] == "hw_slowdown":
            clock[i, on] = f["clock"] + rng.normal(0, 0.01, s - f["onset_sweep"])
            hw[i, on] = np.clip(f["hw"] + rng.normal(0, 0.05, s - f["onset_sweep"]), 0, 1)
            comp["sm_clock_ratio"][i, on] = comp["throttle_hw_frac"][i, on] = gpu
        elif f["kind"] == "pcie_x8":
            pcie[i, on] = 0.5
            comp["pcie_link_ratio"][i, on] = gpu
        elif f["kind"] == "ib_congested":
            wait[i, on] *= f["wait"]
            comp["ib_xmit_wait_rate"][i, on] = f"mlx5_{f['hca']}:1"
        elif f["kind"] == "thermal":
            temp[i, on] += f["temp"]
            hw[i, on] = np.clip(f["hw"] + rng.normal(0, 0.05, s - f["onset_sweep"]), 0, 1)
            clock[i, on] = np.minimum(clock[i, on], f["clock"])
            comp["gpu_temp_c"][i, on] = comp["throttle_hw_frac"][i, on] = gpu
            comp["sm_clock_ratio"][i, on] = gpu
        elif f["kind"] == "nvlink_degraded":
            nvl_rate[i, on] *= f["nvl"]
            comp["nvlink_data_rate"][i, on] = gpu
        elif f["kind"] == "ib_port_errors":
            # counts per sweep, rising from onset: Poisson around the port's rate
            rate = np.minimum(1.0, f["err"] * (1 + f["growth"])
                              ** np.arange(s - f["onset_sweep"]))
            ib_err[i, on] = np.maximum(ib_err[i, on], rng.poisson(rate * cfg.slot_s) / cfg.slot_s)
            comp["ib_error_rate"][i, on] = f"mlx5_{f['hca']}:1"
        slow[i, on] = f["slow"]
    values = {
        "sm_clock_ratio": np.clip(clock, 0.05, 1.0), "throttle_hw_frac": np.clip(hw, 0, 1),
        "throttle_power_frac": power_frac, "gpu_temp_c": temp, "power_ratio": power,
        "pcie_link_ratio": pcie, "pcie_replay_rate": replay, "nvlink_error_rate": nvl,
        "ib_xmit_wait_rate": wait, "ib_link_ratio": ib_link,
        "nvlink_data_rate": nvl_rate, "ib_error_rate": ib_err,
    }
    node_col = np.repeat(np.asarray(names, dtype=object), s)
    time_col = times.reshape(-1)
    frames = [pd.DataFrame({"node": node_col, "time": time_col, "metric": m,
                            "value": values[m].reshape(-1), "component": comp[m].reshape(-1)})
              for m in cfg.metrics]
    # NaN: not answered (NOT_SUPPORTED, no busy GPU): no sample, never a zero
    frames = [f[f["value"].notna()] for f in frames]
    return pd.concat(frames, ignore_index=True), slow, shift


def _own_rng(cfg: FailSlowConfig, plan: dict, stream: int) -> np.random.Generator:
    """The generator of one of a job's own draws (`stream`: a *_STREAM tag above)."""
    return np.random.default_rng([cfg.seed, int(plan["job_id"]), stream])


def _links(plan: dict, faults: list[dict], shift: str, ckpt: np.ndarray, cfg: FailSlowConfig,
           comp: dict) -> tuple[np.ndarray, np.ndarray]:
    """Healthy nvlink_data_rate (bytes/s, the node's least busy GPU; NaN where not answered)
    and ib_error_rate (errors/s, the node's worst port), from a generator of their own (the
    seed's other draws stay as they were); their components into `comp`."""
    rng = _own_rng(cfg, plan, LINKS_STREAM)
    n, s = plan["n"], plan["sweeps"]
    shape = (n, s)
    strong = plan["kind"] == "imbalance"
    g = cfg.gpus_per_node
    comp["nvlink_data_rate"] = np.asarray([f"gpu{i}" for i in range(g)],
                                          dtype=object)[rng.integers(0, g, shape)]
    ports = np.asarray([f"mlx5_{i}:1" for i in range(8)], dtype=object)
    comp["ib_error_rate"] = np.full(shape, ports[0], dtype=object)  # all zero: the first port
    nvl_fault = any(f["kind"] == "nvlink_degraded" for f in faults)
    # A job's traffic level; each node a few percent off it; per-sample noise (the node's
    # least busy GPU over the interval).
    level = np.exp(rng.uniform(np.log(2e10), np.log(2e11)))
    nvl = (level * np.exp(rng.normal(0, 0.03 if not strong else 0.06, (n, 1)))
           * np.exp(rng.normal(0, 0.05 if not strong else 0.1, shape)))
    pp = plan["pp"]
    if pp > 1:  # the last pipeline stage moves less over NVLink (a role, not a fault)
        last = np.arange(n) * pp // n == pp - 1
        nvl[last] *= rng.uniform(0.6, 0.95)
    # A checkpoint idles the GPUs for part of each node's interval (by its phase); a node that
    # samples while idle has no busy GPU: no sample.
    for t in np.flatnonzero(ckpt):
        nvl[:, t] *= rng.uniform(0.3, 1.0, n)
        nvl[rng.random(n) < 0.2, t] = np.nan
    jitter = rng.random(shape) < (0.02 if not strong else 0.05)  # a one-sweep dip on one GPU
    nvl = np.where(jitter, nvl * rng.uniform(0.5, 0.9, shape), nvl)
    if shift.startswith("phase"):  # a phase with less communication on every node
        a, b = (int(x) for x in shift.split()[-1].split("-"))
        nvl[:, a:b] *= rng.uniform(0.5, 0.9)
    if not nvl_fault and rng.random() < cfg.nvlink_unsupported_share:
        nvl[:] = np.nan  # NOT_SUPPORTED for the throughput fields: the metric is absent
    # IB errors: most ports count none; a few a trickle on their own port; one-sweep bursts.
    counts = np.zeros(shape)
    trickle = rng.random(n) < 0.1
    counts[trickle] = rng.poisson(rng.uniform(0.2, 2.0, (int(trickle.sum()), 1)),
                                  (int(trickle.sum()), s))
    comp["ib_error_rate"][trickle] = ports[rng.integers(0, 8, int(trickle.sum()))][:, None]
    # (the workload does not make a healthy cable count errors: the same rate in every job).
    # ib_error_rate counts the link's own physical errors only: the receive, remote physical
    # and overrun errors healthy ports count under load (up to 100 a sweep each, which bursts
    # of 5-100 stood for before 2026-11-27) are not in it, and a burst of physical errors on a
    # port the infiniband family keeps in service is at most HEALTHY_BURST_MAX. Their rate is
    # kept (no source gives one for a healthy link's physical one-offs: the harsh side).
    burst = rng.random(shape) < 0.01
    counts = np.where(burst, np.maximum(counts, rng.integers(5, HEALTHY_BURST_MAX + 1, shape)),
                      counts)
    comp["ib_error_rate"] = np.where(burst, ports[rng.integers(0, 8, shape)],
                                     comp["ib_error_rate"])
    if strong or rng.random() < 0.1:
        # A fabric event (a leaf or spine switch flapping), 1-2 sweeps: every node's port on
        # that rail, or a leaf's share of the nodes, counts errors of one level give or take.
        a = int(rng.integers(0, s - 1))
        b = min(s, a + int(rng.integers(1, 3)))
        hit = np.ones(n, dtype=bool)
        if rng.random() < 0.5:  # a leaf's share: 30-50% of the nodes (at least two)
            hit[:] = False
            hit[rng.choice(n, size=max(2, int(np.ceil(rng.uniform(0.3, 0.5) * n))),
                           replace=False)] = True
        level = rng.uniform(5, 60) * np.exp(rng.normal(0, 0.4, (int(hit.sum()), b - a)))
        counts[np.ix_(hit, np.arange(a, b))] += np.round(level)
        comp["ib_error_rate"][np.ix_(hit, np.arange(a, b))] = ports[rng.integers(0, 8)]
    return nvl, counts / cfg.slot_s


def _steps(plan: dict, slow: np.ndarray, names: list[str], cfg: FailSlowConfig,
           rng: np.random.Generator) -> pd.DataFrame:
    """One line per rank per window: the mean step seconds over the window's steps."""
    n, s, g, pp = plan["n"], plan["sweeps"], cfg.gpus_per_node, plan["pp"]
    w = cfg.step_windows
    strong = plan["kind"] == "imbalance"
    nw = s * w
    stage_of_node = np.arange(n) * pp // n  # contiguous blocks of nodes per stage
    stage_factor = np.where(stage_of_node == pp - 1, rng.uniform(1.15, 1.4) if pp > 1 else 1.0,
                            1.0)
    steps_per_window = max(1, int(cfg.slot_s / w / cfg.step_s))
    # Per-rank drifting imbalance (sequence lengths by data shard): AR(1), stationary std.
    sd = 0.03 if strong else 0.015
    drift = np.zeros((n, g, nw))
    drift[:, :, 0] = rng.normal(0, sd, (n, g))
    for t in range(1, nw):
        drift[:, :, t] = 0.8 * drift[:, :, t - 1] + rng.normal(0, sd * 0.6, (n, g))
    # Per-step noise from uneven sequence lengths, averaged over the window's steps.
    sigma = 0.25 if strong else 0.1
    noise = np.exp(rng.normal(0, sigma / np.sqrt(steps_per_window), (n, g, nw)))
    # Occasional very long batches on one rank (a window's mean pulled up).
    burst = rng.random((n, g, nw)) < (0.01 if strong else 0.003)
    noise = np.where(burst, noise * rng.uniform(1.2, 1.6, (n, g, nw)), noise)
    base = cfg.step_s * stage_factor[:, None, None] * np.exp(drift) * noise
    # Job-wide slow phases (evaluation, a checkpoint): every rank at once.
    if strong or rng.random() < 0.2:
        a = int(rng.integers(0, nw - 2))
        b = int(rng.integers(a + 2, min(nw, a + 2 * w) + 1))
        base[:, :, a:b] *= rng.uniform(1.5, 3.0)
    node_slow = np.repeat(slow, w, axis=1)  # (n, nw)
    # A fault slows one GPU's rank (hw, thermal) or every rank of the node (pcie/ib): both
    # show in the node's slowest rank; spread it on rank 0..g-1 by the fault's GPU (rank g-1).
    per_rank = np.ones((n, g, nw))
    per_rank[:, -1, :] = node_slow
    pcie_ib = node_slow > 1.0
    per_rank[:, :-1, :] = np.where(pcie_ib[:, None, :], 1 + (node_slow[:, None, :] - 1) * 0.7, 1)
    sec = base * per_rank
    t = (plan["start"] + np.timedelta64(60, "s")
         + (np.arange(nw) * (cfg.slot_s // w) + cfg.slot_s // w - 1).astype("timedelta64[s]"))
    ranks = (np.arange(n)[:, None] * g + np.arange(g)[None, :])
    return pd.DataFrame({
        "job_id": plan["job_id"],
        "rank": np.repeat(ranks.reshape(-1), nw),
        "node": np.repeat(np.asarray(names, dtype=object), g * nw),
        "stage": np.repeat(stage_of_node.astype(str), g * nw) if pp > 1 else "",
        "step": np.tile((np.arange(nw) + 1) * steps_per_window, n * g),
        "seconds": sec.reshape(-1),
        "time": np.tile(t, n * g),
    })


def simulate_failslow(cfg: FailSlowConfig | None = None) -> FailSlowFleet:
    cfg = cfg or FailSlowConfig()
    rng = np.random.default_rng(cfg.seed)
    samples, members, steps, truth, jobs = [], [], [], [], []
    node_no = 0
    for plan in _job_plan(cfg, rng):
        names = [f"{cfg.node_prefix}{node_no + i:05d}" for i in range(plan["n"])]
        node_no += plan["n"]
        faults = _faults(plan, cfg, rng)
        tel, slow, shift = _telemetry(plan, faults, names, cfg, rng)
        samples.append(tel)
        end = plan["start"] + np.timedelta64(plan["sweeps"] * cfg.slot_s + 120, "s")
        stage_of_node = np.arange(plan["n"]) * plan["pp"] // plan["n"]
        members.append(pd.DataFrame({
            "job_id": plan["job_id"], "node": names, "start": plan["start"], "end": end,
            "gpu_model": plan["gpu_model"],
            "stage": stage_of_node.astype(str) if plan["steps"] and plan["pp"] > 1 else None}))
        if plan["steps"]:
            steps.append(_steps(plan, slow, names, cfg, rng))
        for f in faults:
            onset = (plan["start"] + np.timedelta64(60, "s")
                     + np.timedelta64(f["onset_sweep"] * cfg.slot_s, "s"))
            truth.append({"job_id": plan["job_id"], "node": names[f["node"]],
                          "kind": f["kind"], "onset": onset, "gpu": f["gpu"],
                          "slow": float(f["slow"])})
        jobs.append({"job_id": plan["job_id"], "nodes": plan["n"], "start": plan["start"],
                     "end": end, "kind": plan["kind"], "steps": plan["steps"],
                     "pp": plan["pp"], "shift": shift})
    cols = ["job_id", "rank", "node", "stage", "step", "seconds", "time"]
    return FailSlowFleet(
        samples=pd.concat(samples, ignore_index=True),
        membership=pd.concat(members, ignore_index=True),
        steps=pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(columns=cols),
        truth=pd.DataFrame(truth, columns=["job_id", "node", "kind", "onset", "gpu", "slow"]),
        jobs=pd.DataFrame(jobs),
    )


def write_failslow(fleet: FailSlowFleet, out_dir) -> dict[str, object]:
    """The lab's fleet as files: `steps/JOB.jsonl` (the drop file of docs/failslow.md, one per
    job that writes step times), `telemetry.jsonl` (one sample a line: node, time, metric, value,
    component; times ISO 8601 UTC), `failslow_jobs.csv` (job_id, node, start, end, gpu_model,
    stage) and `failslow_truth.json` (the injected nodes and their onsets)."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    (out / "steps").mkdir(parents=True, exist_ok=True)

    def iso(col: pd.Series) -> pd.Series:
        return pd.to_datetime(col).dt.strftime("%Y-%m-%dT%H:%M:%SZ")

    for job, rows in fleet.steps.groupby("job_id", sort=True):
        rows.assign(time=iso(rows["time"]), seconds=rows["seconds"].round(6)).to_json(
            out / "steps" / f"{job}.jsonl", orient="records", lines=True)
    fleet.samples.assign(time=iso(fleet.samples["time"])).to_json(
        out / "telemetry.jsonl", orient="records", lines=True)
    fleet.membership.assign(start=iso(fleet.membership["start"]),
                            end=iso(fleet.membership["end"])).to_csv(
        out / "failslow_jobs.csv", index=False)
    truth = [{"job_id": r.job_id, "node": r.node, "kind": r.kind,
              "onset": pd.Timestamp(r.onset).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "gpu": int(r.gpu), "slow": round(float(r.slow), 6)}
             for r in fleet.truth.itertuples()]
    (out / "failslow_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return {"steps_files": fleet.steps["job_id"].nunique(), "samples": len(fleet.samples),
            "injected": len(truth)}
