"""The suite runs in parallel (pytest-xdist: `scripts/test` passes -n auto --dist loadgroup).

Tests that share something expensive or must not overlap run in one worker, one after another,
as an xdist group given here, so no test file has to remember it:

- "slurm": every test that takes the real Slurm cluster (`slurm_cluster`) or is marked `slurm`
  (the historian's real-accounting tests, the guard benchmark's own slurmctld): one cluster per
  worker is ~10 s to start, and two at once double the daemons on 2 cores. The tests under
  tests/slurm that start no daemon (the CLI backend against stand-in programs) run anywhere.
- "sim" and "validation": the tests of those directories share session-scoped simulated fleets,
  built once in one worker, not once per worker.

PostgreSQL tests need no group: each gets its own database (tests/historian/conftest.py).
PgBouncer, Prometheus, the frozen PostgreSQL and Chromium each start their own daemon on a port
of their own (tests/ports.free_port), so they may run beside anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# A fixture or a marker -> group; else the first directory under tests/ -> group.
FIXTURE_GROUPS = {"slurm_cluster": "slurm", "_slurm_cluster_session": "slurm"}
MARKER_GROUPS = {"slurm": "slurm"}
DIRECTORY_GROUPS = {"sim": "sim", "validation": "validation"}


def xdist_group(item: pytest.Item) -> str | None:
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in FIXTURE_GROUPS:
            return FIXTURE_GROUPS[fixture]
    for marker, group in MARKER_GROUPS.items():
        if item.get_closest_marker(marker) is not None:
            return group
    try:
        top = Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return DIRECTORY_GROUPS.get(top)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
