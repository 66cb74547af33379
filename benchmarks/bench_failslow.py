#!/usr/bin/env python3
"""Fail-slow detection on simulated fleets (rsc_health/sim/failslow.py): F1 per (job, node),
flags on workload-imbalance jobs, detection delay from onset, over tuning seeds and a held-out
seed set the defaults were never tuned on (issue 25's targets: F1 >= 0.95, 0 flags on
imbalance jobs, delay <= 10 minutes).

Scoring (Minder's, per machine): a faulty (job, node) whose suspect run was confirmed at or
after its onset is a true positive, its delay confirmed - onset; any other flagged (job, node)
is a false positive (a faulty node flagged only before its onset counts as both FP and FN).

    python3 benchmarks/bench_failslow.py [--jobs 120] [--seeds 0-4] [--held-out 101-110]
                                         [--config SITE.toml]   # a site file on the defaults
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import pandas as pd  # noqa: E402

from rsc_health.config import load_config  # noqa: E402
from rsc_health.historian.failslow.core import (  # noqa: E402
    Rules,
    find_runs,
    fleet_rates,
    judged,
)
from rsc_health.sim.failslow import FailSlowConfig, simulate_failslow  # noqa: E402

sys.path.insert(0, str(HERE))
from _pai_minibatch import JOBS as PAI_JOBS  # noqa: E402
from _pai_minibatch import step_frame as pai_frame  # noqa: E402
from _straggler_traces import TRACES, nvrx_frame, step_frame  # noqa: E402

# The telemetry metric that sees each injected kind first (its false positives are reported
# beside the kind's recall).
KIND_METRIC = {"hw_slowdown": "throttle_hw_frac", "pcie_x8": "pcie_link_ratio",
               "ib_congested": "ib_xmit_wait_rate", "thermal": "throttle_hw_frac",
               "nvlink_degraded": "nvlink_data_rate", "ib_port_errors": "ib_error_rate"}


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def two_sweep_bound(fleet, obs: pd.DataFrame) -> int:
    """Injected faults that any two-sweep detector on these lines could confirm within 10
    minutes of onset: two samples in a row past the line (job-wide slots included, the bound
    knows which node is faulty, and slots the job's median went past the node in, past the
    line of the slot before: `overtaken`, held with `job_wide`) on the kind's telemetry metric
    or the step times, the second taken within 10 minutes of the onset."""
    truth = fleet.truth.assign(onset=pd.to_datetime(fleet.truth["onset"]))
    metric = truth["kind"].map(KIND_METRIC)
    keys = pd.concat([truth.assign(metric=metric), truth.assign(metric="step_seconds")])
    o = obs.loc[obs["outlier"] | obs["job_wide"], ["job_id", "node", "metric", "slot", "time"]]
    o = o.merge(keys[["job_id", "node", "metric", "onset"]], on=["job_id", "node", "metric"])
    o = o[pd.to_datetime(o["time"]) >= o["onset"]].sort_values(["job_id", "node", "metric",
                                                                  "slot"])
    same = (o[["job_id", "node", "metric"]] == o[["job_id", "node", "metric"]].shift()).all(axis=1)
    second = o[same & (o["slot"] - o["slot"].shift() == 1)]
    soon = second[(pd.to_datetime(second["time"]) - second["onset"])
                  <= pd.Timedelta(minutes=10)]
    return int(soon[["job_id", "node"]].drop_duplicates().shape[0])


def score(fleet, runs: pd.DataFrame, obs: pd.DataFrame | None = None) -> dict:
    truth = fleet.truth
    flagged = (runs.groupby(["job_id", "node"])["confirmed"].min().rename("confirmed")
               if not runs.empty else pd.Series(dtype="datetime64[ns]", name="confirmed"))
    flagged = flagged.reset_index() if len(flagged) else pd.DataFrame(
        columns=["job_id", "node", "confirmed"])
    # a faulty node's detection: its earliest run confirmed at or after onset
    after = runs.merge(truth, on=["job_id", "node"])
    after = after[pd.to_datetime(after["confirmed"]) >= pd.to_datetime(after["onset"])]
    first = after.groupby(["job_id", "node"]).agg(confirmed=("confirmed", "min"),
                                                  onset=("onset", "first"),
                                                  kind=("kind", "first")).reset_index()
    tp = len(first)
    fn = len(truth) - tp
    keys_tp = set(zip(first["job_id"], first["node"], strict=True))
    fp = sum(1 for k in zip(flagged["job_id"], flagged["node"], strict=True) if k not in keys_tp)
    delays = ((pd.to_datetime(first["confirmed"]) - pd.to_datetime(first["onset"]))
              .dt.total_seconds() / 60.0)
    imb_jobs = set(fleet.jobs.loc[fleet.jobs["kind"] == "imbalance", "job_id"])
    imb_flags = int(flagged["job_id"].isin(imb_jobs).sum())
    missed = truth.merge(first[["job_id", "node"]], how="left", indicator=True)
    missed = missed[missed["_merge"] == "left_only"]["kind"].value_counts().to_dict()
    fp_metrics = {}
    if not runs.empty:
        fpr = runs[[k not in keys_tp for k in zip(runs["job_id"], runs["node"], strict=True)]]
        fp_metrics = fpr["metric"].value_counts().to_dict()
    # false flags and the healthy node-sweeps judged, by job kind: the same rate on every kind
    # says a flag is chance, not the kind's spread
    kinds = fleet.jobs.set_index("job_id")["kind"]
    fp_keys = flagged[[k not in keys_tp for k in zip(flagged["job_id"], flagged["node"],
                                                     strict=True)]]
    fp_kind = fp_keys["job_id"].map(kinds).value_counts().to_dict()
    sweeps_kind: dict = {}
    if obs is not None and len(obs):
        ns = obs[["job_id", "node", "slot"]].drop_duplicates()
        bad = set(zip(truth["job_id"], truth["node"], strict=True))
        ns = ns[[k not in bad for k in zip(ns["job_id"], ns["node"], strict=True)]]
        sweeps_kind = ns["job_id"].map(kinds).value_counts().to_dict()
    return {"tp": tp, "fp": fp, "fn": fn, "delays": delays.tolist(), "imb_flags": imb_flags,
            "bound": two_sweep_bound(fleet, obs) if obs is not None else 0,
            "fp_kind": fp_kind, "sweeps_kind": sweeps_kind,
            "imb_jobs": len(imb_jobs), "missed": missed, "fp_metrics": fp_metrics,
            "injected": truth["kind"].value_counts().to_dict(),
            "found": first["kind"].value_counts().to_dict(),
            "late": first.loc[(delays > 10).to_numpy(), "kind"].value_counts().to_dict()}


def explain(seed: int, fleet, obs: pd.DataFrame, runs: pd.DataFrame) -> None:
    """--list: each false-positive run and each detection past 10 minutes, with the node's
    slots in its metric (value, peers' median, line, outlier/job-wide) to name its class."""
    truth = fleet.truth.assign(onset=pd.to_datetime(fleet.truth["onset"]))
    jobs = fleet.jobs.set_index("job_id")
    if runs.empty:
        return
    m = runs.merge(truth, on=["job_id", "node"], how="left")
    tp = m["onset"].notna() & (pd.to_datetime(m["confirmed"]) >= m["onset"])
    good = set(zip(m.loc[tp, "job_id"], m.loc[tp, "node"], strict=True))

    def slots(job: str, node: str, metric: str) -> str:
        o = obs[(obs["job_id"] == job) & (obs["node"] == node) & (obs["metric"] == metric)]
        o = o.sort_values("slot")
        s0 = obs.loc[obs["job_id"] == job, "slot"].min()
        return " ".join(f"{int(r.slot - s0)}:{r.value:.3g}/{r.median:.3g}/{r.line:.2g}"
                        f"{'*' if r.outlier else '~' if r.job_wide else ''}"
                        f"{'[' + str(r.component) + ']' if r.outlier else ''}"
                        for r in o.itertuples())

    for r in m[~tp].itertuples():
        if (r.job_id, r.node) in good:
            continue
        j = jobs.loc[r.job_id]
        print(f"  FP seed {seed} job {r.job_id} ({j['kind']}, {j['nodes']} nodes, pp {j['pp']}, "
              f"{j['shift'] or 'no shift'}) {r.node} {r.metric} [{r.component}] "
              f"{r.slots} slots dev {r.deviation:.1f}: {slots(r.job_id, r.node, r.metric)}")
    first = m[tp].sort_values("confirmed").drop_duplicates(["job_id", "node"])
    for r in first.itertuples():
        delay = (pd.Timestamp(r.confirmed) - r.onset).total_seconds() / 60
        if delay <= 10:
            continue
        j = jobs.loc[r.job_id]
        s0 = obs.loc[obs["job_id"] == r.job_id, "slot"].min()
        on = int(r.onset.value // (300 * 10**9) - s0)
        print(f"  LATE seed {seed} job {r.job_id} ({j['nodes']} nodes, {j['shift'] or 'no shift'})"
              f" {r.node} {r.kind} onset slot {on} {delay:.1f} min via {r.metric}: "
              f"{slots(r.job_id, r.node, KIND_METRIC.get(r.kind, r.metric))}")


def from_start(rules: Rules, seeds: list[int], jobs: int) -> None:
    """--from-start: the held-out fleets with every fault on from its job's first sweep (the
    node was slow before the job: no onset inside it). What the sweeps alone find of that
    class, by kind (across jobs: bench_failslow_recurring.py)."""
    found: dict[str, list[int]] = {}
    for seed in seeds:
        fleet = simulate_failslow(FailSlowConfig(jobs=jobs, seed=seed, from_start=True))
        runs = find_runs(judged(fleet.samples, fleet.membership, fleet.steps, rules), rules)
        hit = set(zip(runs["job_id"], runs["node"], strict=True)) if len(runs) else set()
        for t in fleet.truth.itertuples():
            n = found.setdefault(str(t.kind), [0, 0])
            n[0] += (t.job_id, t.node) in hit
            n[1] += 1
    total = [sum(v[0] for v in found.values()), sum(v[1] for v in found.values())]
    print(f"from the start (seeds {seeds[0]}-{seeds[-1]}): the sweeps find {total[0]} of "
          f"{total[1]} ({total[0] / max(1, total[1]):.3f})")
    for kind, (hit_n, n) in sorted(found.items()):
        print(f"  {kind}: {hit_n} of {n}")
        print(f"BENCH\tfailslow\tfrom_start_recall_{kind}\t{hit_n / max(1, n):.3f}\tratio")


def run(seeds: list[int], jobs: int, rules: Rules, listing: bool = False) -> dict:
    tot = {"tp": 0, "fp": 0, "fn": 0, "delays": [], "imb_flags": 0, "imb_jobs": 0, "bound": 0,
           "missed": {}, "fp_metrics": {}, "injected": {}, "found": {}, "late": {}, "nodes": 0,
           "fp_kind": {}, "sweeps_kind": {}, "seconds": 0.0, "rates": {}}
    for seed in seeds:
        fleet = simulate_failslow(FailSlowConfig(jobs=jobs, seed=seed))
        t0 = time.perf_counter()
        obs = judged(fleet.samples, fleet.membership, fleet.steps, rules)
        runs = find_runs(obs, rules)
        tot["seconds"] += time.perf_counter() - t0
        if listing:
            explain(seed, fleet, obs, runs)
        for r in fleet_rates(obs, rules):  # what `fleet_chance` read: excursions, judged
            seen = tot["rates"].setdefault(r.metric, [0, 0, r.fleet_chance])
            seen[0] += r.excursions
            seen[1] += r.judged
        s = score(fleet, runs, obs)
        for k in ("tp", "fp", "fn", "imb_flags", "imb_jobs", "bound"):
            tot[k] += s[k]
        tot["delays"] += s["delays"]
        tot["nodes"] += len(fleet.membership)
        for k in ("missed", "fp_metrics", "injected", "found", "late", "fp_kind", "sweeps_kind"):
            for m, c in s[k].items():
                tot[k][m] = tot[k].get(m, 0) + c
    p = tot["tp"] / (tot["tp"] + tot["fp"]) if tot["tp"] + tot["fp"] else 0.0
    r = tot["tp"] / (tot["tp"] + tot["fn"]) if tot["tp"] + tot["fn"] else 0.0
    tot.update(precision=p, recall=r, f1=2 * p * r / (p + r) if p + r else 0.0)
    d = pd.Series(tot["delays"], dtype=float)
    tot.update(delay_median=float(d.median()) if len(d) else float("nan"),
               delay_max=float(d.max()) if len(d) else float("nan"),
               delay_over_10=int((d > 10).sum()))
    return tot


def main() -> int:
    quick = os.environ.get("RSC_BENCH_QUICK") == "1"
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=40 if quick else 120)
    ap.add_argument("--seeds", default="0-1" if quick else "0-4", help="tuning seeds")
    ap.add_argument("--held-out", default="101-102" if quick else "101-110")
    ap.add_argument("--list", action="store_true",
                    help="print each false-positive run and each detection past 10 minutes")
    ap.add_argument("--no-traces", action="store_true", help="skip the real traces and scale")
    ap.add_argument("--renewal", action="store_true",
                    help="only the sliding-window renewal of evidence (minutes)")
    ap.add_argument("--from-start", action="store_true",
                    help="only: recall by kind with every fault on from its job's first sweep")
    ap.add_argument("--config", default=None,
                    help="a site config file (e.g. a [failslow.metrics.*] table to measure); "
                         "load_config's own when absent")
    args = ap.parse_args()
    rules = Rules.from_config(load_config(args.config))
    if args.renewal:
        renewal(rules)
        return 0
    if args.from_start:
        from_start(rules, _seeds(args.held_out), args.jobs)
        return 0
    for name, seeds in (("tuning", _seeds(args.seeds)), ("held_out", _seeds(args.held_out))):
        t = run(seeds, args.jobs, rules, args.list)
        print(f"{name}: seeds {seeds[0]}-{seeds[-1]}, {len(seeds) * args.jobs} jobs, "
              f"{t['nodes']} job-nodes, {t['tp'] + t['fn']} injected: "
              f"P {t['precision']:.3f} R {t['recall']:.3f} F1 {t['f1']:.3f} "
              f"(tp {t['tp']} fp {t['fp']} fn {t['fn']}); imbalance-job flags {t['imb_flags']} "
              f"in {t['imb_jobs']} jobs; delay median {t['delay_median']:.1f} min, max "
              f"{t['delay_max']:.1f}, over 10 min {t['delay_over_10']}; detector "
              f"{t['seconds']:.1f} s")
        injected = t["tp"] + t["fn"]
        soon = len(t["delays"]) - t["delay_over_10"]
        print(f"  within 10 min of onset: {soon} of {injected} injected ({soon / injected:.3f}); "
              f"the two-sweep bound on these lines (two samples in a row past the line, job-wide "
              f"or not, the second within 10 min): {t['bound']} ({t['bound'] / injected:.3f})")
        print("  the fleet's own one-sweep excursions (healthy and not) per judged node-sweep: "
              + ", ".join(f"{m}{' (fleet_chance)' if on else ''} {100 * e / max(1, n):.2f}%"
                          for m, (e, n, on) in sorted(t["rates"].items())))
        print(f"BENCH\tfailslow\t{name}_within_10min_of_bound\t"
              f"{soon / max(1, t['bound']):.3f}\tratio")
        rates = {k: 1e5 * t["fp_kind"].get(k, 0) / n for k, n in sorted(t["sweeps_kind"].items())
                 if n}
        print("  false flags per 100,000 healthy node-sweeps, by job kind: " + ", ".join(
            f"{k} {r:.1f} ({t['fp_kind'].get(k, 0)} in {t['sweeps_kind'][k]})"
            for k, r in rates.items()))
        every = sum(t["sweeps_kind"].values())
        if every:
            per_day = 16000 * 288 * t["fp"] / every
            print(f"  at that rate a 16,000-node fleet, every node in a judged job all day, "
                  f"would see {per_day:.0f} false suspects a day")
            print(f"BENCH\tfailslow\t{name}_false_suspects_per_day_16k\t{per_day:.0f}\tnodes")
        if t["missed"]:
            print(f"  missed by kind: {t['missed']}")
        if t["fp_metrics"]:
            print(f"  false-positive runs by metric: {t['fp_metrics']}")
        # per kind: recall (found / injected) and the false positives of the metric that
        # judges it (runs on healthy (job, node)s)
        for kind, n_in in sorted(t["injected"].items()):
            found = t["found"].get(kind, 0)
            fp = t["fp_metrics"].get(KIND_METRIC.get(kind, ""), 0)
            late = t["late"].get(kind, 0)
            print(f"  {kind}: recall {found}/{n_in} = {found / n_in:.3f}, "
                  f"{KIND_METRIC.get(kind)} false-positive runs {fp}, found past 10 min {late}")
            print(f"BENCH\tfailslow\t{name}_recall_{kind}\t{found / n_in:.3f}\tratio")
            print(f"BENCH\tfailslow\t{name}_fp_{KIND_METRIC.get(kind)}\t{fp}\truns")
        print(f"BENCH\tfailslow\t{name}_f1\t{t['f1']:.3f}\tratio")
        print(f"BENCH\tfailslow\t{name}_precision\t{t['precision']:.3f}\tratio")
        print(f"BENCH\tfailslow\t{name}_recall\t{t['recall']:.3f}\tratio")
        print(f"BENCH\tfailslow\t{name}_imbalance_flags\t{t['imb_flags']}\tflags")
        print(f"BENCH\tfailslow\t{name}_delay_max\t{t['delay_max']:.1f}\tmin")
        print(f"BENCH\tfailslow\t{name}_within_10min\t"
              f"{1 - t['delay_over_10'] / max(1, len(t['delays'])):.3f}\tratio")
    if args.no_traces:
        return 0
    real_traces(rules)
    pai_traces(rules)
    scale(rules, 1600 if quick else 16000)
    return 0


def renewal(rules: Rules, seed: int = 3, jobs: int = 60) -> None:
    """--renewal: the detector as the suspects timer runs it, a 60-minute window every 5
    minutes over 8-10-hour jobs, with and without the open episodes' nodes (each node found in
    an earlier window): of the windows 15 minutes or more after a fault's onset while its job
    runs, the share that still gives that node evidence, by time since onset and kind, and
    the healthy (job, node)s ever flagged."""
    cfg = FailSlowConfig(jobs=jobs, seed=seed, sweeps=(96, 120), fault_share=0.6,
                         imbalance_share=0.2, start_within_s=3600)
    fleet = simulate_failslow(cfg)
    samples = fleet.samples.assign(time=pd.to_datetime(fleet.samples["time"]))
    steps = fleet.steps.assign(time=pd.to_datetime(fleet.steps["time"]))
    members = fleet.membership.assign(start=pd.to_datetime(fleet.membership["start"]),
                                      end=pd.to_datetime(fleet.membership["end"]))
    truth = fleet.truth.assign(onset=pd.to_datetime(fleet.truth["onset"]))
    ends = members.groupby("job_id")["end"].max()
    faulty = set(zip(truth["job_id"], truth["node"], strict=True))
    window, step = pd.Timedelta(minutes=60), pd.Timedelta(minutes=5)
    bands = ((60, "15-60 min"), (120, "1-2 h"), (240, "2-4 h"), (float("inf"), "4 h+"))
    for memory in (False, True):
        seen: dict = {}
        known: set = set()
        false: set = set()
        t, last = samples["time"].min() + window, samples["time"].max() + step
        while t <= last:
            s = samples[(samples["time"] >= t - window) & (samples["time"] < t)]
            st = steps[(steps["time"] >= t - window) & (steps["time"] <= t)]
            m = members[(members["start"] <= t) & (members["end"] >= t - window)]
            sus = known if memory else set()
            runs = find_runs(judged(s, m, st if len(st) else None, rules, sus), rules, sus)
            flagged = set(zip(runs["job_id"], runs["node"], strict=True))
            false |= flagged - faulty
            known |= {n for _, n in flagged}
            for r in truth.itertuples():
                if r.onset + pd.Timedelta(minutes=15) <= t <= ends[r.job_id]:
                    age = (t - r.onset).total_seconds() / 60
                    band = next(name for top, name in bands if age < top)
                    hit, n = seen.get((r.kind, band), (0, 0))
                    seen[(r.kind, band)] = (hit + ((r.job_id, r.node) in flagged), n + 1)
            t += step
        name = "with the open episodes" if memory else "without"
        for kind in sorted({k for k, _ in seen}):
            parts = [f"{band} {seen[(kind, band)][0]}/{seen[(kind, band)][1]}"
                     for _, band in bands if (kind, band) in seen]
            print(f"renewal {name}: {kind}: " + ", ".join(parts))
        print(f"renewal {name}: healthy (job, node)s ever flagged: {len(false)}")
        hit = sum(v[0] for (k, b), v in seen.items() if b != "15-60 min")
        n = sum(v[1] for (k, b), v in seen.items() if b != "15-60 min")
        slug = "memory" if memory else "no_memory"
        print(f"BENCH\tfailslow\trenewal_past_60min_{slug}\t{hit / max(1, n):.3f}\tratio")


def scale(rules: Rules, nodes: int) -> None:
    """One detector call at fleet scale: every node in a 64-node job, an hour of telemetry
    (12 sweeps x 12 metrics), what `detect` judges each time the suspect tier calls it."""
    fleet = simulate_failslow(FailSlowConfig(jobs=nodes // 64, sizes=(64,), size_weights=(1.0,),
                                             sweeps=(12, 12), seed=7, steps_share=0.0))
    t0 = time.perf_counter()
    runs = find_runs(judged(fleet.samples, fleet.membership, None, rules), rules)
    took = time.perf_counter() - t0
    print(f"scale: {nodes} nodes, {len(fleet.samples)} samples (an hour): detector {took:.1f} s, "
          f"{runs['node'].nunique()} suspects")
    print(f"BENCH\tfailslow\tdetect_{nodes}_nodes_hour\t{took:.1f}\ts")
    big_job_shift(rules, 400 if os.environ.get("RSC_BENCH_QUICK") == "1" else 4000)


def big_job_shift(rules: Rules, nodes: int) -> None:
    """One job of `nodes` nodes, 30% of them congested together for six sweeps (a leaf
    switch's event), an hour: every mover was paired with every node (2,000 nodes took 57 s
    and 3.3 GB before `_past_allowed_alone`). Time and peak memory the detector allocates."""
    import tracemalloc

    import numpy as np

    rng = np.random.default_rng(0)
    names = [f"n{i:05d}" for i in range(nodes)]
    wait = 1e6 * np.exp(rng.normal(0, 0.25, (nodes, 12)))
    wait[: int(0.3 * nodes), 4:10] *= 8
    t0 = pd.Timestamp("2026-11-26 10:00")
    phase = rng.integers(5, 290, nodes)
    samples = pd.DataFrame({
        "node": np.repeat(names, 12),
        "time": [t0 + pd.Timedelta(seconds=60 + 300 * s + int(phase[i]))
                 for i in range(nodes) for s in range(12)],
        "metric": "ib_xmit_wait_rate", "value": wait.ravel(), "component": "mlx5_0/1"})
    members = pd.DataFrame({"job_id": "big", "node": names, "start": t0,
                            "end": t0 + pd.Timedelta(hours=2)})
    began = time.perf_counter()
    runs = find_runs(judged(samples, members, None, rules), rules)
    took = time.perf_counter() - began
    tracemalloc.start()  # a second call, traced (tracing slows it several times)
    find_runs(judged(samples, members, None, rules), rules)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(f"big job: {nodes} nodes, 30% moving together for 6 sweeps: detector {took:.1f} s, "
          f"peak {peak:.0f} MiB allocated, {runs['node'].nunique() if len(runs) else 0} suspects")
    print(f"BENCH\tfailslow\tbig_job_{nodes}_shift\t{took:.1f}\ts")
    print(f"BENCH\tfailslow\tbig_job_{nodes}_shift_peak\t{peak:.0f}\tMiB")


def real_traces(rules: Rules) -> None:
    """ByteDance's real per-rank traces (tests/fixtures/failslow/bytedance-straggler): AR's
    one slowed worker should be the only suspect, SE (sequence lengths) and ST (a long last
    stage) should have none, with and without the pipeline stage known, and as NVRx's relative
    scores (written by rsc_health/nvrx_lines.py, read by the ingest's parser)."""
    for trace, what in TRACES.items():
        steps, members = step_frame(trace, rules.slot_s)
        nvrx_steps, nvrx_members = nvrx_frame(trace, rules.slot_s)
        for label, m, s in (("stage known", members, steps),
                            ("no stage", members.drop(columns="stage"), steps.assign(stage="")),
                            ("as NVRx scores", nvrx_members, nvrx_steps)):
            obs = judged(None, m, s, rules)
            runs = find_runs(obs, rules)
            flagged = sorted(set(runs["node"]))
            print(f"real trace {trace} ({what}), {label}: {m['node'].nunique()} workers, "
                  f"{len(obs)} worker-steps judged, suspects {flagged or 'none'}")
            slug = f"{trace}_{label.replace(' ', '_')}"
            print(f"BENCH\tfailslow\treal_{slug}_suspects\t{len(flagged)}\tnodes")


def pai_traces(rules: Rules) -> None:
    """Alibaba PAI's real per-worker mini-batch times (benchmarks/_pai_minibatch.py), held out:
    never tuned on. The release labels them only in words (job 1: worker 6 emerges as a
    straggler mid-training; job 2: stable, workers at different times; jobs 3, 4: several
    stragglers), so the suspects are printed beside those words, not scored."""
    for job, what in PAI_JOBS.items():
        steps, members = pai_frame(job, rules.slot_s)
        obs = judged(None, members, steps, rules)
        runs = find_runs(obs, rules)
        flagged = sorted(set(runs["node"]))
        since = {n: str(pd.Timestamp(r["since"].min()) - pd.Timestamp(members["start"].iloc[0]))
                 for n, r in runs.groupby("node")}
        print(f"real trace PAI job {job} ({what}): {members['node'].nunique()} workers, "
              f"{obs['slot'].nunique() if len(obs) else 0} slots, suspects "
              f"{[f'{n} from +{since[n]}' for n in flagged] or 'none'}")
        print(f"BENCH\tfailslow\treal_pai_job{job}_suspects\t{len(flagged)}\tnodes")


if __name__ == "__main__":
    sys.exit(main())
