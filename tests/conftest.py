"""The suite runs in parallel (pytest-xdist: `scripts/test` passes -n 4 --dist loadgroup).

Tests that share something expensive or must not overlap run in one worker, one after another,
as an xdist group given here, so no test file has to remember it:

- "slurm": every test that takes the real Slurm cluster (`slurm_cluster`, one per worker, ~10 s
  to start) or is marked `slurm` (the guard benchmark's own slurmctld). The two longest files
  (every README command on a real site, 2-5 min; metrics on real accounting, 1 min) are a
  second group, "slurm-long", with a cluster of their own in another worker: in one group the
  Slurm tests alone took 10 minutes at load 8. The historian's real-accounting tests start a
  cluster of their own too ("slurm-accounting"). Clusters never share a port or an accounting
  database (tests/slurm/cluster.py names both afresh). The tests under tests/slurm that start
  no daemon (the CLI backend against stand-in programs) run anywhere.
- "sim" and "validation": the tests of those directories share session-scoped simulated fleets,
  built once in one worker, not once per worker.

PostgreSQL tests need no group: each gets its own database (tests/historian/conftest.py).

What actually happens with the pinned tools (pytest 9.2, pytest-xdist 3.8): `--dist loadgroup`
spreads a group's tests over every worker (xdist reads the group from the test's id, which
pytest 9.2 no longer carries; 8 tests of one group ran on gw0-gw3 here). The suite is correct
without it and must stay so: every Slurm test takes its worker's own cluster (ports and
accounting database of its own), and what the sim and validation tests share is built once per
run under a file lock (tests/shared_build.py), whichever workers ask. Keeping a group in one
worker would also make the suite slower: the slurm tests alone are about 23 test-minutes.
PgBouncer, Prometheus, the frozen PostgreSQL and Chromium each start their own daemon on a port
of their own (tests/ports.free_port), so they may run beside anything. So does the stand-in
nv-hostengine (tests/standin_hostengine.py, a listener per process): one port shared by the
workers changed under a dcgmi whenever another worker finished. What is server-wide in
PostgreSQL (pg_locks, pg_stat_activity, roles) a test names by its own database or a fresh name:
a backend killed by class alone was another worker's too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# A file -> group; else a fixture or a marker -> group; else the first directory under tests/.
FILE_GROUPS = {
    "test_readme_commands_run.py": "slurm-long",
    "test_metrics_on_real_accounting.py": "slurm-long",
    "test_real_accounting.py": "slurm-accounting",
}
FIXTURE_GROUPS = {"slurm_cluster": "slurm", "_slurm_cluster_session": "slurm"}
MARKER_GROUPS = {"slurm": "slurm"}
DIRECTORY_GROUPS = {"sim": "sim", "validation": "validation"}


def xdist_group(item: pytest.Item) -> str | None:
    if Path(str(item.path)).name in FILE_GROUPS:
        return FILE_GROUPS[Path(str(item.path)).name]
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


@pytest.fixture(scope="session")
def hostengine_standin() -> str:
    """nv-hostengine's address for the stand-in dcgmi's --host: this process's own listener
    (tests/standin_hostengine.py)."""
    from tests.standin_hostengine import HOST

    return HOST


def _tiny_png() -> bytes:
    """A valid 1x1 grey PNG."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))


@pytest.fixture
def figures_not_drawn(monkeypatch):
    """The report's figures replaced by a 1x1 PNG, for tests of everything but the figures
    (report.json, the summary, the page's text): matplotlib draws each figure in about 1.5 s,
    which made a whole report 17 s here. The figures themselves are drawn and checked in
    test_plots, test_render and test_browser. Each placeholder still goes through the same
    write (durable.write_atomic) as a drawn one."""
    from rsc_health.durable import write_atomic
    from rsc_health.report import plots

    png = _tiny_png()

    def stub(frame, path, **context):
        write_atomic(path, png, sync_dir=False)
        empty = frame is None or len(frame) == 0
        return plots.Plot(path, not empty, "no data" if empty else "")

    monkeypatch.setattr(plots, "FIGURES", {section: (name, caption, stub) for
                                           section, (name, caption, _) in plots.FIGURES.items()})
