#!/usr/bin/env python3
"""The historian exporter's fleet telemetry and suspect metrics at fleet scale: series and
bytes of the exposition, and the seconds `build` takes, for N nodes sweeping every 5 minutes
(the last hour of samples held, as the 3-day retention holds far more) with 0.5% of them
suspect, against a tenth of the fleet in the same run (the series must not grow with it).

    python3 benchmarks/bench_exporter_telemetry.py [--nodes 16000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402

from rsc_health.config import load_config  # noqa: E402
from rsc_health.exporter.historian import build, exposition  # noqa: E402
from rsc_health.historian import db, schema  # noqa: E402
from rsc_health.historian import suspects as hs  # noqa: E402
from rsc_health.historian.failslow.evidence import SuspectEvidence  # noqa: E402
from rsc_health.model import Metric  # noqa: E402


def fleet(path: Path, nodes: int, now: datetime) -> None:
    eng = create_engine(f"sqlite:///{path}")
    db.create(eng)
    names = [c.name for c in schema.telemetry_samples.columns]
    with eng.begin() as conn:
        for k in range(12):  # an hour of sweeps
            t = now - timedelta(minutes=5 * k + 1)
            rows = []
            for i in range(nodes):
                row = {"time": t, "node": f"node{i:05d}"}
                for j, m in enumerate(Metric):
                    row[m.value] = ((i * 31 + j * 7 + k) % 97) / 97.0
                    row[f"{m.value}_c"] = f"gpu{(i + j) % 8}"
                rows.append({n: row.get(n) for n in names})
            conn.execute(schema.telemetry_samples.insert(), rows)
    ev = [SuspectEvidence(node=f"node{i:05d}", metric="sm_clock_ratio", value=0.6,
                          peer_median=0.97, deviation=9.0, since=now - timedelta(hours=1),
                          last=now, job_ids=("1",), source="telemetry", detail="")
          for i in range(0, nodes, 200)]
    hs.record(eng, ev, now, expire_after=timedelta(hours=24))
    eng.dispose()


def measure(path: Path, now: datetime) -> tuple[int, int, int, int, float]:
    """(series in all, fleet telemetry and suspect aggregate series, per-node suspect series,
    bytes, seconds)."""
    eng = create_engine(f"sqlite:///{path}")
    cfg = load_config(os.devnull)
    t0 = time.perf_counter()
    text = exposition(build(eng, cfg, now)).decode()
    took = time.perf_counter() - t0
    eng.dispose()
    series = telemetry = per_node = 0
    for fam in text_string_to_metric_families(text):
        series += len(fam.samples)
        if fam.name.startswith(("rsc_health_telemetry_", "rsc_health_suspect_")):
            telemetry += len(fam.samples)
        if fam.name == "rsc_health_node_suspect":
            per_node += len(fam.samples)
    return series, telemetry, per_node, len(text.encode()), took


def main() -> int:
    quick = os.environ.get("RSC_BENCH_QUICK") == "1"
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=800 if quick else 16000)
    args = ap.parse_args()
    now = datetime.utcnow().replace(microsecond=0)
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for n in (args.nodes // 10, args.nodes):
            path = Path(tmp) / f"h{n}.db"
            fleet(path, n, now)
            if not out:
                measure(path, now)  # the first export in a process pays its imports
            out[n] = measure(path, now)
            series, agg, per_node, size, took = out[n]
            print(f"{n} nodes: {series} series in all; fleet telemetry and suspect aggregates "
                  f"{agg}, per-node suspect series {per_node} ({n // 200 + (n % 200 > 0)} "
                  f"suspects); {size} bytes; build {took:.2f} s (the whole export)")
        small, big = out[args.nodes // 10], out[args.nodes]
        print(f"BENCH\texporter_telemetry\t{args.nodes}_nodes_aggregate_series\t{big[1]}\tseries")
        print(f"BENCH\texporter_telemetry\t{args.nodes}_nodes_per_node_series\t{big[2]}\tseries")
        print(f"BENCH\texporter_telemetry\t{args.nodes}_nodes_build\t{big[4]:.2f}\ts")
        print(f"BENCH\texporter_telemetry\taggregate_series_10x_fleet\t"
              f"{big[1] / max(1, small[1]):.2f}\tratio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
