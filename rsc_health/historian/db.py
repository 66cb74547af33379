"""Opening the historian database: create it when new (an ingest only), refuse one from a
newer release, and migrate an older one with the versioned SQL files in
`rsc_health/historian/sql/`.

SQLite gets WAL (readers never block the ingest), foreign keys (job_nodes and attributions
cascade with their job) and a busy timeout (a second writer waits instead of failing). Every
SQLite transaction begins with a BEGIN of ours (pysqlite's own sends none before a SELECT, so
a transaction's reads ran outside it); one that will write (`writer`) takes the write lock
as it begins, so two writers serialize there and the second reads what the first committed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import signal
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, func, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.exc import InterfaceError as SAInterfaceError

from rsc_health.compat import UTC
from rsc_health.historian import schema

MIGRATIONS_DIR = Path(__file__).with_name("sql")
log = logging.getLogger(__name__)
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+?)(?:\.(sqlite|postgresql))?\.sql$")
SQLITE_BUSY_TIMEOUT_MS = 30_000


class HistorianError(Exception):
    """The historian database cannot be used as it is; the message says why."""


class HistorianUnavailable(HistorianError):
    """The database server (or file) cannot be reached; callers keep their data and retry."""


class HistorianFrozen(HistorianUnavailable):
    """The server took the statement and stopped answering (a frozen host or process): its
    own statement_timeout cannot fire, so the client gave up."""


class SchemaTooNew(HistorianError):
    pass


class RunInProgress(HistorianError):
    """Another process holds the historian's lock for this kind of run (`run_alone`)."""


class SchemaTooOld(HistorianError):
    pass


