"""The historian's tables, in SQLAlchemy Core: the contract between ingest, metrics and lemons.

Times are naive UTC `DateTime` everywhere, so SQLite and PostgreSQL compare them the same way.
Migrations that change these tables live in `sql/` and bump `SCHEMA_VERSION`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal_column,
    text,
)
from sqlalchemy.sql.elements import ColumnElement

from rsc_health.model import ROLLED_UP, Metric  # the telemetry vocabulary names the columns

# 3: skipped (reserved during development); 4: the cluster column (0004); 5: check results as
# intervals, node run freshness and daily rollups (0005); 6: the keys of jobs and job_nodes
# compared as bytes on PostgreSQL (0006); 7: the node and GPU inventories (0007); 8:
# qualification runs and results (0008); 9: telemetry samples and rollups (0009); 10: suspect
# nodes (0010); 11: jobs' step times, the slowest rank per node and step (0011); 12:
# gpu_names, the bus id of each node's GPU index (0012); 13: node_versions, each node's driver
# and GPU firmware and when they last changed (0013); 14: the telemetry metrics
# nvlink_data_rate, remapped_rows, remap_low_banks and ib_error_rate (0014); 15:
# node_inventory.gpu_model, the GPU model of a node (0015); 16: the telemetry rollups'
# `sweeps`, a row's sample count kept once (0016); 17: job_exclusions keyed by the job instance
# (job_id, node, time): a reused job id is a new job (0017); 18: jobs.instance_key wide enough
# to name its cluster, for two clusters' jobs with one JobIDRaw:Submit:Start (0018); 19:
# ix_check_results_check_status_time, each check family's first all-clear row by one index
# probe (0019; PostgreSQL builds it CONCURRENTLY, writers go on); 20: job_ends, when each
# node's epilog ran for a job (0020); 21: job_starts, when each node's prolog ran for a job of
# two or more nodes, and which nodes it named (0021).
SCHEMA_VERSION = 21

# Longest record id kept: spool ids are 32 hex characters, imported ids anything up to this.
# Longer ids are refused as bad rows, never cut (cut ids collapse distinct records).
RECORD_ID_LEN = 128

metadata = MetaData()


def key_text(length: int) -> String:
    """Text that is an identifier (a node name, a job id, an instance key): PostgreSQL
    compares it as bytes (COLLATE "C"), as SQLite always does. Equality is the same under any
    collation, but a locale's string comparison costs several times memcmp, and a first
    backfill of a year of accounting spends most of its time sorting these keys into indexes
    (1M jobs: the job_nodes node index 2.0 s -> 1.1 s, the instance key 1.1 s -> 0.8 s)."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


def _first_seen(context):
    return context.get_current_parameters()["time"]


