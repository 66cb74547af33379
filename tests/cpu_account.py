"""Where the suite's CPU goes: a pytest plugin that writes, per test, the CPU the test's process
spent, the CPU of the child processes it waited for (every `healthctl`, `sbatch` or nested
pytest it ran), and its wall time; and a summary by file.

The whole suite is CPU-bound on the 2-core machine (scripts/test says how it was measured), so
wall time per test says little: a test waiting for PostgreSQL under load looks slow and costs
nothing. This says which files cost the cores.

    scripts/test -p tests.cpu_account --cpu-account=/tmp/cpu      # every worker writes a .tsv
    .venv/bin/python -m tests.cpu_account /tmp/cpu                 # the files, costliest first

Not counted: daemons (slurmctld, PostgreSQL's backends) and processes a test started and left
running; /proc/stat over the run gives the machine's total to compare with.
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-account", metavar="DIR", default=None,
                     help="write each test's own and waited-children CPU seconds to DIR/*.tsv")


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    out = item.config.getoption("--cpu-account")
    if not out:
        yield
        return
    own, kids, t0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    row = (item.nodeid, _cpu(resource.RUSAGE_SELF) - own, _cpu(resource.RUSAGE_CHILDREN) - kids,
           time.monotonic() - t0)
    Path(out).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(out) / f"{worker}.tsv", "a", encoding="utf-8") as fh:
        fh.write("{}\t{:.3f}\t{:.3f}\t{:.3f}\n".format(*row))


def summarize(directory: Path) -> list[tuple[str, float, float, float, int]]:
    """(file, own CPU s, children CPU s, wall s, tests) per test file, costliest first."""
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for tsv in sorted(directory.glob("*.tsv")):
        for line in tsv.read_text(encoding="utf-8").splitlines():
            nodeid, own, kids, wall = line.rsplit("\t", 3)
            acc = per[nodeid.split("::", 1)[0]]
            acc[0] += float(own)
            acc[1] += float(kids)
            acc[2] += float(wall)
            acc[3] += 1
    rows = [(f, a[0], a[1], a[2], int(a[3])) for f, a in per.items()]
    return sorted(rows, key=lambda r: -(r[1] + r[2]))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.cpu_account DIR", file=sys.stderr)
        return 2
    rows = summarize(Path(argv[0]))
    total = [sum(r[i] for r in rows) for i in (1, 2, 3)]
    print(f"{'own s':>8} {'children s':>10} {'wall s':>8} {'tests':>6}  file")
    print(f"{total[0]:8.1f} {total[1]:10.1f} {total[2]:8.1f} {sum(r[4] for r in rows):6d}  (all)")
    for f, own, kids, wall, n in rows:
        print(f"{own:8.1f} {kids:10.1f} {wall:8.1f} {n:6d}  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
