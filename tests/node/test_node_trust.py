"""The node path at 3 a.m. (issue 11): a manual check does not blind the sweep, every source is
bounded, a checker fault is never a hardware verdict, and nothing is forgotten or doubled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsc_health import engine, nodepath, spool
from rsc_health.collect import kmsg
from rsc_health.model import Level, Status
from tests.fixtures.nodes.node_copy import NODE_STATE

REPO = Path(__file__).resolve().parents[2]
XID79 = "4,{seq},99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"


def _xid(node, seq: int = 5000) -> None:
    node.append("dev/kmsg", XID79.format(seq=seq))


def test_a_manual_check_between_sweeps_does_not_hide_an_xid(node):
    node.check()  # a sweep: baselines and cursor saved
    _xid(node)
    manual = engine.run(node.config, node.root, save_state=False)
    assert any(f.code == "xid79" for f in manual)
    after = engine.run(node.config, node.root, save_state=True)  # the next sweep
    assert any(f.code == "xid79" for f in after)
    assert not any(f.code == "xid79" for f in engine.run(node.config, node.root))


def test_rising_ib_counters_seen_by_a_manual_check_stay_news_for_the_sweep(node):
    node.check()
    counter = "sys/class/infiniband/mlx5_0/ports/1/counters/link_downed"
    node.write(counter, "7\n")
    assert any(f.code == "ib_link_downed" for f in engine.run(node.config, node.root,
                                                              save_state=False))
    assert any(f.code == "ib_link_downed" for f in engine.run(node.config, node.root))


def test_a_fifo_kernel_log_source_is_refused_without_blocking(node):
    fifo = node.path("var/log/kern.fifo")
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    cfg = node.config
    cfg.data["xid"]["sources"] = ["/dev/kmsg", "/var/log/kern.fifo"]
    started = time.monotonic()
    findings = engine.run(cfg, node.root, only={"xid"}, save_state=False)
    assert time.monotonic() - started < 5
    errors = [f for f in findings if f.status is Status.ERROR]
    assert errors and "not a regular file" in errors[0].reason


def test_a_megabyte_adversarial_kernel_log_line_parses_in_linear_time():
    # The XID 154 shape that made the old pattern backtrack for minutes, 1 MB long.
    line = ("4,1,1,-;NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed from "
            + "0x0 (None) to " * 70000 + "(" * 20000)
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            "from rsc_health.collect import kmsg; import time; t=time.monotonic(); "
            "kmsg.parse_text(sys.stdin.read()); print(time.monotonic()-t)")
    out = subprocess.run([sys.executable, "-c", code], input=line * 2, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 30  # the old pattern did not finish 200 kB in 5 minutes


def test_mig_xid_lines_are_read_and_nvswitch_sxid_lines_are_not():
    mig = kmsg.parse_line("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=9, name=x, Contained")
    ci = kmsg.parse_line("NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 79, GPU has fallen")
    sxid = kmsg.parse_line("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal")
    assert (mig.xid, mig.pci, mig.mig) == (94, "0000:01:00", "GPU-I:05")
    assert (ci.xid, ci.mig) == (79, "GPU-I:05 GPU-CI:01")
    assert sxid is None


@pytest.mark.parametrize("bad", ['{"boot_id": "%s", "kmsg_seq": 1e30}',
                                 '{"boot_id": "%s", "kmsg_seq": "many"}',
                                 '{"boot_id": "%s", "kmsg_seq": 99999999}', "not json"])
def test_a_corrupt_or_stale_cursor_never_hides_later_xids(node, bad):
    node.check()
    boot = node.path("proc/sys/kernel/random/boot_id").read_text().strip()
    cursor = node.path(f"{NODE_STATE}/xid_cursor.json")
    cursor.write_text(bad % boot if "%s" in bad else bad)
    first = engine.run(node.config, node.root)
    assert not any(f.code == "xid79" for f in first)  # nothing old judged twice
    _xid(node, seq=1_000_000_000)
    assert any(f.code == "xid79" for f in engine.run(node.config, node.root))


def test_a_corrupt_counters_file_costs_one_sweep_not_every_sweep(node):
    node.check()
    node.path(f"{NODE_STATE}/counters.json").write_text(
        '{"boot_id": 5, "counters": {"ib/mlx5_0/1/link_downed": "x", "a": -3}}')
    for _ in range(2):
        findings = engine.run(node.config, node.root)
        assert not [f for f in findings if f.status is Status.ERROR]


@pytest.mark.parametrize("state", ["", "garbage", "4:"])
def test_an_empty_or_garbled_ib_state_is_a_checker_error_not_a_drain(node, state):
    node.write("sys/class/infiniband/mlx5_3/ports/1/state", state)
    findings, verdict = node.check(only={"infiniband"})
    assert verdict.level is Level.CHECKER_ERROR
    assert not [f for f in findings if f.code == "ib_down"]


def test_wrongly_typed_nvml_answers_are_a_checker_error(node):
    node.nvml(lambda doc: doc.update(device_count="8"))
    findings, verdict = node.check(only={"gpu"})
    assert verdict.level is Level.CHECKER_ERROR


def test_nvml_permission_refused_is_a_checker_error(node):
    node.nvml(lambda doc: doc.clear() or doc.update(error="NVML_ERROR_NO_PERMISSION"))
    _, verdict = node.check(only={"gpu"})
    assert verdict.level is Level.CHECKER_ERROR


def test_an_unreadable_mount_table_is_a_checker_error(node):
    node.path("proc/mounts").unlink()
    findings, verdict = node.check(only={"mount"})
    assert verdict.level is Level.CHECKER_ERROR
    assert not [f for f in findings if f.family == "mount"]


@pytest.mark.parametrize("text", ["", "garbage\n\x00\x00\n", "proc /proc proc rw 0 0\n"],
                         ids=["empty", "garbled", "no_root"])
def test_a_mount_table_without_a_root_mount_is_a_checker_error_not_every_mount_missing(
        node, text):
    """Every live mount table has "/": an empty or garbled one (mountinfo too) was read as
    "nothing mounted" and drained a healthy node now for every expected mount."""
    node.write("proc/mounts", text)
    findings, verdict = node.check(only={"mount"})
    assert verdict.level is Level.CHECKER_ERROR
    assert not [f for f in findings if f.code == "mount_missing"]


def test_the_lifetime_ecc_count_is_not_news_after_a_reboot(node):
    node.check()
    node.nvml(lambda doc: doc["devices"][2]["ecc"]["aggregate"].update(uncorrected=2))
    node.write("proc/sys/kernel/random/boot_id", "11111111-2222-3333-4444-555555555555\n")
    findings, _ = node.check(only={"ecc"})
    assert not [f for f in findings if f.code == "ecc_dbe"]


def test_a_copytruncated_log_refilled_past_the_offset_loses_no_xid(node):
    log = node.path("var/log/kern.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("Nov 21 03:14:15 n kernel: boot line one of many " + "x" * 200 + "\n")
    cfg = node.config
    cfg.data["xid"]["sources"] = ["/var/log/kern.log"]
    engine.run(cfg, node.root, only={"xid"})
    # logrotate copytruncate, then the driver writes more than the old offset before the sweep
    log.write_text("Nov 21 04:00:00 n kernel: NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen "
                   "off the bus. " + "y" * 300 + "\n")
    assert any(f.code == "xid79" for f in engine.run(cfg, node.root, only={"xid"}))


def test_the_same_xid_read_again_gets_the_same_record_id(node):
    node.check()
    _xid(node)
    cfg = node.config
    one = engine.run(cfg, node.root, save_state=False)
    two = engine.run(cfg, node.root, save_state=False)  # the cursor could not be saved
    ids = [
        [r["id"] for r in spool.check_records(f, node="n1", source="sweep", time=node_time(),
                                              job_id=None) if r["code"] == "xid79"]
        for f in (one, two)
    ]
    assert ids[0] and ids[0] == ids[1]


def node_time():
    from rsc_health.model import utcnow

    return utcnow()


def test_a_full_disk_spool_append_leaves_no_half_record(tmp_path, monkeypatch):
    sdir = tmp_path / "spool"
    spool.append(sdir, [{"kind": "check", "n": 1}])
    before = (sdir / spool.PENDING).read_bytes()
    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data)[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError):
        spool.append(sdir, [{"kind": "check", "n": i} for i in range(100)])
    monkeypatch.setattr(os, "write", real_write)
    assert (sdir / spool.PENDING).read_bytes() == before


def test_an_unwritable_spool_does_not_consume_the_xid(node, monkeypatch):
    """Five sweeps that cannot spool leave the XID unjudged (cursor not advanced); once the
    spool works it is recorded, under the id it would have had all along."""
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(node.root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(node.root / "config.toml"))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    monkeypatch.setattr(nodepath, "_act", lambda ctx, verdict, pending, **kw: (0, False))
    nodepath.main(["sweep"])
    _xid(node)
    real = spool.append

    def refuse(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool, "append", refuse)
    for _ in range(5):
        assert nodepath.main(["sweep"]) == 0
    monkeypatch.setattr(spool, "append", real)
    nodepath.main(["sweep"])
    nodepath.main(["sweep"])
    lines = node.path(f"{NODE_STATE}/spool/pending.jsonl").read_text().splitlines()
    xids = [json.loads(x) for x in lines if '"xid79"' in x]
    assert len(xids) == 1


def test_shadow_mode_records_what_would_have_drained_and_asks_slurm_nothing(node, monkeypatch):
    site = node.path("site.toml")
    site.write_text(node.path("config.toml").read_text()
                    + '\n[actions]\nenabled = false\n[slurm]\nbin_dir = "/nonexistent"\n')
    monkeypatch.setenv("RSC_HEALTH_ROOT", str(node.root))
    monkeypatch.setenv("RSC_HEALTH_CONFIG", str(site))
    monkeypatch.setenv("SLURMD_NODENAME", "node01")
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    _xid(node)
    assert nodepath.main(["prolog"]) == 0  # the job runs
    lines = node.path(f"{NODE_STATE}/spool/pending.jsonl").read_text().splitlines()
    actions = [json.loads(x) for x in lines if '"kind":"action"' in x]
    assert [(a["action"], a["reason"][:21]) for a in actions] == [
        ("would_drain", "rsc_health:now:xid79:")]
