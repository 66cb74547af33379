"""The /dev/kmsg cursor is the boot id and the kernel's sequence number: a record is new when
its seq is past the cursor's and the boot is the cursor's. Where the boot id cannot be read
(/proc/sys/kernel/random/boot_id missing from a container's /proc, a --root snapshot), no boot
was ever "the cursor's": every run judged the whole ring buffer again, so an XID 79 drained
the node on every sweep after its repair until the next reboot, silently, and its record id
("":kmsg:seq) repeated in every boot. The boot is now told by /proc/stat's btime when the id
cannot be read, and said when neither can."""

from __future__ import annotations

from pathlib import Path

from rsc_health.collect import kmsg

XID79 = "3,700,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."


def _ring(root: Path, *records: str) -> None:
    dev = root / "dev/kmsg"
    dev.parent.mkdir(parents=True, exist_ok=True)
    dev.write_text("".join(r + "\n" for r in records))


def _proc_stat(root: Path, btime: int) -> None:
    # /proc/stat as the kernel prints it (fs/proc/stat.c), shortened to one CPU
    p = root / "proc/stat"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0\n"
                 "cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0\n"
                 "intr 199292604 38 0 0 0 0 0 0 0 1 0 0 0\n"
                 "ctxt 1990473\n"
                 f"btime {btime}\n"
                 "processes 2915\nprocs_running 1\nprocs_blocked 0\n"
                 "softirq 44347437 0 15406133 2 1092614 0 0 5266 13547906 0 14295516\n")


def test_without_a_boot_id_an_xid_is_judged_once_per_boot_not_every_run(tmp_path):
    _proc_stat(tmp_path, 1764230400)
    _ring(tmp_path, "6,699,4000000,-;eth0: link up", XID79)
    first = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {})
    assert [e.xid for e in first.events] == [79]
    again = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], first.cursor)
    assert again.events == [] and again.errors == []
    _proc_stat(tmp_path, 1764316800)  # rebooted: the ring numbers from 0 again
    _ring(tmp_path, XID79.replace("3,700,", "3,12,"))
    rebooted = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], again.cursor)
    assert [e.seq for e in rebooted.events] == [12]
    assert rebooted.events[0].key != first.events[0].key.replace(":700", ":12")


def test_a_boot_that_cannot_be_told_at_all_is_said(tmp_path):
    _ring(tmp_path, XID79)
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {"boot_id": "", "kmsg_seq": 700})
    assert [e.xid for e in got.events] == [79]  # judged again rather than never
    assert any("boot" in e for e in got.errors)


def test_a_ring_buffer_overwritten_on_every_read_does_not_spin_for_ever(tmp_path, monkeypatch):
    """/dev/kmsg answers EPIPE when the record the reader stood on was overwritten, and moves
    it to the oldest one left. The reader retried without bound: a kernel overwriting faster
    than each read (a printk storm on a small log_buf_len) spun the prolog at full CPU until
    Slurm killed it. Now a run of EPIPEs with no record between ends the read, said."""
    import errno
    import os
    import threading

    class _Storm:
        def __getattr__(self, name):
            return getattr(os, name)

        def read(self, fd, n):
            raise OSError(errno.EPIPE, "Broken pipe")

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").symlink_to("/dev/null")
    monkeypatch.setattr(kmsg, "KMSG_DEVICE", (1, 3))  # /dev/null's number stands in for 1:11
    monkeypatch.setattr(kmsg, "_open_device", lambda path: os.open("/dev/null", os.O_RDONLY))
    monkeypatch.setattr(kmsg, "os", _Storm())
    result: list = []
    reader = threading.Thread(
        target=lambda: result.append(kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {})),
        daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert result, "the read of a ring buffer overwritten on every read did not end"
    assert any("overwritten" in e for e in result[0].errors)


def test_a_storm_read_again_with_more_events_gets_another_record_id(node):
    """A finding groups a GPU's events of one XID (a storm of XID 13 lines is one WARN with a
    count); its record id is a hash of the events' keys, which were joined and cut at 2048
    characters. The same storm read again with more events after it (a run that could not
    save its cursor) shared those first characters: the historian stored the first count and
    dropped the larger one as the same record."""
    from rsc_health.engine import run

    records = [f"3,{seq},{seq * 1000},-;NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=a.out, "
               "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address"
               for seq in range(1000, 1300)]
    node.write("dev/kmsg", "".join(r + "\n" for r in records))
    first = [f for f in run(node.config, node.root, only={"xid"}, save_state=False)
             if f.code == "xid13"]
    node.append("dev/kmsg", "".join(r.replace("3,1", "3,2", 1) + "\n" for r in records[:50]))
    again = [f for f in run(node.config, node.root, only={"xid"}, save_state=False)
             if f.code == "xid13"]
    assert (first[0].data["count"], again[0].data["count"]) == (300, 350)
    assert first[0].data["event_key"] != again[0].data["event_key"]


def test_a_dev_kmsg_that_is_another_character_device_is_said(tmp_path):
    """/dev/kmsg was read as the ring buffer whatever character device it was: a container's
    /dev/kmsg bind-mounted from /dev/null, or linked to /dev/console (kind's node image does),
    read as an empty ring, and the xid family said "no new XID events" for ever."""
    import os

    (tmp_path / "dev").mkdir()
    os.symlink("/dev/null", tmp_path / "dev/kmsg")  # a container's stand-in
    got = kmsg.read_new_events(tmp_path, ["/dev/kmsg"], {})
    assert got.events == []
    assert len(got.errors) == 1 and "1:3" in got.errors[0] and "1:11" in got.errors[0]
