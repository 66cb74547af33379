"""A node's /var full while its spool holds a line that is no record (a write torn by a
crash): the torn line's quarantine copy cannot be written, and that must cost only the copy.
Before, the OSError (ENOSPC) ended every flush at that batch after its first chunk committed,
so while the disk stayed full no later record of the node (an XID 79 among them) reached the
historian, flush after flush."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from rsc_health import spool
from rsc_health.historian import schema
from rsc_health.historian.ingest.delivery import deliver
from rsc_health.model import Finding, Severity, Status

T = datetime(2024, 3, 1, 9, 55, tzinfo=UTC)


@pytest.fixture
def full_spool(tmp_path):
    """A spool on a 1 MiB tmpfs: one whole XID 79 record, a torn line, another whole record
    in a second chunk, and the rest of the filesystem filled."""
    point = tmp_path / "var"
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode()[:200]}")
    try:
        sdir = point / "spool"
        first = spool.check_records(
            [Finding("xid", "gpu2", Status.FAIL, Severity.DRAIN_NOW, "Xid 79", code="xid79")],
            node="gpu003", source="sweep", time=T, job_id=None)
        spool.append(sdir, first)
        with open(sdir / spool.PENDING, "ab") as fh:
            fh.write(b'{"kind":"check","node":"gpu003","rea\n')
        later = spool.check_records(
            [Finding("ecc", "gpu0", Status.FAIL, Severity.DRAIN_NOW, "DBE", code="ecc_dbe")],
            node="gpu003", source="sweep", time=T, job_id=None)
        spool.append(sdir, later)
        with open(point / "filler", "wb", buffering=0) as fh:
            try:
                while fh.write(b"\0" * 4096):
                    pass
            except OSError:
                pass
        yield sdir
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_a_full_disk_costs_only_the_quarantine_copy_not_the_nodes_later_records(
        historian, full_spool):
    report = deliver(historian, full_spool, chunk_lines=2)
    with historian.connect() as conn:
        codes = sorted(conn.execute(select(schema.check_results.c.code)).scalars())
    assert codes == ["ecc_dbe", "xid79"]
    assert report.quarantined_count == 1
    assert "could not be kept" in report.summary()
    assert list(full_spool.glob("batch-*")) == []  # done with: not delivered again
    with historian.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.check_results)).scalar() == 2
