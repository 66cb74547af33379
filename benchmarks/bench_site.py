"""What site checks cost the prolog: the healthy fixture node's prolog with the `site` family
off (the default), with one trivial site check, and with the NHC adapter running a stand-in
`nhc` that passes, each against a bare `python -c pass` in the same run; and a site check that
hangs, against the prolog's budget.

    python3 benchmarks/bench_site.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.fixtures, tests.node.site_fakes
from bench_prolog import timed  # noqa: E402  (a sibling script: benchmarks/ is sys.path[0])

from tests.fixtures.nodes.node_copy import copy_node  # noqa: E402
from tests.node.site_fakes import fake_nhc, program  # noqa: E402

FAMILIES = '["gpu", "xid", "ecc", "remap", "mount", "infiniband", "site"]'


def setups(tmp: Path) -> dict[str, Path]:
    """name -> site config of a node root prepared for it."""
    out = {}
    for name, site in (
        ("off", ""),
        ("one check", '[site]\nchecks_dir = "/etc/rsc_health/site.d"\n'),
        ("nhc adapter", '[site]\nnhc_conf = "/etc/nhc/nhc.conf"\n'),
        ("hung check", '[site]\nchecks_dir = "/etc/rsc_health/site.d"\ntimeout_s = 60\n'),
    ):
        root = copy_node(tmp / name.replace(" ", "_"))
        program(root / "etc/rsc_health/site.d", "scratch", "#!/bin/sh\n"
                "echo 'ok none /scratch scratch_ok mounted'\n")
        if name == "hung check":
            program(root / "etc/rsc_health/site.d", "hang", "#!/bin/sh\nexec sleep 300\n")
        fake_nhc(root, "pass")
        config = root / "site.toml"
        slurm = f"[slurm]\nprolog_families = {FAMILIES}\nprolog_budget_s = 10\n"
        config.write_text((root / "config.toml").read_text() + "\n" + site + slurm)
        out[name] = config
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("RSC_BENCH_QUICK", "") not in ("", "0")
    ap.add_argument("--runs", type=int, default=3 if quick else 15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        configs = setups(Path(tmp))
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        base.update(SLURMD_NODENAME="bench01", PYTHONPATH=str(REPO), SLURM_JOB_ID="4242")
        envs = {name: dict(base, RSC_HEALTH_ROOT=str(cfg.parent), RSC_HEALTH_CONFIG=str(cfg))
                for name, cfg in configs.items()}
        prolog = [sys.executable, "-m", "rsc_health.nodepath", "prolog"]
        fast = [n for n in envs if n != "hung check"]
        for name in fast:
            timed(prolog, envs[name])  # warm caches
        times: dict[str, list[float]] = {name: [] for name in fast}
        bare: list[float] = []
        for _ in range(args.runs):  # interleaved so load changes hit all alike
            bare.append(timed([sys.executable, "-c", "pass"], base))
            for name in fast:
                times[name].append(timed(prolog, envs[name]))
        hung = timed(prolog, envs["hung check"])
    b = statistics.median(bare)
    off = statistics.median(times["off"])
    print(f"python -c pass          : median {b * 1000:7.1f} ms")
    for name in fast:
        m = statistics.median(times[name])
        print(f"prolog, site {name:<11}: median {m * 1000:7.1f} ms  {m / b:.2f}x bare, "
              f"{m / off:.2f}x site off")
        if name != "off":
            print(f"BENCH\tsite\tprolog site {name} / site off\t{m / off:.2f}\tx")
    print(f"prolog, a hung check    : {hung:.2f} s (budget 10 s: {hung / 10:.0%} of it; checks "
          f"get half, site programs stop at 90% of that)")
    print(f"BENCH\tsite\thung check prolog wall / budget\t{hung / 10:.2f}\tx")


if __name__ == "__main__":
    main()