# What nodes reported, as state (version 5): one row per interval in which one (node, check,
# component) kept one state. `time` is when it was first seen, `last_seen` the latest run that
# still saw it; `is_open` while it is the component's current state. A sweep that sees the
# same state only moves `last_seen`, so the table grows with changes, not with sweeps. An
# all-clear family is an interval with component "*" and status ok. Events (each XID is news,
# not a state) and rows imported from other tools are points: time == last_seen, never open.
# `id` is the spool record that opened the interval (or a stable hash of an imported row), so
# redelivery never duplicates a row. Rows from before version 5 became points.
check_results = Table(
    "check_results",
    metadata,
    Column("id", String(RECORD_ID_LEN), primary_key=True),
    Column("time", DateTime, nullable=False),
    Column("node", String(128), nullable=False),
    Column("source", String(16), nullable=False),  # prolog|epilog|sweep|import
    Column("job_id", String(32)),
    Column("check", String(32), nullable=False),  # family: gpu, xid, ecc, remap, nvlink, ...
    Column("component", String(64), nullable=False, default="*"),
    Column("status", String(8), nullable=False),  # ok|warn|fail|error
    Column("severity", String(16), nullable=False, default="none"),
    Column("code", String(32), nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    # Inserted without one (a point in time): the row's own time.
    Column("last_seen", DateTime, nullable=False, default=_first_seen),
    Column("is_open", Boolean, nullable=False, default=False),
    Index("ix_check_results_node_time", "node", "time"),
    Index("ix_check_results_time", "time"),
    # Each family's first all-clear row, one probe (version 19: metrics.deployments).
    Index("ix_check_results_check_status_time", "check", "status", "time"),
    Index("ix_check_results_open", "node", "check", sqlite_where=text("is_open"),
          postgresql_where=text("is_open")),
)


def open_interval() -> ColumnElement[Any]:
    """"The interval is open", as the partial index ix_check_results_open is made on: the bare
    column. PostgreSQL's planner cannot prove that `is_open IS true` (`.is_(True)`) implies
    `is_open`, nor SQLite that `is_open IS 1` or `is_open = 1` (what SQLAlchemy writes for
    the bare Boolean there) does: with them the index was never used. For statements on
    check_results under its own name (not an alias). Untyped, so that no dialect compares
    it with true or 1."""
    return literal_column("check_results.is_open")

# The latest run of each node path entry point on each node (the spool's heartbeat records,
# version 5): what `healthctl status`, `healthctl node` and the report read to name nodes that
# stopped checking or whose checker is broken. One row per (node, source), updated in place.
node_runs = Table(
    "node_runs",
    metadata,
    Column("node", String(128), primary_key=True),
    Column("source", String(16), primary_key=True),  # sweep|prolog|epilog
    Column("last_seen", DateTime, nullable=False),
    Column("level", String(16), nullable=False, default=""),
    Column("checker_errors", Integer, nullable=False, default=0),
    Column("duration_s", Float),
    Column("version", String(32), nullable=False, default=""),
)

# Daily rollups (version 5), kept after the rows behind them are pruned, so the report's cost
# does not grow with the years kept. heartbeat_days: runs per node-day and how many of them
# could not look (checker_error) or asked for a drain.
heartbeat_days = Table(
    "heartbeat_days",
    metadata,
    Column("day", Date, primary_key=True),
    Column("node", String(128), primary_key=True),
    Column("runs", Integer, nullable=False, default=0),
    Column("checker_error_runs", Integer, nullable=False, default=0),
    Column("drain_runs", Integer, nullable=False, default=0),
)

# check_days: failure and warning intervals that began per (day, node, check family).
check_days = Table(
    "check_days",
    metadata,
    Column("day", Date, primary_key=True),
    Column("node", String(128), primary_key=True),
    Column("check", String(32), primary_key=True),
    Column("fail", Integer, nullable=False, default=0),
    Column("warn", Integer, nullable=False, default=0),
)

# One row per job instance: a requeued job has several rows with the same job_id.
jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", key_text(32), nullable=False),  # sacct JobIDRaw
    Column("job_id_display", String(64), nullable=False),  # sacct JobID (1234_7 for arrays)
    Column("name", Text, nullable=False, default=""),
    Column("user", String(64), nullable=False, default=""),
    Column("partition", String(64), nullable=False, default=""),
    Column("state", String(24), nullable=False),  # first word: "CANCELLED by 0" -> CANCELLED
    Column("exit_code", String(16), nullable=False, default=""),
    Column("submit", DateTime, nullable=False),
    Column("eligible", DateTime),
    Column("start", DateTime),
    Column("end", DateTime),
    Column("nnodes", Integer, nullable=False, default=0),
    Column("gpus", Integer, nullable=False, default=0),
    Column("nodelist", Text, nullable=False, default=""),
    # "<JobIDRaw>:<Submit>:<Start or ''>" -- NULLs never collide in a UNIQUE constraint, so the
    # instance key is spelled out; re-ingesting the same sacct row updates, never duplicates.
    # "...@<cluster>" for a job whose plain key another cluster's job holds (version 18,
    # ingest.sacct.own_keys): up to 137 characters. PostgreSQL's VARCHAR(160) since; SQLite
    # keeps the VARCHAR(96) it was made with (it holds text to no declared length).
    Column("instance_key", String(96).with_variant(String(160, collation="C"), "postgresql"),
           nullable=False, unique=True),
    # Which Slurm cluster ran it (version 4): sacct's Cluster, or [historian] cluster; '' for
    # rows from before, until a re-read names it.
    Column("cluster", String(64), nullable=False, default="", server_default=""),
    Index("ix_jobs_end", "end"),
    Index("ix_jobs_job_id", "job_id"),
)

