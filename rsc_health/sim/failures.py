"""Node failures (Poisson per node-day), their health-check signatures, repairs, tickets,
transient check events, and the lemon nodes that fail far more often than the rest; plus the
outages that are no node's fault: planned maintenance drains and fleet-wide "Not responding"
events (`disruption_events`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rsc_health.sim.config import FAILURE_MODES, LEMON_CAUSE_MODES, SimConfig

HOUR = 3600

# Table II: fraction of lemon-node root causes.
LEMON_CAUSE_SHARES = {
    "optics": 0.026, "cpu": 0.026, "psu": 0.051, "nic": 0.077, "eud": 0.103,
    "pcie": 0.154, "dimm": 0.205, "gpu": 0.282, "bios": 0.077,
}

XID_TEXT = {
    "xid79": "GPU has fallen off the bus",
    "xid48": "double bit ECC error",
    "xid63": "row remapping event",
    "xid64": "row remapping failure",
    "xid74": "NVLink error",
    "xid94": "contained ECC error",
    "xid95": "uncontained ECC error",
    "xid119": "GSP RPC timeout",
    "xid31": "GPU memory page fault",
}


@dataclass
class CheckRow:
    time: int
    node: int
    check: str
    code: str
    component: str
    detail: str
    status: str = "fail"
    severity: str = "drain_now"


@dataclass
class Failure:
    node: int
    time: int
    mode: str
    repair_end: int
    lemon: bool
    node_fail: bool  # the jobs it kills end NODE_FAIL (else FAILED)
    rows: list[CheckRow]
    ticket: tuple[int, int] | None  # (opened, closed)
    jobs: list[int] = field(default_factory=list)  # JobIDs it ended
    preempted: list[int] = field(default_factory=list)  # JobIDs its requeues preempted


@dataclass
class FailurePlan:
    lemons: dict[int, str]  # node index -> Table II cause
    failures: list[Failure]
    transients: list[CheckRow]
    node_seconds_up: float


def _gpu(rng: np.random.Generator) -> str:
    return f"gpu{int(rng.integers(0, 8))}"


def signature(mode: str, t: int, node: int, cfg: SimConfig, rng) -> list[CheckRow]:
    """The health-check rows a failure of this mode leaves at its time (Fig. 4's families and
    the co-occurrences of Sec. III: PCIe with XID 79, IB with a GPU off the bus)."""
    gpu = _gpu(rng)
    if mode == "infiniband":
        hca = f"mlx5_{int(rng.integers(0, 8))}"
        rows = [CheckRow(t, node, "infiniband", "ib_down", hca, f"{hca} port 1 state DOWN")]
        if rng.random() < cfg.ib_gpu_share:
            rows.append(CheckRow(t, node, "xid", "xid79", gpu, f"{gpu} {XID_TEXT['xid79']}"))
        return rows
    if mode == "mount":
        code = str(rng.choice(["mount_missing", "mount_hung", "mount_ro"], p=[0.4, 0.4, 0.2]))
        path = str(rng.choice(["/checkpoint", "/datasets", "/home"]))
        return [CheckRow(t, node, "mount", code, path, f"{path} {code.split('_')[1]}")]
    if mode == "gpu_memory":
        if rng.random() < 0.5:
            return [
                CheckRow(t, node, "ecc", "ecc_dbe", gpu, f"{gpu} volatile double bit ECC errors"),
                CheckRow(t, node, "xid", "xid48", gpu, f"{gpu} {XID_TEXT['xid48']}"),
            ]
        return [
            CheckRow(t, node, "remap", "remap_failed", gpu, f"{gpu} row remapping failed"),
            CheckRow(t, node, "xid", "xid64", gpu, f"{gpu} {XID_TEXT['xid64']}"),
        ]
    if mode == "pcie":
        code = str(rng.choice(["aer_fatal", "pcie_downtrained"], p=[0.6, 0.4]))
        rows = [CheckRow(t, node, "pcie", code, gpu, f"{gpu} {code.replace('_', ' ')}")]
        if rng.random() < cfg.pcie_xid79_share:
            rows.append(CheckRow(t, node, "xid", "xid79", gpu, f"{gpu} {XID_TEXT['xid79']}"))
            rows.append(CheckRow(t, node, "gpu", "gpu_lost", gpu, f"{gpu} lost (NVML)"))
        return rows
    if mode == "xid":
        code = str(rng.choice(["xid79", "xid119", "xid94", "xid95"], p=[0.4, 0.2, 0.2, 0.2]))
        return [CheckRow(t, node, "xid", code, gpu, f"{gpu} {XID_TEXT[code]}")]
    if mode == "nvlink":
        return [
            CheckRow(t, node, "nvlink", "nvlink_down", gpu, f"{gpu} link 3 inactive"),
            CheckRow(t, node, "xid", "xid74", gpu, f"{gpu} {XID_TEXT['xid74']}"),
        ]
    if mode == "gpu":
        code = str(rng.choice(["gpu_lost", "gpu_missing"]))
        return [CheckRow(t, node, "gpu", code, gpu, f"{gpu} {code.split('_')[1]}")]
    return []  # node_down: the node stops answering, no check fires


TRANSIENTS = (
    ("infiniband", "ib_symbol_errors", "mlx5_{}", "symbol errors increased"),
    ("infiniband", "ib_rate", "mlx5_{}", "link rate below expected"),
    ("remap", "remap_pending", "gpu{}", "row remapping pending"),
    ("xid", "xid63", "gpu{}", XID_TEXT["xid63"]),
    ("pcie", "pcie_downtrained", "gpu{}", "link width below expected"),
)


def plan_failures(cfg: SimConfig, n_nodes: int, rng: np.random.Generator) -> FailurePlan:
    horizon = int(cfg.days * 24 * HOUR)
    n_lemons = int(round(cfg.lemon_share * n_nodes))
    lemon_idx = np.sort(rng.choice(n_nodes, size=n_lemons, replace=False))
    causes = list(LEMON_CAUSE_SHARES)
    p = np.asarray(list(LEMON_CAUSE_SHARES.values()))
    lemon_cause = rng.choice(len(causes), size=n_lemons, p=p / p.sum())
    lemons = {int(n): causes[c] for n, c in zip(lemon_idx, lemon_cause, strict=True)}

    rate = np.full(n_nodes, cfg.rf)
    rate[lemon_idx] *= cfg.lemon_rf_multiplier
    counts = rng.poisson(rate * cfg.days)
    nodes = np.repeat(np.arange(n_nodes), counts)
    times = rng.integers(0, horizon, size=len(nodes))
    order = np.lexsort((times, nodes))
    nodes, times = nodes[order], times[order]
    mode_names = list(cfg.mode_weights)
    mw = np.asarray([cfg.mode_weights[m] for m in mode_names], dtype=float)
    modes = [mode_names[i] for i in rng.choice(len(mode_names), size=len(nodes), p=mw / mw.sum())]
    repair = np.exp(rng.normal(np.log(cfg.repair_median_h * HOUR), cfg.repair_sigma, len(nodes)))

    failures: list[Failure] = []
    down_until = -1
    last_node = -1
    down_total = 0
    for i in range(len(nodes)):
        node, t = int(nodes[i]), int(times[i])
        if node != last_node:
            last_node, down_until = node, -1
        if t < down_until:  # the node is out for repair: a Poisson arrival during downtime is moot
            continue
        lemon = node in lemons
        mode = modes[i]
        if lemon and rng.random() < 0.7:
            mode = LEMON_CAUSE_MODES[lemons[node]]
        end = t + int(repair[i])
        down_until = end
        down_total += min(end, horizon) - t
        nf = rng.random() < cfg.node_fail_share.get(mode, cfg.node_fail_share_default)
        ticket = None
        if rng.random() < (cfg.lemon_ticket_share if lemon else cfg.ticket_share):
            opened = t + int(rng.uniform(0.2, 4) * HOUR)
            ticket = (min(opened, end - 60), end)
        failures.append(
            Failure(node, t, mode, end, lemon, bool(nf), signature(mode, t, node, cfg, rng), ticket)
        )

    transients = _transients(cfg, n_nodes, horizon, lemons, rng)
    return FailurePlan(lemons, failures, transients, float(n_nodes) * horizon - down_total)


def _transients(cfg, n_nodes, horizon, lemons, rng) -> list[CheckRow]:
    """Warnings that fail no job: link flaps, pending remaps, and the repeated XIDs of lemons."""
    n = rng.poisson(cfg.transient_per_1000_node_days / 1000 * n_nodes * cfg.days)
    nodes = rng.integers(0, n_nodes, size=n)
    times = rng.integers(0, horizon, size=n)
    kinds = rng.integers(0, len(TRANSIENTS), size=n)
    comp = rng.integers(0, 8, size=n)
    rows = []
    for node, t, k, c in zip(nodes, times, kinds, comp, strict=True):
        fam, code, component, text = TRANSIENTS[k]
        component = component.format(c)
        rows.append(CheckRow(int(t), int(node), fam, code, component, f"{component} {text}",
                             "warn", "warn"))
    for node, cause in lemons.items():
        if cause not in ("gpu", "eud", "pcie", "bios"):
            continue
        k = rng.poisson(cfg.lemon_xid_per_day * cfg.days)
        code = {"gpu": "xid94", "eud": "xid63", "pcie": "xid63", "bios": "xid119"}[cause]
        gpu = f"gpu{int(rng.integers(0, 8))}"  # the same bad GPU, again and again
        for t in rng.integers(0, horizon, size=k):
            rows.append(CheckRow(int(t), node, "xid", code, gpu, f"{gpu} {XID_TEXT[code]}",
                                 "warn", "warn"))
    rows.sort(key=lambda r: (r.time, r.node))
    return rows


# What admins write when they drain for planned work (the packaged [lemon]
# maintenance_reason_patterns recognise every one).
MAINTENANCE_REASONS = (
    "maint: BIOS upgrade",
    "scheduled maintenance: kernel 6.1",
    "firmware update, back by 18:00",
    "MAINT rack power work",
    "planned: NVIDIA driver upgrade",
)
ADMIN_USER = "admin(1001)"
SLURM_USER = "slurm(64030)"


def disruption_events(
    cfg: SimConfig, n_nodes: int, horizon: int, rng: np.random.Generator
) -> list[tuple]:
    """Out-of-service periods that are no node's fault, as event rows (node, start, end,
    state, reason, user), the form of writers.event_rows:

    - `maintenance_drains` windows: a block of neighbouring nodes (a rack to a quarter of the
      fleet) drained by an admin with a maintenance reason, node by node over up to two hours,
      out for 2-8 h;
    - `fleet_events`: 30-80% of the fleet stops answering within two minutes (a switch or the
      controller, not the nodes) and is back within 10 min to 2 h.
    Jobs are not rescheduled around them: they are there for the lemon features to ignore."""
    rows: list[tuple] = []
    for _ in range(cfg.maintenance_drains):
        size = int(rng.integers(max(1, n_nodes // 16), max(2, n_nodes // 4) + 1))
        first = int(rng.integers(0, n_nodes - size + 1))
        start = int(rng.integers(0, max(1, horizon - 12 * HOUR)))
        duration = int(rng.uniform(2, 8) * HOUR)
        reason = str(rng.choice(MAINTENANCE_REASONS))
        for node in range(first, first + size):
            t = start + int(rng.integers(0, 2 * HOUR))
            rows.append((node, t, t + duration, "DRAIN", reason, ADMIN_USER))
    for _ in range(cfg.fleet_events):
        count = max(1, int(rng.uniform(0.3, 0.8) * n_nodes))
        start = int(rng.integers(0, max(1, horizon - 6 * HOUR)))
        for node in rng.choice(n_nodes, size=count, replace=False).tolist():
            t = start + int(rng.integers(0, 120))
            end = t + int(rng.uniform(600, 2 * HOUR))
            rows.append((int(node), t, end, "DOWN", "Not responding", SLURM_USER))
    rows = [r for r in rows if r[1] < horizon]
    rows.sort(key=lambda r: (r[1], r[0]))
    return rows


__all__ = ["FAILURE_MODES", "Failure", "FailurePlan", "CheckRow", "disruption_events",
           "plan_failures"]
