"""Lemon verdicts on LANL's public failure data (22 systems whose failure rates differ
fifty-fold, 1996-2005; _lanl.py), imported as an operator would (`ingest inventory`, then
`ingest events --tz America/Denver`; then again with the outages imported as tickets
too), scored at year ends against _lanl.reference (each node
against its own system's rate). Same table and BENCH lines as bench_lemons_titan.py.

    python3 benchmarks/bench_lemons_lanl.py [--rate-window 90,365]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _lanl  # noqa: E402
import bench_lemons_titan as bench  # noqa: E402

from rsc_health.historian.lemons.verdicts import LemonRules  # noqa: E402

DATES = ",".join(f"{y}-01-01" for y in range(1998, 2006))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dates", default=DATES)
    ap.add_argument("--rate-window", default="90,365")
    args = ap.parse_args(argv)
    frame = _lanl.read()
    dates = [datetime.fromisoformat(d) for d in args.dates.split(",")]
    base = LemonRules.from_config()
    rules = {
        "defaults": base,
        "rate only": LemonRules(
            {k: (v if k == "rate_surprise" else 0.0) for k, v in base.thresholds.items()},
            min_signals=99, strong=("rate_surprise",)),
        "paper rules": LemonRules.from_config({"rate_surprise": 0, "peer_q": 1.0}),
    }
    with tempfile.TemporaryDirectory() as tmp:
        paths = _lanl.write_imports(frame, Path(tmp))
        for with_tickets in (False, True):
            what = "events+tickets" if with_tickets else "events"
            url = f"sqlite:///{tmp}/lanl{int(with_tickets)}.db"
            t0 = time.perf_counter()
            bench.load(url, paths, "events", tz=_lanl.TZ, with_tickets=with_tickets)
            print(f"lanl {what}: loaded in {time.perf_counter() - t0:.1f} s")
            for w in (float(x) for x in args.rate_window.split(",")):
                bench.report(f"lanl_{what.replace('+', '_')}_w{w:g}",
                             bench.score(url, frame, dates, rules, w, reference=_lanl.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
