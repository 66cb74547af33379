"""`healthctl demo`: the whole product on an embedded default, where no GPUs or Slurm exist.

Simulate a fleet in Slurm's own formats, ingest it into a fresh SQLite historian, attribute the
job failures, compute r_f, MTTF and lemon verdicts, write the nightly report, and hold the result
against the simulator's ground truth. Every step is the same code an operator runs by hand.

Then the fail-slow act (rsc_health/sim/failslow_demo.py): a small fleet's last hour of
telemetry and step times with one GPU stuck in HW slowdown and one congested HCA port, through
`ingest sacct`, `spool flush`, `ingest steps`, `suspects apply` and `qualify auto` on a
MemorySlurm with stand-in tools, into its own SQLite historian (OUT/failslow/historian.db): the
slow GPU's node is found and confirmed (drained with the qualify reason), the other suspect,
whose hardware is fine, is cleared.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rsc_health.config import Config

Step = Callable[[str], None]


@dataclass
class DemoResult:
    out_dir: Path
    database_url: str
    report_html: Path
    summary_txt: Path
    nodes: int
    days: float
    seed: int
    jobs: int
    job_instances: int
    injected_failures: int
    rf_true_per_1000: float
    rf_est_per_1000: float
    rf_ci_per_1000: tuple[float, float]
    rf_failures: int
    rf_node_days: float
    lemons_planted: list[str]
    lemons_found: list[str]
    step_seconds: dict[str, float] = field(default_factory=dict)
    # The fail-slow act (FailSlowAct.to_dict(), its printed lines under "lines").
    failslow: dict = field(default_factory=dict)
    qualification: list[str] = field(default_factory=list)  # sim.qualify_fleet.demo_lines

    @property
    def true_positives(self) -> list[str]:
        return sorted(set(self.lemons_found) & set(self.lemons_planted))

    @property
    def precision(self) -> float:
        return len(self.true_positives) / len(self.lemons_found) if self.lemons_found else 1.0

    @property
    def recall(self) -> float:
        return len(self.true_positives) / len(self.lemons_planted) if self.lemons_planted else 1.0

    @property
    def rf_within_ci(self) -> bool:
        lo, hi = self.rf_ci_per_1000
        return lo <= self.rf_true_per_1000 <= hi

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(out_dir=str(self.out_dir), report_html=str(self.report_html),
                 summary_txt=str(self.summary_txt), precision=self.precision,
                 recall=self.recall, rf_within_ci=self.rf_within_ci)
        return d

    def summary(self) -> str:
        lo, hi = self.rf_ci_per_1000
        missed = sorted(set(self.lemons_planted) - set(self.lemons_found))
        extra = sorted(set(self.lemons_found) - set(self.lemons_planted))
        lines = [
            f"fleet: {self.nodes} nodes x 8 GPUs, {self.days:g} days (seed {self.seed}): "
            f"{self.jobs:,} jobs, {self.job_instances:,} sacct rows, "
            f"{self.injected_failures} injected node failures",
            f"r_f (large jobs): {self.rf_est_per_1000:.2f} per 1000 node-days "
            f"(90% CI {lo:.2f}-{hi:.2f}, {self.rf_failures} failures over "
            f"{self.rf_node_days:,.0f} node-days); simulator's truth {self.rf_true_per_1000:.2f}"
            + (" - inside the interval" if self.rf_within_ci else " - OUTSIDE the interval"),
            f"lemons: found {len(self.lemons_found)}, planted {len(self.lemons_planted)}, "
            f"{len(self.true_positives)} correct (precision {self.precision:.2f}, "
            f"recall {self.recall:.2f})",
        ]
        if missed:
            lines.append(f"  missed: {', '.join(missed)}")
        if extra:
            lines.append(f"  flagged but healthy: {', '.join(extra)}")
        lines += self.failslow.get("lines", [])
        lines.extend(self.qualification)
        lines.append(f"report: {self.report_html}")
        lines.append(f"historian: {self.database_url}")
        steps = ", ".join(f"{k} {v:.1f}s" for k, v in self.step_seconds.items())
        lines.append(f"time: {sum(self.step_seconds.values()):.1f}s ({steps})")
        return "\n".join(lines)


def run_demo(
    cfg: Config,
    out_dir: Path,
    *,
    nodes: int | None = None,
    days: float | None = None,
    seed: int | None = None,
    database_url: str | None = None,
    progress: Step | None = None,
) -> DemoResult:
    """Run the whole pipeline into `out_dir` (sim/, report/, historian.db)."""
    from rsc_health.historian import db as hdb
    from rsc_health.historian.attribute import Window as AttributionWindow
    from rsc_health.historian.attribute import attribute
    from rsc_health.historian.metrics import rates
    from rsc_health.historian.metrics._sql import Window
    from rsc_health.report.gather import GatherOptions, gather
    from rsc_health.report.render import write_report
    from rsc_health.sim.config import SimConfig
    from rsc_health.sim.core import simulate
    from rsc_health.sim.historian import fresh_sqlite, ingest_fleet, truth_of

    say = progress or (lambda _msg: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}

    def timed(name: str, label: str, fn):
        say(label)
        t0 = time.perf_counter()
        value = fn()
        timings[name] = time.perf_counter() - t0
        return value

    sim_cfg = SimConfig.from_config(cfg, nodes=nodes, days=days, seed=seed)
    sim_dir = out_dir / "sim"
    sim = timed("simulate", f"simulating {sim_cfg.nodes} nodes x {sim_cfg.days:g} days",
                lambda: simulate(sim_cfg, sim_dir))

    if database_url is None:  # a fresh historian every run
        database_url = fresh_sqlite(out_dir / "historian.db")
    engine = hdb.connect(database_url, create_missing=True)
    try:
        gpus_per_node = int(cfg.get("historian.gpus_per_node"))
        timed("ingest", "ingesting sacct, node events, health checks, exclusions, tickets",
              lambda: ingest_fleet(engine, sim_dir, gpus_per_node=gpus_per_node))
        timed("attribute", "attributing job failures to health checks",
              lambda: attribute(engine, window=AttributionWindow.from_config(cfg)))

        truth, as_of = truth_of(sim_dir)
        large = int(cfg.get("metrics.large_job_gpus"))
        rf = timed("metrics", "computing the failure rate",
                   lambda: rates.failure_rate(engine, Window(until=as_of), large))

        options = GatherOptions.from_config(
            cfg.section("report"), cfg.section("lemon"), cfg.section("ettr"),
            cfg.section("metrics"), cfg.section("historian"), cfg.section("xid"),
            cfg.section("actions"))
        report_dir = out_dir / "report"
        data = timed("report_data", "gathering metrics and lemon verdicts",
                     lambda: gather(engine, as_of, options, progress=say))
        written = timed("report", "writing the report",
                        lambda: write_report(data, report_dir, progress=say))
    finally:
        engine.dispose()

    from rsc_health.sim.failslow_demo import run_failslow_act

    act = timed("failslow", "fail-slow: a suspect found, qualified and confirmed",
                lambda: run_failslow_act(out_dir / "failslow", seed=sim_cfg.seed,
                                         progress=say))
    found = sorted(str(n) for n in data.lemons["node"]) if len(data.lemons) else []
    qualification = timed("qualification", "what qualification prevents (fleet model)",
                          lambda: _qualification_lines(sim_cfg.seed))
    return DemoResult(
        out_dir=out_dir,
        database_url=database_url,
        report_html=written.html,
        summary_txt=written.summary,
        nodes=sim_cfg.nodes,
        days=sim_cfg.days,
        seed=sim_cfg.seed,
        jobs=sim.jobs,
        job_instances=sim.instances,
        injected_failures=sim.failures,
        rf_true_per_1000=_true_rf_per_1000(truth, sim.rf_true),
        rf_est_per_1000=rf.r_f * 1000,
        rf_ci_per_1000=(rf.ci_low * 1000, rf.ci_high * 1000),
        rf_failures=rf.failures,
        rf_node_days=rf.node_days,
        lemons_planted=sorted(truth["lemon_nodes"]),
        lemons_found=found,
        step_seconds=timings,
        failslow={**act.to_dict(), "lines": act.lines()},
        qualification=qualification,
    )


def _qualification_lines(seed: int) -> list[str]:
    from rsc_health.sim.qualify_fleet import demo_lines

    return demo_lines(seed)


def _true_rf_per_1000(truth: dict, fallback: float) -> float:
    """The rate the estimate should recover: failures per node-day as the simulator injected
    them on healthy nodes (lemons fail more often, so the fleet-wide rate is a little higher)."""
    for key in ("rf_true_fleet", "rf_true"):
        if key in truth:
            return float(truth[key]) * 1000
    return fallback * 1000
