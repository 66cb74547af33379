"""A drain verdict under our own drain whose note in the drain record (slurm_drain.json)
cannot be written is not done with (helper-204's attack, defect 3): it is kept pending for
the next run to record, or, when that save fails too, its events are left unconsumed. Before,
the failure was only logged ("node01 will not be auto-resumed", untrue): the XID line was
consumed and the record stayed auto-resumable for the mount alone, so three clean sweeps
resumed a node whose GPU had fallen off the bus."""

from __future__ import annotations

import errno
import json

import pytest

from rsc_health import actions, nodepath
from rsc_health.node import store
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_drain_keeps_every_cause import drop_checkpoint
from .test_nodepath_faults import node_env  # noqa: F401 - the fixture
from .test_state_dir_read_only import node01_slurm

XID79 = "4,9002,99000002,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"


def _refusing(monkeypatch, *names):
    """write_atomic (actions' and the store's) refuses the files named: a full state disk."""
    real = actions.write_atomic

    def full(path, data, **kw):
        if any(str(path).endswith(n) for n in names):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data, **kw)

    monkeypatch.setattr(actions, "write_atomic", full)
    monkeypatch.setattr(store, "write_atomic", full)
    return real


@pytest.mark.parametrize("pending_too", [False, True], ids=["kept", "not-kept"])
def test_an_xid79_under_our_transient_drain_whose_record_write_fails_is_not_resumed_away(
        node_env, monkeypatch, capsys, pending_too):  # noqa: F811
    """Our drain for /checkpoint (transient) stands. The mount comes back and an XID 79
    arrives; the sweep's note of it in the drain record fails. Kept pending (or, with that
    write refused too, its kmsg line left unread), the next run with a working disk records
    it: the clean sweeps after never resume the node."""
    root = node_env
    monkeypatch.delenv("SLURM_JOB_ID")
    slurm = node01_slurm()
    good = drop_checkpoint(root)
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    assert slurm.calls[0][0] == "drain"
    (root / "proc/mounts").write_text(good)
    (root / "dev/kmsg").open("a").write(XID79)

    names = (actions.DRAIN_STATE_FILE,) + ((nodepath.PENDING_VERDICT_FILE,)
                                           if pending_too else ())
    capsys.readouterr()
    real = _refusing(monkeypatch, *names)
    nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    err = capsys.readouterr().err
    assert "node01 will not be auto-resumed" not in err, err
    pending = root / NODE_STATE / nodepath.PENDING_VERDICT_FILE
    if pending_too:
        assert not pending.exists()
    else:
        kept = json.loads(pending.read_text())
        assert kept["why"] == "unrecorded" and [c["code"] for c in kept["causes"]] == ["xid79"]
    monkeypatch.setattr(actions, "write_atomic", real)  # the disk is back
    monkeypatch.setattr(store, "write_atomic", real)

    slurm.calls.clear()
    for _ in range(4):
        nodepath.run_stage("sweep", slurm_factory=lambda c, d: slurm)
    assert not [c for c in slurm.calls if c[0] in ("resume", "undrain")], slurm.calls
    record = json.loads((root / NODE_STATE / actions.DRAIN_STATE_FILE).read_text())
    assert "xid79" in record["codes"] and not record["auto_resumable"]
    assert not pending.exists()
