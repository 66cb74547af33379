"""Big first loads into a SQLite file through ADBC, Arrow's database connectivity.

Python's sqlite3 binds every value of every row in the interpreter: about 6 s of a 1M-row
sacct backfill. ADBC's SQLite driver binds Arrow columns in C (about 3.4 s for the same rows
with the same upsert).

ADBC brings its own copy of the SQLite library. SQLite warns that two copies in one process
can corrupt a file (https://sqlite.org/howtocorrupt.html, 2.2.1): POSIX locks belong to
the process, so closing one library's handle on a file drops the locks the other holds on
it. So this path is taken only when nothing else has the file open:
- the caller has just switched the file out of WAL, which SQLite allows only then;
- the engine has no connection checked out;
- the engine's idle connections are closed before ADBC opens the file;
- SQLAlchemy opens the file again only after ADBC has closed it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from rsc_health.historian.db import SQLITE_BUSY_TIMEOUT_MS

# Pages for the whole load: the indexes of a big backfill outgrow SQLite's 2 MiB default.
CACHE_KIB = 128 * 1024


def usable_file(engine: Engine) -> Path | None:
    """The SQLite file this engine writes, when the ADBC path may write it; else None
    (another database, an in-memory one, a connection in use, ADBC not installed)."""
    if engine.dialect.name != "sqlite":
        return None
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    if engine.pool.checkedout():
        return None
    try:
        import adbc_driver_sqlite.dbapi  # noqa: F401
    except ImportError:
        return None
    return Path(database)


def run(engine: Engine, path: Path, work: Callable):
    """Call work(cursor) in one IMMEDIATE transaction on an ADBC connection to `path`:
    committed when it returns (what it returned is returned), rolled back when it raises."""
    import adbc_driver_sqlite.dbapi as adbc

    engine.dispose()  # no other SQLite library's handle on the file while ADBC holds locks
    with adbc.connect(str(path), autocommit=True) as conn, conn.cursor() as cur:
        for pragma in (
            f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
            f"cache_size=-{CACHE_KIB}",
            "threads=2",  # CREATE INDEX sorts on a second core
            # The load writes job_nodes only from jobs.id read in the same statement and
            # deletes a job only with the rows hanging off it: a per-row check proves nothing.
            "foreign_keys=OFF",
        ):
            cur.execute(f"PRAGMA {pragma}")
        cur.execute("BEGIN IMMEDIATE")
        try:
            result = work(cur)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
    return result