# On SQLite a WITHOUT ROWID table (version 2): its primary key is the only copy of the row, so
# a row is written once instead of twice (table, then key index); millions of rows per year.
job_nodes = Table(
    "job_nodes",
    metadata,
    Column("job_pk", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("node", key_text(128), primary_key=True),
    Index("ix_job_nodes_node", "node"),
    sqlite_with_rowid=False,
)

# Periods a node was out of service (down, drained, fail), from `sacctmgr show event`.
node_events = Table(
    "node_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(128), nullable=False),
    Column("start", DateTime, nullable=False),
    Column("end", DateTime),
    Column("state", String(32), nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    Column("source", String(16), nullable=False, default="sacctmgr"),
    Column("cluster", String(64), nullable=False, default="", server_default=""),  # version 4
    UniqueConstraint("node", "start", "state", name="uq_node_events"),
    Index("ix_node_events_node_start", "node", "start"),
)

# Slurm reservations as slurmdbd keeps them (`sacctmgr show reservation`, version 4): one with
# the MAINT flag makes the outages of its nodes inside it planned maintenance, not theirs.
reservations = Table(
    "reservations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(64), nullable=False, default=""),
    Column("name", String(128), nullable=False),
    Column("start", DateTime, nullable=False),
    Column("end", DateTime),
    Column("flags", Text, nullable=False, default=""),
    Column("nodelist", Text, nullable=False, default=""),
    UniqueConstraint("cluster", "name", "start", name="uq_reservations"),
)

# The fleet the historian had (version 7): each node's in-service intervals, with its cluster
# and partition, imported (`healthctl ingest inventory`, a CSV of node, cluster, partition,
# from, to). `end` NULL: still in service. Exposure (node-days per peer group) is taken from
# here; without rows, the nodes seen in the window stand in for the fleet.
node_inventory = Table(
    "node_inventory",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(128), nullable=False),
    Column("cluster", String(64), nullable=False, default=""),
    Column("partition", String(64), nullable=False, default=""),
    Column("start", DateTime, nullable=False),
    Column("end", DateTime),
    Column("source", String(16), nullable=False, default="csv"),
    # version 15: the node's GPU model ('' unknown), a part of its lemon peer group
    Column("gpu_model", String(64), nullable=False, default="", server_default=""),
    UniqueConstraint("node", "start", name="uq_node_inventory"),
)

# Each GPU's in-service intervals by serial (or UUID) and node (version 7), imported
# (`healthctl ingest gpus`, a CSV of serial, node, slot, from, to): a failure on a node is the
# GPU's too, so a GPU that failed in two nodes is seen, and the node it left is not blamed.
gpu_inventory = Table(
    "gpu_inventory",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("serial", String(64), nullable=False),
    Column("node", String(128), nullable=False),
    Column("slot", String(32), nullable=False, default=""),
    Column("start", DateTime, nullable=False),
    Column("end", DateTime),
    Column("source", String(16), nullable=False, default="csv"),
    UniqueConstraint("serial", "start", name="uq_gpu_inventory"),
    Index("ix_gpu_inventory_node", "node", "start"),
)

tickets = Table(
    "tickets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(128), nullable=False),
    Column("opened", DateTime, nullable=False),
    Column("closed", DateTime),
    Column("reason", Text, nullable=False, default=""),
    Column("source", String(16), nullable=False, default="manual"),  # manual|csv|lemon
    UniqueConstraint("node", "opened", name="uq_tickets_node_opened"),
)

# Nodes a job excluded (the prolog records ExcNodeList): lemon feature excl_jobid_count.
# Keyed by the job instance: `time` is when its prolog recorded them (the job's start), so a
# job whose id Slurm reused is a new job (migration 0017), and a record delivered twice, the
# same time, lands once.
job_exclusions = Table(
    "job_exclusions",
    metadata,
    Column("job_id", String(32), primary_key=True),
    Column("node", String(128), primary_key=True),
    Column("time", DateTime, primary_key=True),
    Index("ix_job_exclusions_node_time", "node", "time"),
)

# When each node's epilog ran for a job (the spool's job_end records, version 20). The jobs
# table learns a job's end at the next `ingest sacct` (hourly): until then a job it last read
# running ends on each node here, and the fail-slow detector judges what the node did after
# it (idle, another job) in no part of it. Keyed like job_exclusions: a record delivered twice
# lands once, a reused job id's later epilog is a row of its own. Kept as long as the samples
# it bounds ([historian] telemetry_retention_days).
job_ends = Table(
    "job_ends",
    metadata,
    Column("node", key_text(128), primary_key=True),
    Column("job_id", key_text(32), primary_key=True),
    Column("time", DateTime, primary_key=True),
    Index("ix_job_ends_time", "time"),
)

# When each node's prolog ran for a job of two or more nodes (the spool's job_start records
# that name the job's nodes, version 21): until `ingest sacct` tells of the job (hourly), the
# fail-slow detector takes it as running on each node whose prolog told, from that time to its
# epilog there (job_ends), once every node it names has told (failslow/load.py). `nnodes` and
# `nodes_digest` are the nodelist's count and a digest of its sorted names, so the nodes of one
# job are known to agree; the list itself is not kept. Keyed like job_ends; kept as long as
# the samples ([historian] telemetry_retention_days).
job_starts = Table(
    "job_starts",
    metadata,
    Column("node", key_text(128), primary_key=True),
    Column("job_id", key_text(32), primary_key=True),
    Column("time", DateTime, primary_key=True),
    Column("nnodes", Integer, nullable=False),
    Column("nodes_digest", String(16), nullable=False),
    Index("ix_job_starts_time", "time"),
)

# What rsc-health itself did in Slurm (drain, resume, requeue, guard), from the node spools.
node_actions = Table(
    "node_actions",
    metadata,
    Column("id", String(RECORD_ID_LEN), primary_key=True),
    Column("time", DateTime, nullable=False),
    Column("node", String(128), nullable=False),
    Column("action", String(24), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("job_id", String(32)),
    Index("ix_node_actions_node_time", "node", "time"),
)

# Why a FAILED / NODE_FAIL job instance failed: one row per (cause, culprit node).
attributions = Table(
    "attributions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_pk", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("node", String(128)),
    Column("cause", String(32), nullable=False),  # check family, node_down or unattributed
    Column("code", String(32), nullable=False, default=""),
    # check_results.id / event id
    Column("evidence", String(RECORD_ID_LEN), nullable=False, default=""),
    Column("kind", String(16), nullable=False),  # check|event|unattributed
    Index("ix_attributions_job", "job_pk"),
    Index("ix_attributions_node", "node"),
)

# Qualification (rsc_health/qualify): one row per run of a tier on a node, and one per metric
# it measured, judged against its peers (same GPU model, driver and slot) at the time.
qualify_runs = Table(
    "qualify_runs",
    metadata,
    Column("run_id", String(RECORD_ID_LEN), primary_key=True),
    Column("node", String(128), nullable=False),
    Column("tier", String(16), nullable=False),
    Column("started", DateTime, nullable=False),
    Column("ended", DateTime, nullable=False),
    Column("verdict", String(16), nullable=False),  # pass | fail | inconclusive
    Column("reason", Text, nullable=False, default=""),
    Column("gpu_model", String(64), nullable=False, default=""),
    Column("driver", String(32), nullable=False, default=""),
    Column("job_id", String(32)),
    Index("ix_qualify_runs_node_ended", "node", "ended"),
)
qualify_results = Table(
    "qualify_results",
    metadata,
    Column("run_id", String(RECORD_ID_LEN),
           ForeignKey("qualify_runs.run_id", ondelete="CASCADE"), primary_key=True),
    Column("test", String(32), primary_key=True),
    Column("metric", String(128), primary_key=True),
    Column("idx", String(32), primary_key=True),  # GPU index or HCA; "" for the node
    Column("value", Float),
    Column("unit", String(16), nullable=False, default=""),
    Column("higher_is_better", Boolean, nullable=False, default=True),
    Column("status", String(16), nullable=False),  # pass | fail | inconclusive
    Column("reason", Text, nullable=False, default=""),
    Column("basis", String(16), nullable=False, default=""),  # peers | baseline | unjudged
    Column("peer_median", Float),
    Column("threshold", Float),
    Column("percentile", Float),
    Column("peers", Integer, nullable=False, default=0),
    Index("ix_qualify_results_metric", "metric", "idx", "status"),
)

# Telemetry (version 9): the node-level samples each sweep spools (checks/telemetry.py, the
# vocabulary of model.Metric), kept [historian] telemetry_retention_days for the fail-slow
# detector. historian/telemetry.load_samples is the one door to them: it gives them as rows
# (node, time, metric, value, component). Stored as one row per (time, node), a value column
# `<metric>` (a 4-byte float on PostgreSQL) and a component column `<metric>_c` per metric,
# NULL for a metric the sweep did not sample: a row per metric (and no node index) was 3.5x
# the bytes on SQLite, 6.5x on PostgreSQL (benchmarks/bench_telemetry_storage.py). Keyed
# by time first, as both the loader's windows and the pruning read them, with an index by
# node; WITHOUT ROWID on SQLite: the key is the table.
def _sample_columns() -> list[Column]:
    return [col for m in Metric for col in (Column(m.value, Float(precision=24)),
                                            Column(f"{m.value}_c", String(32)))]


telemetry_samples = Table(
    "telemetry_samples",
    metadata,
    Column("time", DateTime, primary_key=True),
    Column("node", key_text(128), primary_key=True),
    *_sample_columns(),
    # A job's nodes over its span (the rollups, the detector's per-job reads) without
    # scanning every node's samples of those hours.
    Index("ix_telemetry_samples_node_time", "node", "time"),
    sqlite_with_rowid=False,
)
# Their rollups, kept as the other daily rollups are ([historian] rollup_retention_days): per
# node and multi-node job (through job_nodes, the samples between the job's start and end),
# and per node-day for the samples outside such jobs. One row per (job or day, node), a group
# of columns per metric of the vocabulary, `<metric>_<stat>`: n samples, their mean, min and
# max, `past` of them beyond the metric's warn threshold ([telemetry] warn_above /
# warn_below: the fraction is past / n) and `worst`, the component that was the worst most
# often; all NULL for a metric the node did not report. Wide, not a row per metric, and the
# figures as 4-byte floats on PostgreSQL: a fleet of 16,000 nodes writes about 47,000 of
# these rows a day (benchmarks/bench_telemetry_storage.py; a row per metric was 1.8x the
# bytes on SQLite, 3.5x on PostgreSQL). A metric added to the vocabulary is a migration
# adding its columns; the levels (model.LEVELS) have none here.
ROLLUP_STATS: tuple[tuple[str, Any], ...] = (
    ("n", Integer), ("mean", Float(precision=24)), ("min", Float(precision=24)),
    ("max", Float(precision=24)), ("past", Integer), ("worst", String(16)),
)


def _rollup_columns() -> list[Column]:
    return [Column(f"{m.value}_{stat}", kind) for m in ROLLED_UP for stat, kind in ROLLUP_STATS]


telemetry_job_rollups = Table(
    "telemetry_job_rollups",
    metadata,
    Column("job_pk", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("node", key_text(128), primary_key=True),
    *_rollup_columns(),
    Column("sweeps", Integer),  # 0016: a metric's _n is NULL when it equals this
    sqlite_with_rowid=False,
)
telemetry_day_rollups = Table(
    "telemetry_day_rollups",
    metadata,
    Column("day", Date, primary_key=True),
    Column("node", key_text(128), primary_key=True),
    *_rollup_columns(),
    Column("sweeps", Integer),  # 0016
    sqlite_with_rowid=False,
)

# Step (or section) times jobs report (version 11; `healthctl ingest steps`, docs/failslow.md):
# untrusted input that can make a node a fail-slow suspect, never drain it. One row per job,
# node, stage and step: the node's slowest rank in that step (`rank`, `seconds`), so a node of 8
# ranks costs one row, not 8. `stage` is the peer group inside the job (a pipeline stage, ""
# when one; NVRx sections are "section:NAME", its GPU score "gpu"); `unit` "s" (seconds a
# step) or "rel" (time relative to the job's fastest rank: NVRx's relative score inverted).
step_times = Table(
    "step_times",
    metadata,
    Column("job_id", key_text(32), primary_key=True),
    Column("node", key_text(128), primary_key=True),
    Column("stage", key_text(64), primary_key=True),
    Column("step", BigInteger, primary_key=True),
    Column("rank", Integer, nullable=False),
    Column("time", DateTime, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("unit", String(8), nullable=False, default="s"),
    Index("ix_step_times_time", "time"),
)

# Suspect nodes (version 10, rsc_health/suspects.py): one row per episode. A node is suspect
# while its row's state is "suspect"; evidence renews `last_evidence` and `expires`; the episode
# ends cleared (a qualification pass, or a person), confirmed (qualification failed: drained),
# or expired (no evidence for [suspects] expire_after_h). `changed_by`/`change_reason` say who
# ended it and why; `tier` is what the Slurm tier did with it: "" (not yet), applied, shadow
# (shadow mode: recorded only), held (over the guard's cap), person (a person's drain or DOWN
# on the node: left alone), and for an ended one returned (its marks given back or gone);
# `slurm_weight` the node's weight before the tier raised it.
suspects = Table(
    "suspects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(128), nullable=False),
    Column("state", String(16), nullable=False),
    Column("since", DateTime, nullable=False),
    Column("last_evidence", DateTime, nullable=False),
    Column("expires", DateTime, nullable=False),
    Column("metric", String(64), nullable=False),
    Column("value", Float),
    Column("peer_median", Float),
    Column("deviation", Float),
    Column("job_ids", Text, nullable=False, default=""),
    Column("source", String(16), nullable=False),
    Column("detail", Text, nullable=False, default=""),
    Column("changed", DateTime, nullable=False),
    Column("changed_by", String(64), nullable=False, default=""),
    Column("change_reason", Text, nullable=False, default=""),
    Column("tier", String(16), nullable=False, default=""),
    Column("slurm_weight", Integer),
    Index("ix_suspects_node_state", "node", "state"),
    Index("ix_suspects_state", "state"),
    # At most one open episode per node, whatever two passes at once do.
    Index("ux_suspects_open", "node", unique=True, sqlite_where=text("state = 'suspect'"),
          postgresql_where=text("state = 'suspect'")),
)

ingest_cursors = Table(
    "ingest_cursors",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
)


# Version 12: the bus id of each GPU index, per node, as the node's latest heartbeat said it
# (rsc_health.gpuname): findings name a GPU by one half (gpu1, or 0000:1a:00 when NVML could
# not map it); the report and `healthctl node` show both halves, `gpu1 (0000:1a:00.0)`.
gpu_names = Table(
    "gpu_names",
    metadata,
    Column("node", String(128), primary_key=True),
    Column("idx", Integer, primary_key=True, autoincrement=False),
    Column("bus_id", String(32), nullable=False),
    Column("last_seen", DateTime, nullable=False),
)


# Version 13: each node's driver and GPU firmware as its heartbeats said them (the canonical
# text of rsc_health.historian.versions), since when, and what they were before: a change
# makes the node due for qualification ([qualify] on_driver_change). One row per node.
node_versions = Table(
    "node_versions",
    metadata,
    Column("node", key_text(128), primary_key=True),
    Column("versions", String(512), nullable=False),
    Column("since", DateTime, nullable=False),
    Column("last_seen", DateTime, nullable=False),
    Column("previous", String(512), nullable=True),
)