def safe_url(url: str) -> str:
    """The URL with any password masked, for error messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


# An execution option: a transaction begun under it will write (see `writer`).
WRITES = "rsc_health_writes"
_Bind = TypeVar("_Bind", Engine, Connection)


def writer(bind: _Bind) -> _Bind:
    """`bind` (an Engine, or a Connection before its transaction begins) for a transaction
    that will write. On SQLite it begins with BEGIN IMMEDIATE: the write lock is taken (or
    waited for, under the busy timeout) before the first read, so a transaction that reads
    and then writes never writes on top of a commit it did not see. A deferred BEGIN would
    read a snapshot and then fail at its first write ("database is locked", no waiting) when
    another process had committed in between. PostgreSQL ignores the option."""
    return bind.execution_options(**{WRITES: True})


# PostgreSQL: transaction-level advisory locks, one per key in a namespace per kind of record
# ("rsch" check intervals, "rslm" lemon records), taken in one order (two transactions over
# overlapping keys never wait on each other in a cycle). A hash collision between two keys
# only makes their transactions take turns.
TURNS_CHECK_INTERVALS = 1920164712
TURNS_LEMON_RECORDS = 1920166765
TURNS_SUSPECTS = 1920169331  # "rsus": a node's suspect episodes (historian/suspects.py)
TURNS_ATTRIBUTE = 1920164212  # "rsat": attribution runs (historian/attribute.py), one key
TURNS_TELEMETRY_ROLLUP = 1920169074  # "rstr": telemetry rollups (historian/telemetry.py), one key
ALONE_LEMONS_APPLY = 1920166753  # "rsla": one `healthctl lemons --apply` at a time (run_alone)
ALONE_DB_UPGRADE = 1920166773  # "rslu": one `healthctl db upgrade` at a time
LEMONS_APPLY = "lemons-apply"
_TAKE_TURNS = text(
    "SELECT count(pg_advisory_xact_lock(CAST(:space AS integer), k)) FROM "
    "(SELECT DISTINCT hashtext(n) AS k FROM unnest(CAST(:keys AS text[])) AS n ORDER BY k) "
    "AS ordered")


def take_turns(conn: Connection, space: int, keys: list[str]) -> None:
    """Make two transactions that read and then write the records of one key (a node) take
    turns: under READ COMMITTED both read before either writes, and both write as if alone.
    Held to the transaction's end and taken before the read, so the second reads what the
    first committed. A statement of its own: a statement reads the snapshot taken as it
    starts, so a lock taken inside the reading statement would come too late. SQLite needs
    none: its writers begin with BEGIN IMMEDIATE (`writer`)."""
    if conn.dialect.name == "postgresql" and keys:
        conn.execute(_TAKE_TURNS, {"space": space, "keys": keys})


@contextmanager
def run_alone(engine: Engine, space: int, name: str) -> Iterator[None]:
    """Hold the historian's lock for one kind of run (`space`, e.g. ALONE_LEMONS_APPLY) for the
    with-block, or raise RunInProgress at once when another process holds it: never waits.
    PostgreSQL: a transaction-level advisory lock on a connection of its own, its transaction
    open (and writing nothing) until the block ends; PgBouncer's transaction pooling keeps it,
    and a lost connection or a killed run lets it go. SQLite: flock on `<database>-<name>.lock`
    beside the file (never the database file itself: closing a descriptor of it would drop
    SQLite's own locks), let go as the process ends however it ends. An in-memory database is
    one process's: nothing to hold."""
    busy = RunInProgress(f"another {name} run holds this historian's lock; nothing done: "
                         "run again when it has finished")
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            trans = conn.begin()
            try:
                if not conn.execute(text("SELECT pg_try_advisory_xact_lock("
                                         "CAST(:space AS integer), 0)"), {"space": space}).scalar():
                    raise busy
                yield
            finally:
                try:
                    trans.rollback()  # wrote nothing; lets the lock go
                except (OperationalError, SAInterfaceError):
                    pass  # the connection is gone, and the lock with it
        return
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    lock = f"{database}-{name}.lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o600)
    except OSError as exc:
        raise HistorianError(f"cannot take the lock {lock}: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HistorianError(f"cannot take the lock {lock}: not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise busy from None
            raise HistorianError(f"cannot take the lock {lock}: {exc.strerror}") from exc
        yield
    finally:
        os.close(fd)


def _sqlite_begin(conn: Connection) -> None:
    """SQLAlchemy's recipe for pysqlite (its SQLite dialect's "Transactions with SQLite and
    the sqlite3 driver"): the driver sends no BEGIN (isolation_level None, set on connect),
    we send one as SQLAlchemy begins each transaction. So reads are inside the transaction
    (one snapshot), DDL is transactional, and SAVEPOINT nests inside it."""
    options = conn.get_execution_options()
    if options.get("isolation_level") == "AUTOCOMMIT":
        return
    conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get(WRITES) else "BEGIN")


def sqlite_outside_transaction(conn: Connection, sql: str):
    """Run a PRAGMA that SQLite refuses or ignores inside a transaction (journal_mode,
    foreign_keys) on `conn`'s driver connection, which has none open; its first value."""
    if conn.in_transaction():
        raise RuntimeError(f"{sql} needs the connection outside a transaction")
    row = conn.connection.driver_connection.execute(sql).fetchone()
    return None if row is None else row[0]


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # We send BEGIN ourselves (_sqlite_begin): the driver's own would come too late.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    # The busy timeout first: switching to WAL needs a lock that a load in another process
    # may hold (a first load runs under the rollback journal), and must wait for it too.
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    _wal(cur)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL is durable across app crashes
    cur.close()


def _wal(cur) -> None:
    """PRAGMA journal_mode=WAL, retried while another process's first load holds the file in
    rollback-journal mode: two connections both asking for the exclusive lock get SQLITE_BUSY
    at once (SQLite's deadlock rule), not after the busy timeout."""
    import sqlite3
    import time

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# Longest one statement may run on PostgreSQL unless a load sets its own (SET LOCAL): a lock
# held by someone else or a runaway query ends instead of holding a timer's command forever.
STATEMENT_TIMEOUT_S = 900.0
# The server enforces statement_timeout only while it runs; a frozen server (SIGSTOP, a hung
# VM) answers nothing, so the client stops waiting as long again after the server should
# have answered, at most this much longer.
CLIENT_GRACE_S = 30.0
_PG_CONNECT = {
    "connect_timeout": 10,
    # A vanished host (network partition, power off) is found by TCP, not by a query timeout.
    "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
# psycopg (3) only. No server-side prepared statements: psycopg would name them _pg3_0,
# _pg3_1, ... per client connection, and behind PgBouncer's transaction pooling
# (docs/deployment.md; 1.18 in Debian 12 cannot track them) the next node's flush on the same
# backend fails with "prepared statement already exists", or a client's next transaction lands
# on a backend without it. Our statements are few per connection or go by COPY.
_PSYCOPG_CONNECT = {"prepare_threshold": None}


def engine_for(url: str, *, statement_timeout_s: float | None = None) -> Engine:
    """An Engine with the per-dialect settings, without touching the database yet. On
    PostgreSQL every statement ends after `statement_timeout_s` on the server, and the client
    stops waiting CLIENT_GRACE_S later (HistorianFrozen)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise HistorianError(f"not a database URL: {safe_url(url)}") from exc
    kwargs: dict = {}
    timeout_s = STATEMENT_TIMEOUT_S if statement_timeout_s is None else statement_timeout_s
    postgres = parsed.get_backend_name() == "postgresql"
    if postgres:
        kwargs["connect_args"] = dict(_PG_CONNECT)
        kwargs["pool_pre_ping"] = True
        if parsed.get_driver_name() == "psycopg":
            kwargs["connect_args"].update(_PSYCOPG_CONNECT)
            # No hstore column here: without this every new connection looks the type up (a
            # savepoint and a catalog query, on every node's flush).
            kwargs["use_native_hstore"] = False
    try:
        engine = create_engine(parsed, **kwargs)
    except (ArgumentError, ImportError) as exc:
        raise HistorianError(f"cannot use {safe_url(url)}: {exc}") from exc
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
    elif postgres and timeout_s > 0:
        _bound_client_waits(engine, timeout_s)
    return engine


def _bound_client_waits(engine: Engine, default_s: float) -> None:
    """A SIGALRM around each statement, COMMIT and ROLLBACK in the main thread (the CLI's): a
    server that takes one and freezes would otherwise hold the command forever. A transaction
    that sets its own statement_timeout (`limit_statements`) records it in conn.info, and the
    client bound follows it."""
    previous: list = []  # the SIGALRM handler to put back (main thread only)

    def arm(conn, cursor, statement, parameters, context, executemany):
        if threading.current_thread() is threading.main_thread():
            previous.append(_arm_alarm(conn.info.get("statement_timeout_s", default_s)))

    def disarm(*args) -> None:
        if previous:
            _disarm_alarm(previous.pop())

    def on_error(context) -> None:
        disarm()
        if isinstance(context.original_exception, HistorianFrozen):
            # The connection is mid-statement: close it rather than try a ROLLBACK on it.
            context.is_disconnect = True

    def begin(conn) -> None:
        # SET LOCAL per transaction, not a startup option or a session SET: PgBouncer in
        # transaction mode (docs/deployment.md) refuses the one and shares the other. An
        # engine made with execution_options(statement_timeout_s=...) (a node's flush) sets
        # its own here rather than in a second statement per transaction.
        seconds = conn.get_execution_options().get("statement_timeout_s", default_s)
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, int(seconds * 1000))}")
        conn.info["statement_timeout_s"] = seconds

    def end_of_transaction(conn) -> None:
        if not conn.invalidated:  # .info on an invalidated connection would reconnect
            # The bound of the COMMIT or ROLLBACK that follows (_bounded_end) is the
            # transaction's own.
            conn.info[_ENDING] = conn.info.pop("statement_timeout_s", default_s)

    event.listen(engine, "begin", begin)
    event.listen(engine, "before_cursor_execute", arm)
    event.listen(engine, "after_cursor_execute", disarm)
    event.listen(engine, "handle_error", on_error)
    event.listen(engine, "commit", end_of_transaction)
    event.listen(engine, "rollback", end_of_transaction)
    # SQLAlchemy fires no cursor event for COMMIT or ROLLBACK: the dialect's own calls are
    # wrapped (the pool's reset-on-return ROLLBACK goes through the same dialect instance).
    dialect = engine.dialect
    dialect.do_commit = _bounded_end(dialect.do_commit, "COMMIT", default_s)  # type: ignore[method-assign]
    dialect.do_rollback = _bounded_end(dialect.do_rollback, "ROLLBACK", default_s)  # type: ignore[method-assign]


_ENDING = "rsc_health_ending_timeout_s"


def _frozen(what: str):
    def fire(signum, frame):
        raise HistorianFrozen(f"the historian database stopped answering{what} (no reply "
                              "within its statement timeout; is the server frozen?)")
    return fire


def _arm_alarm(server_s: float, what: str = "") -> object:
    """SIGALRM after `server_s` plus the grace for the server's own answer; the handler to
    put back."""
    previous = signal.signal(signal.SIGALRM, _frozen(what))
    # Never before the server's own timeout could have answered (2 s floor for its reply).
    grace = min(max(server_s, 2.0), CLIENT_GRACE_S)
    signal.setitimer(signal.ITIMER_REAL, server_s + grace)
    return previous


def _disarm_alarm(previous) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _bounded_end(end, word: str, default_s: float):
    """The dialect's do_commit or do_rollback under the client bound. A COMMIT that got no
    answer may have landed or not (all of the transaction or none of it): the message says
    so. Every writer here is keyed, so a caller that keeps its input and sends it again lands
    each record once either way."""
    what = (f" at {word}, so whether it committed is unknown until it answers"
            if word == "COMMIT" else f" at {word}")

    def run(dbapi_conn) -> None:
        try:
            info = dbapi_conn.info  # the pool's connection: a dict
        except (AttributeError, NotImplementedError):  # the first connect's ad hoc proxy
            info = None
        seconds = info.pop(_ENDING, default_s) if isinstance(info, dict) else default_s
        if threading.current_thread() is not threading.main_thread():
            end(dbapi_conn)
            return
        previous = _arm_alarm(seconds, what)
        try:
            end(dbapi_conn)
        finally:
            _disarm_alarm(previous)

    return run


def current_version(engine: Engine) -> int | None:
    """The schema version stored in the database; None for an empty database.

    One query, not a catalog lookup first: every node's flush starts here, 18 a second at
    16,000 nodes."""
    with engine.connect() as conn:
        try:
            version = conn.execute(select(schema.schema_version.c.version)).scalar()
        except (OperationalError, ProgrammingError) as exc:
            if not no_such_table(exc):
                raise
            return None
        return int(version or 0)


def historian_now(conn: Connection) -> datetime:
    """The historian's clock (naive UTC): the database server's on PostgreSQL; on SQLite the
    database is this host's file and its clock this host's. What a node stamps for the
    management side to compare with its own times (a qualification run) is stamped by it: the
    node's own clock is the one in doubt (a dead RTC battery, a bad NTP server)."""
    if conn.dialect.name == "postgresql":
        return conn.execute(select(func.now())).scalar_one().astimezone(UTC).replace(
            tzinfo=None)
    return datetime.now(UTC).replace(tzinfo=None)


def refuse_other_versions(version: int, url: str) -> None:
    """SchemaTooNew or SchemaTooOld unless `version` is this release's."""
    if version > schema.SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{safe_url(url)} has schema version {version}, newer than this release "
            f"understands ({schema.SCHEMA_VERSION}); upgrade rsc-health"
        )
    if version < schema.SCHEMA_VERSION:
        raise SchemaTooOld(
            f"{safe_url(url)} has schema version {version}; this release needs "
            f"{schema.SCHEMA_VERSION}: run `healthctl db upgrade`"
        )


def no_such_table(exc: Exception) -> bool:
    orig = getattr(exc, "orig", None)
    return (getattr(orig, "sqlstate", None) == "42P01"  # PostgreSQL: undefined_table
            or "no such table" in str(orig))  # SQLite


def missing_file(url: str) -> Path | None:
    """The SQLite file `url` names when it does not exist (opening it would create it empty),
    else None (it exists, it is in memory, or the historian is a server)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    name = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or name in ("", ":memory:") \
            or name.startswith("file:"):
        return None
    return None if os.path.lexists(name) else Path(name)


def connect(url: str, *, create_missing: bool, upgrade: bool = False,
            statement_timeout_s: float | None = None) -> Engine:
    """Open the historian database at `url`. `create_missing` (every caller says which it
    is): create the schema when it is empty (and the SQLite file when it is absent), for what
    brings data in (an ingest, the spool's delivery, a simulation's own historian; `db
    upgrade` creates by itself). A reader never creates: a historian that is not there is not
    an empty fleet, and an empty file made in its place is all clear to every reader and then
    filled by the next ingest.

    Raises HistorianUnavailable when it cannot be reached or (without `create_missing`) is
    absent or holds no schema, SchemaTooNew when a newer release wrote it, and SchemaTooOld
    when it needs `healthctl db upgrade` (unless upgrade=True).
    """
    if not create_missing and (gone := missing_file(url)) is not None:
        raise HistorianUnavailable(
            f"historian database {safe_url(url)} is unavailable: {gone} does not exist "
            "(`healthctl db upgrade` or the first ingest creates it)")
    engine = engine_for(url, statement_timeout_s=statement_timeout_s)
    try:
        version = current_version(engine)
        if version is None:
            if not create_missing:
                raise HistorianUnavailable(
                    f"historian database {safe_url(url)} is not initialised: it holds no "
                    "rsc-health schema (`healthctl db upgrade` or the first ingest creates it)")
            create(engine)
            return engine
        if version < schema.SCHEMA_VERSION and upgrade:
            migrate(engine, version)
        else:
            refuse_other_versions(version, url)
    except (OperationalError, SAInterfaceError) as exc:
        engine.dispose()
        raise HistorianUnavailable(
            f"historian database {safe_url(url)} is unavailable: {first_line(exc)}"
        ) from exc
    except HistorianError:
        engine.dispose()
        raise
    return engine


def first_line(exc: Exception) -> str:
    """A database error's first line (the driver's own, under SQLAlchemy's wrapper), or its
    type's name when it says nothing: one line, never a traceback or a multi-line dump."""
    orig = getattr(exc, "orig", None) or exc
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]


def create(engine: Engine) -> None:
    """A new database is created at the newest version straight from schema.py (the same
    schema as `sql/0001_initial.<dialect>.sql` plus the later migrations; a test builds both
    and compares them)."""
    with writer(engine).begin() as conn:
        # A second process creating the same new file waits here, then finds the tables.
        schema.metadata.create_all(conn)
        conn.execute(schema.schema_version.delete())
        conn.execute(schema.schema_version.insert().values(version=schema.SCHEMA_VERSION))


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


def migrations(dialect: str, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Migration files for one dialect, in version order.

    `NNNN_name.sql` applies to every dialect; `NNNN_name.<dialect>.sql` to one only, and
    wins over a generic file of the same version.
    """
    chosen: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        m = _MIGRATION_NAME.match(path.name)
        if not m or (m.group(3) and m.group(3) != dialect):
            continue
        version = int(m.group(1))
        if version in chosen and not m.group(3):
            continue
        chosen[version] = Migration(version, m.group(2), path)
    return [chosen[v] for v in sorted(chosen)]


def split_statements(sql: str) -> list[str]:
    """Statements of a migration file: `;` at the end of a line ends one; `--` comments go."""
    lines = [ln for ln in sql.splitlines() if not ln.strip().startswith("--")]
    out, cur = [], []
    for ln in lines:
        cur.append(ln)
        if ln.rstrip().endswith(";"):
            stmt = "\n".join(cur).strip().rstrip(";").strip()
            if stmt:
                out.append(stmt)
            cur = []
    tail = "\n".join(cur).strip()
    if tail:
        out.append(tail)
    return out


# A migration file with this line runs statement by statement outside any transaction
# (PostgreSQL's CREATE INDEX CONCURRENTLY cannot run in one), its version recorded after
# them in a transaction of its own. Its statements must be safe to run again: a kill
# between them, or before the version row, runs the whole file again next time.
OUTSIDE_A_TRANSACTION = "-- rsc-health: outside a transaction"


def migrate(engine: Engine, from_version: int, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply every migration above `from_version`, each in its own transaction (or, marked
    OUTSIDE_A_TRANSACTION, each statement on its own and then the version)."""
    applied = []
    expected = from_version
    for mig in migrations(engine.dialect.name, directory):
        if mig.version <= from_version:
            continue
        sql = mig.path.read_text()
        versioned = _still_at(engine, expected)
        if any(line.strip() == OUTSIDE_A_TRANSACTION for line in sql.splitlines()):
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                for stmt in split_statements(sql):
                    conn.exec_driver_sql(stmt)
            sql = ""
        # One transaction with the version row (SQLite's DDL too, since it begins with our
        # BEGIN): a full disk or a kill midway leaves the previous version, whole. The row is
        # read first (locked on PostgreSQL): a version another upgrade moved since this one
        # read it is never written back over (helper-134: two upgrades from 18, the second's
        # re-runnable 0019 set a historian at 21 back to 19, which no upgrade could mend).
        with writer(engine).begin() as conn:
            if versioned:
                _still_at(engine, expected, conn)
            for stmt in split_statements(sql):
                conn.exec_driver_sql(stmt)
            conn.execute(schema.schema_version.delete())
            conn.execute(schema.schema_version.insert().values(version=mig.version))
        applied.append(mig.version)
        expected = mig.version
    return applied


def _still_at(engine: Engine, version: int, conn: Connection | None = None) -> bool:
    """Raise RunInProgress unless the historian's schema version is still `version`; False when
    it keeps none yet (an old schema's first steps, which make the table)."""
    if conn is None:
        found = current_version(engine)
        if found is None:
            return False
    else:
        found = int(conn.execute(select(schema.schema_version.c.version).with_for_update()
                                 ).scalar() or 0)
    if found != version:
        raise RunInProgress(
            f"another db upgrade ran on this historian at the same time (it is at schema "
            f"version {found}, not {version}): run db upgrade again when it has finished")
    return True


def upgrade(url: str) -> tuple[int | None, int, list[int]]:
    """(version before, version after, migrations applied) for `healthctl db upgrade`. Two
    started together both read the old version, and the second's first migration failed on
    the tables the first had made, said as "is unavailable: table job_ends already exists"
    (SQLite), a raw UniqueViolation or a deadlock (PostgreSQL) (helper-125).

    SQLite: one at a time (run_alone's lock file); the second says another holds the lock, one
    started after reads the version the first left. PostgreSQL: no lock held across the
    migrations, since an advisory lock is held by an open transaction (a session lock would
    outlive its server connection behind PgBouncer), whose snapshot 0019's CREATE INDEX
    CONCURRENTLY waits for: the upgrade waited on itself for ever (helper-130). A migration
    that fails there while another upgrade moved the version, or on a deadlock, says another
    upgrade ran at the same time."""
    engine = engine_for(url)
    try:
        if engine.dialect.name == "postgresql":
            return _upgrade(engine, url)
        with run_alone(engine, ALONE_DB_UPGRADE, "upgrade"):
            return _upgrade(engine, url)
    except (OperationalError, SAInterfaceError) as exc:
        raise HistorianUnavailable(
            f"historian database {safe_url(url)} is unavailable: {first_line(exc)}"
        ) from exc
    finally:
        engine.dispose()


def _upgrade(engine: Engine, url: str) -> tuple[int | None, int, list[int]]:
    before = current_version(engine)
    if before is None:
        create(engine)
        return None, schema.SCHEMA_VERSION, []
    if before > schema.SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{safe_url(url)} has schema version {before}, newer than this release "
            f"understands ({schema.SCHEMA_VERSION})"
        )
    try:
        applied = migrate(engine, before)
    except (OperationalError, ProgrammingError, IntegrityError) as exc:
        try:
            now = current_version(engine)
        except (OperationalError, SAInterfaceError):
            now = None
        if (now is not None and now > before) or "deadlock detected" in str(exc):
            raise RunInProgress(
                f"another db upgrade ran on {safe_url(url)} at the same time (it is at schema "
                f"version {now if now is not None else '?'}): run db upgrade again when it has "
                "finished") from exc
        raise
    return before, current_version(engine) or 0, applied


def table_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        present = set(inspect(conn).get_table_names())
        return {
            t.name: int(conn.execute(text(f"SELECT COUNT(*) FROM {t.name}")).scalar() or 0)
            for t in schema.metadata.sorted_tables
            if t.name in present
        }


def render_ddl(dialect_name: str) -> str:
    """schema.py as DDL for one dialect: how `sql/0001_initial.<dialect>.sql` was written (at
    version 1), and a start for a later migration file."""
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateIndex, CreateTable

    dialect = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}[dialect_name]
    parts = [f"-- Generated from rsc_health/historian/schema.py for {dialect_name}."]
    for table in schema.metadata.sorted_tables:
        parts.append(str(CreateTable(table).compile(dialect=dialect)).strip() + ";")
        for index in sorted(table.indexes, key=lambda i: i.name or ""):
            parts.append(str(CreateIndex(index).compile(dialect=dialect)).strip() + ";")
    text_ = "\n\n".join(parts) + "\n"
    return "\n".join(line.rstrip() for line in text_.split("\n"))


