"""`healthctl node NODE` shows the node's telemetry rollups (its latest multi-node job and its
latest day outside jobs: throttle fractions, clocks against their maximum, power against its
limit, temperatures, PCIe link against its maximum, replay rates) beside its suspect evidence;
garbled, negative and huge values and hostile node names break neither it nor detection."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from rsc_health import spool
from rsc_health.cli import AppContext
from rsc_health.commands.nodeview import node as node_cmd
from rsc_health.config import load_config
from rsc_health.historian import db, schema
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.historian.telemetry import rollup

CFG = load_config(None)
HOSTILE = 'g"q\\uo{te},x=y\u00e9'
NODES = [f"g{i:03d}" for i in range(8)]


def _record(node: str, when: datetime, metrics: dict) -> dict:
    return spool.record("telemetry", node, when.replace(tzinfo=UTC), source="sweep",
                        job_id=None, interval_s=300.0,
                        metrics={m: {"value": v, "component": c} for m, (v, c) in
                                 metrics.items()})


def _job(engine, pk: int, nodes: list[str], start, end) -> None:
    with engine.begin() as conn:
        conn.execute(schema.jobs.insert().values(
            id=pk, job_id=str(pk), job_id_display=str(pk), state="COMPLETED",
            submit=start, start=start, end=end, nnodes=len(nodes), gpus=8 * len(nodes),
            nodelist=",".join(nodes), instance_key=f"{pk}:{start}:{start}"))
        conn.execute(schema.job_nodes.insert(), [{"job_pk": pk, "node": n} for n in nodes])


def _healthy(i: int) -> dict:
    return {"sm_clock_ratio": (0.97, "gpu0"), "throttle_hw_frac": (0.0, "gpu0"),
            "throttle_power_frac": (0.1, "gpu2"), "gpu_temp_c": (64.0 + i % 3, "gpu1"),
            "power_ratio": (0.8, "gpu4"), "pcie_link_ratio": (1.0, "gpu0"),
            "pcie_replay_rate": (0.0, "gpu0"), "ib_xmit_wait_rate": (5e5, "mlx5_0:1")}


@pytest.fixture
def fleet(tmp_path):
    """Eight nodes (and one with a hostile name) in a job that ended two hours ago, g005 with
    a GPU stuck in HW slowdown and a PCIe link at x8 for its last 40 minutes; a day of samples
    outside jobs three days ago; and records at the edges of each metric's range from g006 and
    the hostile-named node (impossible ones from g006, refused at delivery)."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = db.connect(url, upgrade=True, create_missing=True)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0, second=0)
    start, end = now - timedelta(hours=3), now - timedelta(hours=2)
    _job(engine, 41, [*NODES, HOSTILE], start, end)
    records = []
    for k in range(12):
        t = start + timedelta(minutes=2 + 5 * k)
        for i, node in enumerate([*NODES, HOSTILE]):  # every member reports (core.delivered)
            m = _healthy(i)
            if node == "g005" and k >= 4:
                m.update(sm_clock_ratio=(0.52, "gpu6"), throttle_hw_frac=(0.8, "gpu6"),
                         pcie_link_ratio=(0.5, "gpu3"), gpu_temp_c=(81.0, "gpu6"))
            records.append(_record(node, t, m))
    day = datetime.combine((now - timedelta(days=3)).date(), datetime.min.time())
    for k in range(6):
        records.append(_record("g005", day + timedelta(hours=4 * k), _healthy(5)))
    # At the edges of what each metric can be, with hostile components: what a broken node
    # path or a hostile writer could spool and the delivery still takes.
    garbled = {"sm_clock_ratio": (0.0, "gpu0"), "throttle_hw_frac": (1.0, "gpu\n1"),
               "gpu_temp_c": (199.0, "x" * 200), "power_ratio": (1e-300, ""),
               "ib_xmit_wait_rate": (9.9e29, 'p"ort')}
    # Finite but impossible (a negative ratio, a temperature of 1e29): refused with their
    # record at delivery (model.RANGES), as a NaN is.
    impossible = {"sm_clock_ratio": (-3.0, "gpu0"), "gpu_temp_c": (9.9e29, "gpu1")}
    for k in range(3):
        t = start + timedelta(minutes=4 + 5 * k)  # between g006's own sweeps
        records.append(_record("g006", t, garbled))
        records.append(_record(HOSTILE, t, garbled))
        records.append(_record("g006", t + timedelta(seconds=30), impossible))
    report = deliver(engine, _spool(tmp_path, records))
    assert report.quarantined_count == 3
    rolled = rollup(engine, now, CFG)
    assert rolled.jobs == 1 and rolled.days >= 1
    yield engine, now
    engine.dispose()


