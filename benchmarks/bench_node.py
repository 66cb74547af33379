"""A full `healthctl check` of the 8-GPU healthy fixture against a bare `python -c pass`,
measured in the same run: wall and CPU time (medians over --repeat runs, and their ratios), and
the check's peak RSS. Targets (issue 2): at most 3x a bare interpreter start, under 60 MB.

    python3 benchmarks/bench_node.py [--repeat 15]

Prints a human summary and `BENCH<TAB>name<TAB>metric<TAB>value<TAB>unit` lines for
benchmarks/run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.fixtures
from tests.fixtures.nodes.node_copy import copy_node  # noqa: E402


def measure(argv: list[str]) -> tuple[float, float, float, int]:
    """(wall s, cpu s, peak RSS MiB, exit code) of one child process, from its own rusage."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")  # benchmarks/run --quick
    ap.add_argument("--repeat", type=int, default=3 if quick else 15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "node"
        copy_node(root)
        check = [sys.executable, "-m", "rsc_health.cli", "--root", str(root),
                 "--config", str(root / "config.toml"), "check"]
        bare = [sys.executable, "-c", "pass"]
        rc = measure(check)[3]  # warm the page cache and the state files
        if rc != 0:
            sys.exit(f"check of the healthy fixture exited {rc}")
        runs = {"bare": [], "check": []}
        for _ in range(args.repeat):  # interleaved, so load drifts hit both alike
            runs["bare"].append(measure(bare))
            runs["check"].append(measure(check))
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v),
               max(r[2] for r in v)) for k, v in runs.items()}
    wall_ratio = med["check"][0] / med["bare"][0]
    cpu_ratio = med["check"][1] / med["bare"][1]
    print(f"bare python -c pass : wall {med['bare'][0] * 1000:7.1f} ms  cpu "
          f"{med['bare'][1] * 1000:7.1f} ms  rss {med['bare'][2]:5.1f} MiB")
    print(f"healthctl check     : wall {med['check'][0] * 1000:7.1f} ms  cpu "
          f"{med['check'][1] * 1000:7.1f} ms  rss {med['check'][2]:5.1f} MiB")
    print(f"ratio check/bare    : wall {wall_ratio:.2f}x  cpu {cpu_ratio:.2f}x "
          f"(target <= 3x; RSS target < 60 MiB)")
    for metric, value, unit in (
        ("bare_wall", med["bare"][0] * 1000, "ms"),
        ("check_wall", med["check"][0] * 1000, "ms"),
        ("check_cpu", med["check"][1] * 1000, "ms"),
        ("wall_ratio", wall_ratio, "x"),
        ("cpu_ratio", cpu_ratio, "x"),
        ("check_peak_rss", med["check"][2], "MiB"),
    ):
        print(f"BENCH\tnode\t{metric}\t{value:.2f}\t{unit}")


if __name__ == "__main__":
    main()
