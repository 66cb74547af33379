"""How long a person's drain can land between the node path's read and its drain, measured.

    python3 benchmarks/bench_drain_read_gap.py [--tries 15]

A first drain reads the node table (the guard's look, this node's record in it) and then runs
`scontrol update State=DRAIN`. A person's drain landing in between is overwritten by ours:
scontrol has no compare-and-set. This starts a real slurmctld with 6 slurmd (tests/slurm/
cluster.py), runs Actor.apply for an XID 79 verdict `--tries` times, and prints the time from
the read's end to the drain's start, and what one scontrol read costs (the price of a re-read
of the node just before the drain, which would leave a window of the same size).

The other way round: a clean sweep reads the node (our transient drain) and then runs
`scontrol update State=UNDRAIN`; a person's drain landing in between is lifted by ours, its
reason gone (22.05 clears the reason on UNDRAIN, and a drain over a drain replaces it: a read
after either write cannot see theirs, so nothing can be undone). Also timed: the read's end to
the undrain's start of the resuming sweep.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rsc_health.actions import Actor  # noqa: E402
from rsc_health.config import load_config  # noqa: E402
from rsc_health.model import Finding, Severity, Status  # noqa: E402
from rsc_health.policy import decide  # noqa: E402
from rsc_health.slurm.cli_backend import CliSlurm  # noqa: E402
from tests.slurm.cluster import SlurmCluster, slurm_available  # noqa: E402


class Timed(CliSlurm):
    """CliSlurm noting each command's (argv, start, end)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.log: list[tuple[list[str], float, float]] = []

    def _run(self, argv, timeout_s=None):
        t0 = time.monotonic()
        out = super()._run(argv, timeout_s)
        self.log.append((argv, t0, time.monotonic()))
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tries", type=int, default=15)
    args = ap.parse_args()
    if not slurm_available():
        sys.exit("slurmctld is not installed")
    verdict = decide([Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW,
                              "fell off the bus", "xid79", True)])
    transient = decide([Finding("mounts", "/data", Status.FAIL, Severity.DRAIN_NOW,
                                "not mounted", "mount_missing", False)])
    ok = decide([])
    cfg = load_config("/dev/null")
    gaps, reads, one, resumes = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp, SlurmCluster(Path(tmp), nodes=6,
                                                            accounting=False) as c:
        os.environ["SLURM_CONF"] = str(c.conf)
        for _ in range(args.tries):
            slurm = Timed()
            with tempfile.TemporaryDirectory() as sdir:
                actor = Actor(slurm, cfg, "node01", Path(sdir), log=lambda m: None)
                actor.sleep = lambda s: None
                actor.apply(verdict, requeue=False)
            listing = next(e for e in slurm.log if e[0][1:3] == ["-o", "show"])
            drain = next(e for e in slurm.log if e[0][1] == "update")
            gaps.append(drain[1] - listing[2])
            reads.append(listing[2] - listing[1])
            t0 = time.monotonic()
            slurm.node("node01")
            one.append(time.monotonic() - t0)
            c.run(["scontrol", "update", "NodeName=node01", "State=RESUME"])
            with tempfile.TemporaryDirectory() as sdir:
                actor = Actor(Timed(), cfg, "node01", Path(sdir), log=lambda m: None)
                actor.sleep = lambda s: None
                actor.apply(transient, requeue=False)
                for _ in range(actor.resume_after):
                    actor.slurm = Timed()
                    actor.apply(ok, clean_sweep=True)
                log = actor.slurm.log
            read = [e for e in log if e[0][1:3] == ["-o", "show"]][-1]
            undrain = next(e for e in log if e[0][1] == "update" and "State=UNDRAIN" in e[0])
            resumes.append(undrain[1] - read[2])

    def ms(xs):
        return f"median {statistics.median(xs) * 1000:.1f} ms, max {max(xs) * 1000:.1f} ms"

    print(f"table read (6 nodes): {ms(reads)}")
    print(f"one-node read:        {ms(one)}")
    print(f"read end -> drain:    {ms(gaps)}")
    print(f"read end -> undrain:  {ms(resumes)}")


if __name__ == "__main__":
    main()