def _spool(tmp_path, records):
    sdir = tmp_path / "spool"
    spool.append(sdir, records)
    return sdir


def _obj(engine, tmp_path) -> AppContext:
    config = tmp_path / "cli.toml"
    config.write_text("")
    return AppContext(config_path=str(config), db_url=str(engine.url))


def test_a_node_shows_its_last_jobs_telemetry_rollup_and_its_last_day_outside_jobs(
        fleet, tmp_path):
    engine, _now = fleet
    out = CliRunner().invoke(node_cmd, ["g005"], obj=_obj(engine, tmp_path))
    assert out.exit_code == 0, out.output
    text = out.output
    assert "telemetry last multi-node job 41" in text
    clock = [line for line in text.splitlines() if "SM clock / max" in line][0]
    # 8 of its 12 sweeps at 0.52, 4 at 0.97: mean 0.67, two thirds under the 0.6 warn line
    assert "mean     0.67" in clock and "min     0.52" in clock and "max     0.97" in clock
    assert "(12 samples)  67% under 0.6  worst gpu6" in clock
    pcie = [line for line in text.splitlines() if "PCIe gen x width / max" in line][0]
    assert "min      0.5" in pcie and "67% under 1" in pcie and "worst gpu3" in pcie
    [temp] = [line for line in text.splitlines() if "GPU temperature" in line][:1]
    assert "max       81" in temp and "0% over 85" in temp
    assert "telemetry last day outside jobs" in text
    doc = json.loads(CliRunner().invoke(node_cmd, ["g005", "--json"],
                                        obj=_obj(engine, tmp_path)).output)
    tel = doc["historian"]["telemetry"]
    job = tel["job"]["metrics"]
    assert tel["job"]["job_id"] == "41"
    assert job["throttle_hw_frac"]["max"] == pytest.approx(0.8)
    assert job["throttle_hw_frac"]["past_frac"] == pytest.approx(8 / 12)
    assert job["power_ratio"]["mean"] == pytest.approx(0.8)
    assert job["gpu_temp_c"]["max"] == pytest.approx(81.0)
    assert tel["day"]["metrics"]["sm_clock_ratio"]["n"] == 6
    quiet = json.loads(CliRunner().invoke(node_cmd, ["g001", "--json"],
                                          obj=_obj(engine, tmp_path)).output)
    assert quiet["historian"]["telemetry"]["job"]["metrics"]["sm_clock_ratio"]["past"] == 0
    assert quiet["historian"]["telemetry"]["day"] is None
    never = CliRunner().invoke(node_cmd, ["nosuch"], obj=_obj(engine, tmp_path))
    # A name the historian has no record of exits 1, its empty sections still shown.
    assert never.exit_code == 1 and "telemetry no rollups" in never.output
    assert "historian has no record of this node" in never.output


def test_garbled_negative_huge_values_and_a_hostile_name_break_neither_view_nor_detection(
        fleet, tmp_path):
    from rsc_health.historian.failslow import detect

    engine, now = fleet
    for name in ("g006", HOSTILE):
        out = CliRunner().invoke(node_cmd, [name], obj=_obj(engine, tmp_path))
        assert out.exit_code == 0, out.output
        assert "telemetry last multi-node job" in out.output
        doc = json.loads(CliRunner().invoke(node_cmd, [name, "--json"],
                                            obj=_obj(engine, tmp_path)).output)
        got = doc["historian"]["telemetry"]["job"]["metrics"]
        assert got["gpu_temp_c"]["max"] == pytest.approx(199.0)
        assert got["sm_clock_ratio"]["min"] == 0.0
        assert len(got["gpu_temp_c"]["worst"]) <= 16
    # The detector reads the same samples at the job's end: the slow node is found, the
    # garbled ones do not crash it (they may be outliers: their values are absurd).
    found = detect(engine, now - timedelta(hours=2), CFG)
    assert "g005" in {e.node for e in found}
    assert {e.node for e in found} <= {"g005", "g006"}