# The tables the analytic queries join; a bulk load changes their sizes by orders of magnitude.
ANALYZED_TABLES = ("jobs", "job_nodes", "attributions", "check_results", "node_events")


def refresh_statistics(engine: Engine, tables: tuple[str, ...] | None = None) -> None:
    """Refresh the query planner's statistics, e.g. after a bulk load.

    Without them both planners pick plans for empty tables: SQLite scans all of job_nodes in
    node order for the lemon features (13M rows at the paper's scale, ~50 s instead of ~2 s),
    and PostgreSQL, until autovacuum gets to it minutes later, runs goodput's preemption search
    as a nested loop that grows with the square of the jobs (140 s at 146k rows). SQLite samples
    1000 rows per index and PostgreSQL ANALYZE samples its own, so this costs about a second at
    any size. `tables`: only those a load changed (a year of check intervals need not be
    sampled again after an accounting load); None: every table the analytic queries join.
    A failure (read-only file, busy writer) only costs speed, so it is logged, not raised."""
    try:
        with writer(engine).begin() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA analysis_limit=1000")
                quote = conn.dialect.identifier_preparer.quote
                for table in tables or ("",):
                    conn.exec_driver_sql(f"ANALYZE {quote(table)}" if table else "ANALYZE")
            elif engine.dialect.name == "postgresql":
                quote = conn.dialect.identifier_preparer.quote
                # The full default sample: at a third of it (9,000 rows) job_nodes' distinct
                # job_pk came out as 53k instead of 4.2M at the paper's scale, and goodput's
                # preemption search scanned all of job_nodes once per requeue (minutes, not 5 s).
                conn.exec_driver_sql(
                    "ANALYZE " + ", ".join(quote(t) for t in tables or ANALYZED_TABLES))
    except Exception as exc:  # noqa: BLE001 -- any driver error: the queries still run, slower
        log.warning("could not refresh the planner statistics: %s", exc)
