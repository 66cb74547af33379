"""A simulated fleet in a historian: the one way the lab gets there.

`healthctl demo`, the lemon tuning, the benchmarks and the tests all need the same thing: a
fleet simulated into a directory, its files ingested into a historian exactly as an operator's
`healthctl ingest` would (sacct, node events, health checks, exclusions, tickets, and the
nodes' last heartbeats as each node's `spool flush` delivers them), and the job failures
attributed. `ingest_fleet` is that ingest, `simulated_historian` the whole chain.

Only product code runs here; nothing in the product imports this module (the lab is apart:
tests/unit/test_lab_apart.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine

from rsc_health.sim.config import SimConfig
from rsc_health.sim.core import SimResult, simulate


@dataclass(frozen=True)
class SimulatedHistorian:
    """A simulated fleet's directory, the historian it went into and the simulator's truth."""

    sim: SimResult
    url: str
    truth: dict
    as_of: datetime  # the end of the simulated period: what a nightly run there would see

    @property
    def out(self) -> Path:
        return self.sim.out_dir


def truth_of(sim_dir: Path) -> tuple[dict, datetime]:
    """truth.json of a simulated fleet, and the end of its simulated period."""
    truth = json.loads((Path(sim_dir) / "truth.json").read_text())
    return truth, datetime.fromisoformat(truth["start"]) + timedelta(days=truth["days"])


def fresh_sqlite(path: Path) -> str:
    """The URL of an empty SQLite historian at `path` (an earlier run's file and its WAL gone)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def ingest_fleet(engine: Engine, sim_dir: Path, *,
                 gpus_per_node: int | None = None) -> dict[str, float]:
    """Ingest a simulated fleet's files, as `healthctl ingest` and the nodes' spool flush do;
    return the seconds each took (by file name; "spool" for the heartbeats' delivery)."""
    from rsc_health.historian.ingest import checks, events, exclusions, sacct, tickets
    from rsc_health.historian.ingest.delivery import deliver

    sim_dir = Path(sim_dir)
    def ingest_sacct(path: Path) -> object:
        if gpus_per_node is None:
            return sacct.ingest_text(engine, path)
        return sacct.ingest_text(engine, path, gpus_per_node=gpus_per_node)

    steps: list[tuple[str, Callable[[Path], object]]] = [
        ("sacct.txt", ingest_sacct),
        ("events.txt", lambda p: events.ingest_file(engine, p)),
        ("checks.jsonl", lambda p: checks.ingest_file(engine, p)),
        ("exclusions.jsonl", lambda p: exclusions.ingest_file(engine, p)),
        ("tickets.csv", lambda p: tickets.import_csv(engine, p)),
        ("spool", lambda p: deliver(engine, p) if p.is_dir() else None),
    ]
    seconds: dict[str, float] = {}
    for name, ingest in steps:
        t0 = time.perf_counter()
        ingest(sim_dir / name)
        seconds[name] = time.perf_counter() - t0
    return seconds


def simulated_historian(sim_cfg: SimConfig, out: Path, *, url: str | None = None,
                        progress=None) -> SimulatedHistorian:
    """Simulate `sim_cfg` into `out`, ingest it into `url` (default: a fresh
    `out/historian.db`; the schema is created when the database is empty) and attribute."""
    from rsc_health.historian import db as hdb
    from rsc_health.historian.attribute import attribute

    say = progress or (lambda _msg: None)
    out = Path(out)
    say(f"simulating {sim_cfg.nodes} nodes x {sim_cfg.days:g} days (seed {sim_cfg.seed})")
    sim = simulate(sim_cfg, out)
    url = url or fresh_sqlite(out / "historian.db")
    engine = hdb.connect(url, create_missing=True)
    try:
        say(f"seed {sim_cfg.seed}: ingesting and attributing")
        ingest_fleet(engine, out)
        attribute(engine)
    finally:
        engine.dispose()
    truth, as_of = truth_of(out)
    return SimulatedHistorian(sim, url, truth, as_of)
