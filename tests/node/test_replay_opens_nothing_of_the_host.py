"""`healthctl check --from` opens nothing of the machine that replays a snapshot, whatever the
snapshot's config names: [xid] / [sxid] catalog_override (absolute paths there, opened by root:
a snapshot from a bug report naming /dev/watchdog, root's and 0600, passes the catalog's trust
rule and arms the operator's hardware watchdog on open; /proc/kmsg is a destructive read), nor a
replay file given as "/../../x", which the join to the root kept (helper-136). Modelled by a FIFO
of root's, whose open for reading is observable."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health.cli import cli

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "h200-fc-2026-11-29"


# (config section, key, the snapshot record restore_snapshot would point the key at instead;
# an older snapshot has none, and the key is left as the snapshot's config wrote it)
CASES = [("xid", "catalog_override", None), ("sxid", "catalog_override", None),
         ("mounts", "probe_replay_file", "mount_probes"),
         ("telemetry", "clock_replay_file", "telemetry_clock")]


@pytest.mark.parametrize(("section", "key", "record"), CASES,
                         ids=[f"{s}.{k}" for s, k, _ in CASES])
def test_a_replay_opens_no_host_path_the_snapshots_config_names(section, key, record, tmp_path,
                                                               monkeypatch):
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("the catalog trust rule wants a file of root's")
    replays = tmp_path / "t"
    replays.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(replays))
    host = tmp_path / "host"
    host.mkdir(mode=0o755)
    device = host / "watchdog"  # stands for /dev/watchdog: root's, 0600, opening it acts
    os.mkfifo(device, 0o600)
    opened = threading.Event()

    def writer():
        fd = os.open(device, os.O_WRONLY)  # returns once someone opens it for reading
        opened.set()
        os.close(fd)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    doc = json.loads((REAL / "snapshot.json").read_text())
    if record is None:
        doc["config"].setdefault(section, {})[key] = str(device)
    else:  # "under the root": a path that climbs out of it
        doc.pop(record)
        doc["config"].setdefault(section, {})[key] = "/" + "../" * 40 + str(device).lstrip("/")
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps(doc))
    try:
        res = CliRunner().invoke(cli, ["check", "--from", str(snap)])
        t.join(0.5)
        assert not opened.is_set(), (
            f"the replay opened {device}, a path on this machine the snapshot named "
            f"(exit {res.exit_code}): {res.output[-300:]}")
    finally:
        if not opened.is_set():  # let the writer thread go
            fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK)
            t.join(2)
            os.close(fd)
