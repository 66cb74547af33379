"""Property tests: the kernel-log and sysfs parsers, fed arbitrary bytes, never raise and never
invent an XID."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from rsc_health.checks import infiniband, pcie
from rsc_health.collect import kmsg, mounts, sysfs

XID_MARK = re.compile(r"NVRM: Xid \(")
noise = st.binary(max_size=2000).map(lambda b: b.decode("utf-8", "replace"))


@settings(max_examples=300, deadline=None)
@given(noise)
def test_kernel_log_parser_never_raises_and_never_invents_an_xid(text):
    events = kmsg.parse_text(text)
    lines_with_marker = [ln for ln in text.splitlines() if XID_MARK.search(ln)]
    assert len(events) <= len(lines_with_marker)
    for ev in events:
        assert any(f": {ev.xid}," in ln for ln in lines_with_marker)


@settings(max_examples=200, deadline=None)
@given(st.lists(noise, max_size=5), st.integers(0, 10**6))
def test_real_xid_lines_survive_surrounding_garbage(garbage, seq):
    line = f"3,{seq},1,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."
    text = "\n".join([*(g.replace("NVRM", "nvrm") for g in garbage), line])
    events = kmsg.parse_text(text)
    assert [(e.xid, e.seq) for e in events][-1:] == [(79, seq)]


@settings(max_examples=300, deadline=None)
@given(noise)
def test_sysfs_parsers_never_raise(text):
    sysfs.parse_int(text)
    assert all(isinstance(v, int) for v in sysfs.parse_counters(text).values())
    pcie.parse_speed(text)
    infiniband.parse_rate(text)
    for m in [*mounts.parse_mounts(text), *mounts.parse_mountinfo(text)]:
        assert isinstance(m.path, str)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_sysfs_collectors_on_garbage_files_never_raise(tmp_path_factory, a, b):
    root = tmp_path_factory.mktemp("garbage")
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    for name in ("state", "phys_state", "rate", "link_layer"):
        (port / name).write_bytes(a)
    (port / "counters/symbol_error").write_bytes(b)
    dev = root / "sys/bus/pci/devices/0000:18:00.0"
    dev.mkdir(parents=True)
    (dev / "class").write_bytes(b"0x030200\n")
    for name in ("current_link_width", "max_link_speed", "aer_dev_fatal"):
        (dev / name).write_bytes(b)
    infiniband.collect(root)
    pcie.collect(root)
