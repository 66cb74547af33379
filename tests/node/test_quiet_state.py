"""A run writes a node state file (XID cursor, counter baselines) only when it changes: what is
on disk already says the same thing, made durable by the run that wrote it. A healthy run on a
quiet node pays no fsync for its state; a run that moves any of it still writes it atomically
and syncs the directory once."""

from __future__ import annotations

import os
import stat

import pytest

from rsc_health.engine import COUNTERS_FILE, XID_CURSOR_FILE

from .conftest import bad

STATE = "var/lib/rsc_health"
# What a prolog looks at ([slurm] prolog_families). The sweep's telemetry keeps traffic and
# time baselines that move on every run: its counters.json is written every sweep.
PROLOG = "slurm.prolog_families"
KERNEL_LINE = "6,{seq},36500000000,-;mlx5_core 0000:1a:00.0: port 1 link up\n"


@pytest.fixture
def synced(monkeypatch):
    """What each os.fsync synced: 'dir' or 'file'."""
    calls: list[str] = []
    real = os.fsync

    def fsync(fd):
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def _prolog(node) -> set[str]:
    return set(node.config.get(PROLOG))


def _identity(node, name: str) -> tuple[int, int, bytes]:
    path = node.path(f"{STATE}/{name}")
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, path.read_bytes()


def test_a_healthy_run_on_a_quiet_node_rewrites_no_state_file_and_syncs_nothing(node, synced):
    node.check(only=_prolog(node))  # the first run writes the baselines and the cursor
    before = {name: _identity(node, name) for name in (COUNTERS_FILE, XID_CURSOR_FILE)}
    synced.clear()
    found, _ = node.check(only=_prolog(node))
    assert bad(found) == []
    assert {name: _identity(node, name) for name in before} == before
    assert synced == []


def test_a_counter_that_moves_is_saved_with_one_directory_sync(node, synced):
    node.check(only=_prolog(node))
    counter = node.path("sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error")
    cursor = _identity(node, XID_CURSOR_FILE)
    synced.clear()
    counter.write_text("3\n")
    node.check(only=_prolog(node))
    assert synced == ["file", "dir"]  # the new counters.json, then its name
    assert '"ib/mlx5_0/1/symbol_error": 3' in node.path(f"{STATE}/{COUNTERS_FILE}").read_text()
    assert _identity(node, XID_CURSOR_FILE) == cursor  # no kernel record: cursor untouched


def test_a_new_kernel_log_record_moves_only_the_cursor_and_still_syncs_its_name(node, synced):
    node.check(only=_prolog(node))
    counters = _identity(node, COUNTERS_FILE)
    synced.clear()
    node.append("dev/kmsg", KERNEL_LINE.format(seq=1311))
    node.check(only=_prolog(node))
    assert synced == ["file", "dir"]
    assert '"kmsg_seq": 1311' in node.path(f"{STATE}/{XID_CURSOR_FILE}").read_text()
    assert _identity(node, COUNTERS_FILE) == counters


def test_a_sweep_with_telemetry_still_saves_its_moving_baselines(node, synced):
    node.check()
    synced.clear()
    node.check()
    assert "dir" in synced  # tm/time_ms moved: counters.json written, its name synced


def test_a_corrupt_counters_file_on_a_quiet_node_is_rewritten_whole(node):
    node.check(only=_prolog(node))
    path = node.path(f"{STATE}/{COUNTERS_FILE}")
    path.write_text('{"boot_id": "x", "counters": {"ecc/gpu0/aggregate_corrected": -5}')
    found, _ = node.check(only=_prolog(node))
    assert any(f.family == "checker" and COUNTERS_FILE in f.component for f in found)
    node.check(only=_prolog(node))
    assert '"ecc/gpu0/aggregate_corrected": 0' in path.read_text()
