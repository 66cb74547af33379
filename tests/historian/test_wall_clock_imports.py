"""Issue 23 item 7: `--tz` on every wall-clock import, not only `ingest events`. A ticket
system's or an inventory's CSV export writes local times without an offset; taken as UTC they
sit hours off the node events they belong with. Each import says how it read the times."""

from __future__ import annotations

from datetime import datetime

from click.testing import CliRunner
from sqlalchemy import select

from rsc_health.cli import cli
from rsc_health.historian import schema
from rsc_health.historian.db import connect

# The night Berlin moves from CET (+1) to CEST (+2): 01:30 is +1, 03:30 is +2.
TICKETS = ("node,opened,closed,reason\n"
           "n1,2026-03-29T01:30:00,2026-03-29T03:30:00,psu\n"
           "n2,2026-01-10T12:00:00Z,,dimm\n")  # an explicit offset keeps its own zone
INVENTORY = "node,cluster,partition,from,to\nn1,c,p,2026-07-01T08:00:00,2026-07-02T08:00:00\n"
GPUS = "serial,node,slot,from,to\n1320219050012,n1,0,2026-07-01T08:00:00,\n"


def _run(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--db", url, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_ticket_import_reads_local_times_in_tz_across_a_dst_change(tmp_path, historian_url):
    path = tmp_path / "tickets.csv"
    path.write_text(TICKETS)
    out = _run(historian_url, "ticket", "import", "--file", str(path), "--tz", "Europe/Berlin")
    assert "times read as Europe/Berlin" in out
    engine = connect(historian_url, create_missing=True)
    with engine.connect() as conn:
        rows = {r.node: r for r in conn.execute(select(schema.tickets))}
    engine.dispose()
    assert rows["n1"].opened == datetime(2026, 3, 29, 0, 30)  # CET
    assert rows["n1"].closed == datetime(2026, 3, 29, 1, 30)  # CEST
    assert rows["n2"].opened == datetime(2026, 1, 10, 12, 0)  # said Z: UTC whatever --tz


def test_inventory_and_gpu_imports_take_tz_and_say_utc_without_it(tmp_path, historian_url):
    inv, gpus = tmp_path / "inv.csv", tmp_path / "gpus.csv"
    inv.write_text(INVENTORY)
    gpus.write_text(GPUS)
    assert "times read as America/Denver" in _run(
        historian_url, "ingest", "inventory", "--file", str(inv), "--tz", "America/Denver")
    assert "times read as UTC" in _run(historian_url, "ingest", "gpus", "--file", str(gpus))
    engine = connect(historian_url, create_missing=True)
    with engine.connect() as conn:
        node = conn.execute(select(schema.node_inventory)).one()
        gpu = conn.execute(select(schema.gpu_inventory)).one()
    engine.dispose()
    assert (node.start, node.end) == (datetime(2026, 7, 1, 14), datetime(2026, 7, 2, 14))  # MDT
    assert gpu.start == datetime(2026, 7, 1, 8)


def test_a_zone_that_does_not_exist_is_a_usage_error_and_nothing_lands(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    path = tmp_path / "tickets.csv"
    path.write_text(TICKETS)
    result = CliRunner().invoke(cli, ["--db", url, "ticket", "import", "--file", str(path),
                                      "--tz", "Mars/Olympus"])
    assert result.exit_code == 2, result.output
    assert "not a time zone" in result.output
    engine = connect(url, create_missing=True)
    with engine.connect() as conn:
        assert conn.execute(select(schema.tickets)).all() == []
    engine.dispose()
