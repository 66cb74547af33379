"""A drain verdict the node path cannot carry out (slurmctld away, someone else's drain
holding it) is kept in pending_verdict.json for the next run, because the kernel-log cursor
moves past the XID behind it. When that file cannot be written (the disk filled between the
spool's write and the verdict's: ENOSPC), the events that gave the verdict are not consumed
either: the next run reads the XID again and drains (found by helper-96: the cursor was
committed before the verdict was acted on, and the drain was lost for good)."""

from __future__ import annotations

import errno
from datetime import UTC, datetime

import pytest

from rsc_health import nodepath
from rsc_health.node import store
from tests.node.test_nodepath_faults import XID79, _records, node_env  # noqa: F401 - fixture
from tests.node.test_state_dir_read_only import NODE, node01_slurm, slurm_away


@pytest.fixture
def verdict_file_full(monkeypatch):
    """The disk full for pending_verdict.json alone; calling the result gives space back."""
    real = store.write_atomic

    def full_for_the_verdict(path, data, **kw):
        if str(path).endswith(store.PENDING_VERDICT_FILE):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, **kw)

    monkeypatch.setattr(store, "write_atomic", full_for_the_verdict)
    return lambda: monkeypatch.setattr(store, "write_atomic", real)


def _last_beat(root) -> dict:
    return [r for r in _records(root) if r["kind"] == "heartbeat"][-1]


def test_a_drain_verdict_the_disk_would_not_keep_is_not_lost_with_its_xid(
        node_env, verdict_file_full):  # noqa: F811 - pytest fixture by name
    up = node01_slurm()
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: up) == 0
    with (node_env / "dev/kmsg").open("a") as fh:
        fh.write(XID79)

    away = slurm_away()
    nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: away)
    assert _last_beat(node_env)["level"] == "drain_now"

    verdict_file_full()  # space again, slurmctld back
    back = node01_slurm()
    nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: back)
    assert _last_beat(node_env)["level"] == "drain_now", (
        "the XID 79 verdict was lost: the node is judged clean and stays in service")
    assert back.calls[0][0] == "drain" and "xid79" in back.calls[0][2]


def test_a_verdict_held_under_a_persons_drain_the_disk_would_not_keep_is_found_again(
        node_env, verdict_file_full, monkeypatch):  # noqa: F811 - pytest fixture by name
    monkeypatch.delenv("SLURM_JOB_ID")
    slurm = node01_slurm()
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    slurm.set_state(NODE, "MIXED+DRAIN", "alice: BIOS update", user="alice",
                    when=datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    with (node_env / "dev/kmsg").open("a") as fh:
        fh.write(XID79)
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    assert slurm.calls == []  # the person's drain stands: held, not drained over
    assert not (node_env / store.PENDING_VERDICT_FILE).exists()

    verdict_file_full()
    slurm.resume(NODE)  # the person is done; the next sweep drains for the XID
    slurm.calls.clear()
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0
    assert slurm.calls[0][0] == "drain" and "xid79" in slurm.calls[0][2]
