"""Version 2 (job_nodes WITHOUT ROWID on SQLite): a version-1 database with rows is upgraded
in place and keeps every row, and the metrics read from it do not change."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import column as sa_column
from sqlalchemy import inspect, select, text
from sqlalchemy import table as sa_table

from rsc_health.cli import cli
from rsc_health.historian import db, schema
from rsc_health.historian.attribute import attribute
from rsc_health.historian.ingest import checks, events, sacct
from rsc_health.historian.metrics import goodput, rates

FIXTURES = Path(__file__).parent / "fixtures"


def _only_v1(tmp_path: Path) -> Path:
    only_v1 = tmp_path / "sql-v1"
    if not only_v1.exists():
        only_v1.mkdir()
        for f in db.MIGRATIONS_DIR.glob("0001_*.sql"):
            shutil.copy(f, only_v1 / f.name)
    return only_v1


def _version_1(url: str, tmp_path: Path):
    """A database built by migration 0001 only, as release 1 left it."""
    engine = db.engine_for(url)
    assert db.migrate(engine, 0, _only_v1(tmp_path)) == [1]
    return engine


def _fill(engine, tmp_path: Path) -> None:
    """The fixtures' rows, as today's ingest writes them, copied into `engine`'s tables with
    the columns those tables have (a version-1 database lacks the later ones)."""
    scratch = db.connect(f"sqlite:///{tmp_path / 'scratch.db'}", create_missing=True)
    sacct.ingest_text(scratch, FIXTURES / "sacct_small.txt")
    events.ingest_file(scratch, FIXTURES / "sacctmgr_events.txt")
    checks.ingest_file(scratch, FIXTURES / "checks.jsonl")
    attribute(scratch)
    present = {name: {c["name"] for c in inspect(engine).get_columns(name)}
               for name in inspect(engine).get_table_names()}
    with scratch.connect() as src, engine.begin() as dst:
        for t in schema.metadata.sorted_tables:
            if t.name == "schema_version" or t.name not in present:
                continue
            cols = [c for c in t.columns if c.name in present[t.name]]
            rows = [dict(r._mapping) for r in src.execute(select(*cols))]
            if rows:  # a bare table: no Python-side defaults for columns it lacks
                dst.execute(sa_table(t.name, *(sa_column(c.name) for c in cols)).insert(), rows)
    scratch.dispose()


def _rows(engine, columns_of=None) -> dict[str, list]:
    """Every table's rows, in the columns `columns_of` (default: `engine` itself) has."""
    insp = inspect(columns_of or engine)
    with engine.connect() as conn:
        return {
            t.name: sorted(
                map(tuple, conn.execute(select(*[
                    c for c in t.columns
                    if c.name in {x["name"] for x in insp.get_columns(t.name)}
                ])).all()),
                key=repr,
            )
            for t in schema.metadata.sorted_tables
            if t.name != "schema_version" and t.name in insp.get_table_names()
        }


def _metrics(engine, *, goodput_too: bool = True) -> str:
    """The metrics as JSON text, so that NaN compares equal to NaN. Goodput reads
    jobs.cluster (migration 0004: a requeue is the same job id on the same cluster), which a
    version-1 database lacks: it is compared with today's ingest of the same rows instead."""
    out = {
        "failure_rate": rates.failure_rate(engine, large_job_gpus=0).to_dict(),
        "outcomes": rates.outcomes(engine).to_dict("records"),
        "causes": rates.causes(engine).to_dict("records"),
    }
    if goodput_too:
        out["goodput"] = goodput.goodput_lost(engine).to_dict("records")
    return json.dumps(out, default=str, sort_keys=True)


def test_upgrade_from_version_1_keeps_every_row_and_the_metrics(historian_url, tmp_path):
    engine = _version_1(historian_url, tmp_path)
    _fill(engine, tmp_path)
    rows, metrics = _rows(engine), _metrics(engine, goodput_too=False)
    # the same rows, today's schema
    today = db.connect(f"sqlite:///{tmp_path / 'scratch.db'}", create_missing=True)
    lost = json.loads(_metrics(today))["goodput"]
    today.dispose()
    assert lost  # the fixtures do lose goodput: the comparison below is not of two empties
    assert rows["job_nodes"] and rows["attributions"]
    v1 = db.engine_for(f"sqlite:///{tmp_path / 'v1-columns.db'}")
    assert db.migrate(v1, 0, _only_v1(tmp_path)) == [1]

    with pytest.raises(db.SchemaTooOld):
        db.connect(historian_url, create_missing=True)
    upgraded = db.connect(historian_url, upgrade=True, create_missing=True)
    try:
        assert db.current_version(upgraded) == schema.SCHEMA_VERSION
        assert _rows(upgraded, v1) == rows
        assert _metrics(upgraded, goodput_too=False) == metrics
        assert json.loads(_metrics(upgraded))["goodput"] == lost
        if upgraded.dialect.name == "sqlite":
            with upgraded.connect() as conn:
                ddl = conn.execute(
                    text("SELECT sql FROM sqlite_master WHERE name = 'job_nodes'")
                ).scalar()
                assert "WITHOUT ROWID" in ddl
                assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
        # the upgraded database keeps loading: re-reading the same file changes nothing
        sacct.ingest_text(upgraded, FIXTURES / "sacct_small.txt")
        assert _rows(upgraded, v1) == rows
        # and job_nodes still cascades with its job
        with upgraded.begin() as conn:
            conn.execute(schema.attributions.delete())
            conn.execute(schema.jobs.delete())
            assert conn.execute(text("SELECT count(*) FROM job_nodes")).scalar() == 0
    finally:
        upgraded.dispose()


def test_healthctl_db_upgrade_converts_a_version_1_file(tmp_path):
    from click.testing import CliRunner

    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = _version_1(url, tmp_path)
    _fill(engine, tmp_path)
    rows = _rows(engine)
    result = CliRunner().invoke(cli, ["--db", url, "db", "upgrade"])
    assert result.exit_code == 0, result.output
    engine.dispose()
    v1 = db.engine_for(f"sqlite:///{tmp_path / 'v1-columns.db'}")
    assert db.migrate(v1, 0, _only_v1(tmp_path)) == [1]
    upgraded = db.connect(url, create_missing=True)
    assert _rows(upgraded, v1) == rows
    upgraded.dispose()
    engine.dispose()


def _structure(engine) -> dict:
    """Tables, columns, keys and indexes as the database reports them."""
    insp = inspect(engine)
    out = {}
    for name in sorted(insp.get_table_names()):
        out[name] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(name)],
            "pk": sorted(insp.get_pk_constraint(name)["constrained_columns"]),
            "fks": sorted(
                (tuple(f["constrained_columns"]), f["referred_table"], str(f.get("options")))
                for f in insp.get_foreign_keys(name)
            ),
            "indexes": sorted(
                (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                for i in insp.get_indexes(name)
            ),
            "unique": sorted(tuple(u["column_names"]) for u in insp.get_unique_constraints(name)),
        }
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            for name, ddl in conn.execute(
                text("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
            ):
                out[name]["without_rowid"] = "WITHOUT ROWID" in ddl.upper()
    return out


def test_the_migrations_build_what_schema_py_creates(historian_url):
    engine = db.engine_for(historian_url)
    try:
        db.migrate(engine, 0)
        migrated = _structure(engine)
        schema.metadata.drop_all(engine)
        db.create(engine)
        assert _structure(engine) == migrated
    finally:
        engine.dispose()
