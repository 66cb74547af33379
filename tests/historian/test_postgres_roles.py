"""The shipped PostgreSQL roles and grants (deploy/postgresql/) as an operator runs them: psql
creates the roles and the database, the owner creates the schema with `healthctl db upgrade`,
grants.sql hands out the rest; then a real prolog's spool is flushed AS THE NODE ROLE with
`healthctl spool flush`, and each role is refused what it must not do (issue 26: the documented
node grants missed schema_version, and every node's flush failed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from rsc_health import spool
from rsc_health.historian import schema
from tests.fixtures.nodes.node_copy import copy_node
from tests.historian.conftest import PG_ADMIN_URL

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "postgresql"
PROLOG = REPO / "prolog" / "rsc-health-prolog"

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(shutil.which("psql") is None, reason="psql (postgresql-client) missing"),
]


def _libpq(url: str) -> str:
    """The SQLAlchemy URL as psql takes it (no +driver)."""
    u = make_url(url)
    return u.set(drivername="postgresql").render_as_string(hide_password=False)


def _psql(sql_file: Path, names: dict[str, str]) -> subprocess.CompletedProcess:
    args = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", _libpq(PG_ADMIN_URL)]
    for key, value in names.items():
        args += ["-v", f"{key}={value}"]
    return subprocess.run([*args, "-f", str(sql_file)], capture_output=True, text=True,
                          timeout=60)


def _as(role: str, names: dict[str, str]) -> str:
    return make_url(PG_ADMIN_URL).set(username=role, database=names["dbname"]).render_as_string(
        hide_password=False)


def _healthctl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rsc_health.cli", "--config", os.devnull, *args],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@pytest.fixture(params=["plain", "hyphens"])
def deployed(request):
    """roles.sql, `db upgrade` as the owner, grants.sql: the three steps of docs/deployment.md,
    on a throwaway database and throwaway role names (roles are cluster-wide). "hyphens": the
    names an operator is likely to pick (rsc-health-node), which SQL must quote everywhere."""
    tag = uuid.uuid4().hex[:10]
    sep = "_" if request.param == "plain" else "-"
    names = {k: f"rsc{sep}{k}{sep}{tag}" for k in ("dbname", "owner", "node", "reader")}
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        done = _psql(DEPLOY / "roles.sql", names)
        assert done.returncode == 0, done.stderr
        again = _psql(DEPLOY / "roles.sql", names)  # re-running changes nothing, fails nothing
        assert again.returncode == 0, again.stderr
        up = _healthctl("--db", _as(names["owner"], names), "db", "upgrade")
        assert up.returncode == 0, up.stdout + up.stderr
        granted = _psql(DEPLOY / "grants.sql", names)
        assert granted.returncode == 0, granted.stderr
        yield names
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS {_quoted(names["dbname"])} WITH (FORCE)'))
            for role in (names["node"], names["reader"], names["owner"]):
                conn.execute(text(f"DROP ROLE IF EXISTS {_quoted(role)}"))
        admin.dispose()


def _real_spool(tmp_path: Path) -> Path:
    """The spool a real prolog of the healthy fixture leaves (shadow mode: Slurm is not
    asked), plus the records only a drain or an excluding job writes."""
    root = copy_node(tmp_path / "node")
    site = root / "site.toml"
    site.write_text((root / "config.toml").read_text() + "\n[actions]\nenabled = false\n")
    defaults = tmp_path / "defaults"
    defaults.write_text("")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "RSC_HEALTH_DEFAULTS": str(defaults), "RSC_HEALTH_ROOT": str(root),
           "RSC_HEALTH_CONFIG": str(site), "SLURMD_NODENAME": "node01", "SLURM_JOB_ID": "77",
           "SLURM_JOB_NODELIST": "node[01-02]",  # the prolog's job_start names it (job_starts)
           "RSC_HEALTH_PYTHON": sys.executable}
    ran = subprocess.run([str(PROLOG)], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    spool_dir = root / "var" / "lib" / "rsc_health" / "spool"
    assert (spool_dir / spool.PENDING).stat().st_size > 0
    t = datetime.now(UTC).replace(microsecond=0)
    spool.append(spool_dir, [
        spool.record("job_start", "node01", t, job_id="78", excluded=["node07"]),
        spool.record("action", "node01", t, action="drain_now", reason="xid79", job_id="78"),
        spool.record("job_end", "node01", t, job_id="78"),  # the epilog's (job_ends)
        # What a sweep adds (the prolog does not sample telemetry).
        spool.record("telemetry", "node01", t, source="sweep", job_id=None, interval_s=300.0,
                     metrics={"gpu_temp_c": {"value": 61.0, "component": "gpu2"}}),
    ])
    return spool_dir


def _count(url: str, table) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(table)).scalar()
    finally:
        engine.dispose()


def _refused(url: str, sql: str) -> bool:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    except ProgrammingError as exc:
        return getattr(exc.orig, "sqlstate", None) == "42501"  # insufficient_privilege
    finally:
        engine.dispose()
    return False


def test_the_node_role_flushes_a_real_spool_and_again_without_duplicates(deployed, tmp_path):
    node_url = _as(deployed["node"], deployed)
    owner_url = _as(deployed["owner"], deployed)
    spool_dir = _real_spool(tmp_path)
    lines = (spool_dir / spool.PENDING).read_text().splitlines()
    out = _healthctl("--db", node_url, "spool", "flush", "--dir", str(spool_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (spool_dir / spool.PENDING).exists() and not list(spool_dir.glob("batch-*"))
    assert not (spool_dir / "quarantine").exists()
    landed = {t.name: _count(owner_url, t) for t in (
        schema.check_results, schema.node_runs, schema.heartbeat_days, schema.node_actions,
        schema.job_exclusions, schema.telemetry_samples, schema.job_ends, schema.job_starts)}
    assert all(landed.values()), landed
    # The same lines again (a node that lost the acknowledgement): the keyed inserts hit
    # their conflicts, which INSERT alone must be allowed to ignore, and nothing doubles.
    (spool_dir / spool.PENDING).write_text("\n".join(lines) + "\n")
    again = _healthctl("--db", node_url, "spool", "flush", "--dir", str(spool_dir))
    assert again.returncode == 0, again.stdout + again.stderr
    assert {t: _count(owner_url, getattr(schema, t)) for t in landed} == landed


def test_without_schema_version_every_flush_fails(deployed, tmp_path):
    """The miss issue 26 found, kept found: the grant is what makes the flush work."""
    admin = create_engine(make_url(PG_ADMIN_URL).set(database=deployed["dbname"]),
                          isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"REVOKE SELECT ON schema_version FROM {_quoted(deployed['node'])}"))
    finally:
        admin.dispose()
    spool_dir = _real_spool(tmp_path)
    out = _healthctl("--db", _as(deployed["node"], deployed), "spool", "flush",
                     "--dir", str(spool_dir))
    assert out.returncode != 0
    assert "permission denied for table schema_version" in out.stderr
    assert "deploy/postgresql/grants.sql" in out.stderr  # and what to do about it
    assert list(spool_dir.glob("batch-*")), "the spool must wait for the next flush"


NODE_MAY_NOT = [
    "SELECT count(*) FROM tickets",
    "SELECT action, reason FROM node_actions",       # lemon drains and other nodes' actions
    "SELECT time FROM job_exclusions",
    "SELECT count(*) FROM attributions",
    "SELECT count(*) FROM jobs",
    "SELECT count(*) FROM qualify_results",
    "INSERT INTO tickets (node, opened, reason, source) VALUES ('n', now(), 'x', 'lemon')",
    "UPDATE node_actions SET reason = 'x'",
    "DELETE FROM node_actions",
    "DELETE FROM check_results",
    "UPDATE schema_version SET version = 1",
    "TRUNCATE node_runs",
    "DROP TABLE check_days",
    "CREATE TABLE planted (x int)",
]
READER_MAY_NOT = [
    "INSERT INTO tickets (node, opened, reason, source) VALUES ('n', now(), 'x', 'lemon')",
    "UPDATE node_runs SET level = 'ok'",
    "DELETE FROM check_results",
    "CREATE TABLE planted (x int)",
]


def test_the_node_role_cannot_read_or_change_what_is_not_its_own(deployed):
    node = _as(deployed["node"], deployed)
    allowed = [sql for sql in NODE_MAY_NOT if not _refused(node, sql)]
    assert not allowed, allowed


def test_the_reader_role_reads_everything_and_changes_nothing(deployed, tmp_path):
    reader = _as(deployed["reader"], deployed)
    assert _count(reader, schema.tickets) == 0 and _count(reader, schema.node_actions) == 0
    # What it is for: the fleet export (as Grafana, `status` and the report read) runs as it.
    out = tmp_path / "fleet.prom"
    exported = _healthctl("--db", reader, "metrics", "export", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert "rsc_health_historian_up 1.0" in out.read_text()
    allowed = [sql for sql in READER_MAY_NOT if not _refused(reader, sql)]
    assert not allowed, allowed


def test_a_role_not_named_cannot_connect(deployed):
    stranger = f"rsc_stranger_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{stranger}" LOGIN'))
        engine = create_engine(_as(stranger, deployed))
        with pytest.raises(Exception, match="permission denied for database"):
            with engine.connect():
                pass
        engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP ROLE IF EXISTS "{stranger}"'))
        admin.dispose()
