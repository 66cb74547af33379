"""Two `healthctl lemons --apply` runs at once (the nightly timer's and an operator's over
another window) each read the fleet before the other drained, so each used the mass-drain
guard's whole budget: a partition allowed 2 drains lost 4. One run at a time now (a lock the
historian holds, db.run_alone): the second is refused while the first runs, and a run after it
reads the first's drains and is held by the guard."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from lemon_fleet import AS_OF, drained, fleet_slurm
from sqlalchemy import select

from rsc_health.cli import AppContext
from rsc_health.commands.lemons import lemons
from rsc_health.historian import db
from rsc_health.historian.schema import tickets

DAY = timedelta(days=1)
EARLIER = AS_OF - 6 * DAY  # the timer's run: old1, old2 in its window, new1, new2 after it


@pytest.fixture
def history(fleet, engine):
    for node in ("old1", "old2"):
        for k in range(8):
            fleet.xid(node, AS_OF - (9 + 2 * k) * DAY, "xid79", f"gpu{k}")
    for node in ("new1", "new2"):
        for k in range(3):
            fleet.xid(node, AS_OF - (1 + 2 * k) * DAY, "xid79", f"gpu{k}")
    return engine


def _run(engine, slurm, as_of, *args):
    config = Path(engine.url.database).with_name("config.toml")
    config.write_text('[lemon]\nxid_cnt = 3\nstrong = ["xid_cnt"]\n')
    obj = AppContext(config_path=str(config), db_url=str(engine.url))
    obj.slurm = slurm
    return CliRunner().invoke(lemons, ["--as-of", as_of.strftime("%Y-%m-%d"), "--apply", *args],
                              obj=obj)


def test_a_second_apply_while_one_runs_is_refused_and_the_guard_holds(history):
    # 20 nodes in partition learn: [actions] guard_max_share 0.10 allows 2 drains
    slurm = fleet_slurm({n: ("IDLE", "") for n in ("old1", "old2", "new1", "new2")}, size=16)
    real_drain = slurm.drain
    second: list = []

    def drain(node, reason):
        if not second:  # the operator's run starts while the timer's is draining
            second.append(None)
            second[0] = _run(history, slurm, AS_OF, "--window", "7d")
        real_drain(node, reason)

    slurm.drain = drain
    first = _run(history, slurm, EARLIER)
    assert first.exit_code == 0, first.output
    assert second[0].exit_code != 0
    assert "another lemons-apply run holds this historian's lock" in second[0].output
    assert sorted(n for n, _ in drained(slurm)) == ["old1", "old2"]
    # run after the first ended: it reads the first's two drains and is held by the guard
    after = _run(history, slurm, AS_OF, "--window", "7d")
    assert after.exit_code == 0, after.output
    assert sorted(n for n, _ in drained(slurm)) == ["old1", "old2"]
    assert after.output.count("action: held") == 2
    with history.connect() as conn:
        assert sorted(conn.execute(select(tickets.c.node)).scalars()) == ["old1", "old2"]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def two_engines(request, tmp_path):
    url = (f"sqlite:///{tmp_path / 'historian.db'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_url"))
    engines = [db.engine_for(url), db.engine_for(url)]
    yield engines
    for e in engines:
        e.dispose()


def test_run_alone_refuses_a_second_holder_at_once_and_lets_go_after(two_engines):
    one, two = two_engines
    space = db.ALONE_LEMONS_APPLY
    with db.run_alone(one, space, db.LEMONS_APPLY):
        with pytest.raises(db.RunInProgress), db.run_alone(two, space, db.LEMONS_APPLY):
            pass
    with db.run_alone(two, space, db.LEMONS_APPLY):
        pass
    with pytest.raises(RuntimeError), db.run_alone(one, space, db.LEMONS_APPLY):
        raise RuntimeError("a run that fails")
    with db.run_alone(two, space, db.LEMONS_APPLY):  # the failed run let it go
        pass


def test_a_symlink_at_the_sqlite_lock_path_is_refused_not_followed(tmp_path):
    engine = db.engine_for(f"sqlite:///{tmp_path / 'historian.db'}")
    target = tmp_path / "elsewhere"
    os.symlink(target, tmp_path / f"historian.db-{db.LEMONS_APPLY}.lock")
    try:
        with pytest.raises(db.HistorianError, match="cannot take the lock"), \
                db.run_alone(engine, db.ALONE_LEMONS_APPLY, db.LEMONS_APPLY):
            pass
        assert not target.exists()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_lock_whose_connection_is_cut_mid_run_lets_go_and_the_run_ends_cleanly(pg_url):
    """PostgreSQL restarting (or the lock's backend killed) mid-run: the run's own work is not
    failed by the lock's lost connection at its end, and the lock is free for the next run."""
    from sqlalchemy import text

    one, two, admin = db.engine_for(pg_url), db.engine_for(pg_url), db.engine_for(pg_url)
    try:
        with db.run_alone(one, db.ALONE_LEMONS_APPLY, db.LEMONS_APPLY):
            with admin.connect() as conn:
                # this test's database only: another test's lock, held at the same moment
                # by another xdist worker in a database of its own, is not this one's to cut
                cut = conn.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks "
                    "WHERE locktype = 'advisory' AND classid = :space AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"),
                    {"space": db.ALONE_LEMONS_APPLY}).scalars().all()
            assert cut == [True]
        with db.run_alone(two, db.ALONE_LEMONS_APPLY, db.LEMONS_APPLY):
            pass
    finally:
        for e in (one, two, admin):
            e.dispose()
