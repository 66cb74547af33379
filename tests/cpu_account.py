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
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-account", metavar="DIR", default=None,
                     help="write each test's own and waited-children CPU seconds to DIR/*.tsv")


ACCOUNT = pytest.StashKey[TextIO]()  # this process's DIR/<worker>.tsv, open for appending


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--cpu-account")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        config.stash[ACCOUNT] = open(Path(out) / f"{worker}.tsv", "a", encoding="utf-8")


def pytest_unconfigure(config: pytest.Config) -> None:
    if ACCOUNT in config.stash:
        config.stash[ACCOUNT].close()


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    fh = item.config.stash.get(ACCOUNT, None)
    if fh is None:
        yield
        return
    own, kids, t0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    own = _cpu(resource.RUSAGE_SELF) - own
    kids = _cpu(resource.RUSAGE_CHILDREN) - kids
    fh.write(f"{item.nodeid}\t{own:.3f}\t{kids:.3f}\t{time.monotonic() - t0:.3f}\n")
    fh.flush()


def rows(directory: Path) -> Iterator[tuple[str, float, float, float]]:
    """(test id, own CPU s, children CPU s, wall s) for every test the workers wrote."""
    for tsv in sorted(directory.glob("*.tsv")):
        for line in tsv.read_text(encoding="utf-8").splitlines():
            nodeid, own, kids, wall = line.rsplit("\t", 3)
            yield nodeid, float(own), float(kids), float(wall)


def summarize(directory: Path) -> list[tuple[str, float, float, float, int]]:
    """(file, own CPU s, children CPU s, wall s, tests) per test file, costliest first."""
    per: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for nodeid, own, kids, wall in rows(directory):
        acc = per[nodeid.split("::", 1)[0]]
        acc[0] += own
        acc[1] += kids
        acc[2] += wall
        acc[3] += 1
    found = [(f, a[0], a[1], a[2], int(a[3])) for f, a in per.items()]
    return sorted(found, key=lambda r: -(r[1] + r[2]))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.cpu_account DIR", file=sys.stderr)
        return 2
    found = summarize(Path(argv[0]))
    total = [sum(r[i] for r in found) for i in (1, 2, 3)]
    print(f"{'own s':>8} {'children s':>10} {'wall s':>8} {'tests':>6}  file")
    print(f"{total[0]:8.1f} {total[1]:10.1f} {total[2]:8.1f} {sum(r[4] for r in found):6d}  (all)")
    for f, own, kids, wall, n in found:
        print(f"{own:8.1f} {kids:10.1f} {wall:8.1f} {n:6d}  {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
