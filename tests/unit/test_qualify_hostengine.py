"""A dcgm_diag qualification test takes nv-hostengine's verdict at the dcgmi command's --host
(dcgmi's default: localhost:5555). With nv-hostengine down, any user may listen on that port
and answer dcgmi with a passing diagnostic, qualifying a broken node back into service. Such a
host engine is never asked: the test proves nothing (inconclusive). Before, dcgmi ran and its
Pass stood."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rsc_health.qualify import runner
from rsc_health.sim import qualify_tools as standin

HEAD = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n")


def _listener(local: str, uid: int) -> str:
    return (f"   0: {local} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 {uid:5d}"
            "        0 91234 1 0000000004a0664b 100 0 0 10 0\n")


def _dcgmi(tmp_path: Path) -> tuple[Path, Path]:
    tools = tmp_path / "bin"
    tools.mkdir()
    marker = tmp_path / "ran"
    (tools / "diag.json").write_text(standin.dcgm_diag({"Memory": ["Pass"] * 8}))
    dcgmi = tools / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\necho \"$@\" > '{marker}'\ncat '{tools}/diag.json'\n")
    dcgmi.chmod(0o755)
    return dcgmi, marker


def _proc(tmp_path: Path, *rows: str) -> Path:
    root = tmp_path / "root"
    (root / "proc" / "net").mkdir(parents=True)
    (root / "proc" / "net" / "tcp").write_text(HEAD + "".join(rows))
    return root


@pytest.mark.parametrize("host", [None, "127.0.0.1:5555", "--host=localhost"])
def test_a_diag_answered_by_a_users_listener_is_inconclusive_never_a_pass(tmp_path, host):
    dcgmi, marker = _dcgmi(tmp_path)
    extra = [] if host is None else (["--host", host] if not host.startswith("--") else [host])
    spec = runner.TestSpec("dcgm_r1", "dcgm_diag",
                           (str(dcgmi), "diag", "-r", "1", "-j", *extra), 10)
    root = _proc(tmp_path, _listener("0100007F:15B3", 1000))  # a user's, on 127.0.0.1:5555
    out = runner.run_test(spec, root=root)
    assert out.inconclusive and "uid 1000, not root" in out.inconclusive
    assert out.failed is None and not marker.exists()
    # nv-hostengine (root's) listening: DCGM's verdict is taken.
    root = _proc(tmp_path / "ok", _listener("0100007F:15B3", 0))
    out = runner.run_test(spec, root=root)
    assert out.inconclusive is None and out.failed is None and out.metrics
    assert marker.exists()


def test_a_diag_over_a_users_unix_socket_is_inconclusive(tmp_path):
    dcgmi, marker = _dcgmi(tmp_path)
    sock_dir = tmp_path / "sockets"
    sock_dir.mkdir(mode=0o1777)
    sock_dir.chmod(0o1777)
    os.mknod(sock_dir / "he", stat.S_IFSOCK | 0o777)
    os.chown(sock_dir / "he", 1000, 1000)
    spec = runner.TestSpec("dcgm_r1", "dcgm_diag",
                    (str(dcgmi), "diag", "-r", "1", "-j", "--host", f"unix://{sock_dir}/he"), 10)
    out = runner.run_test(spec, root=Path("/"))
    assert out.inconclusive and "uid 1000" in out.inconclusive and not marker.exists()


def test_a_diag_with_no_host_engine_listening_is_inconclusive_before_dcgmi_runs(tmp_path):
    """Nothing on 127.0.0.1:5555 when the door looked: dcgmi takes tens of milliseconds to
    start and connect, and a user watching /proc for it binds the free port in between and
    answers Pass. Before, dcgmi was run (absent_ok) and whoever listened by then answered."""
    dcgmi, marker = _dcgmi(tmp_path)
    spec = runner.TestSpec("dcgm_r1", "dcgm_diag", (str(dcgmi), "diag", "-r", "1", "-j"), 10)
    out = runner.run_test(spec, root=_proc(tmp_path))
    assert out.inconclusive and "nothing listens" in out.inconclusive
    assert out.failed is None and not marker.exists()


@pytest.mark.parametrize("after", [_listener("0100007F:15B3", 0).replace(" 91234 ", " 91299 "),
                                   _listener("0100007F:15B3", 1000), ""])
def test_a_diag_whose_host_engine_listener_changed_while_it_ran_is_inconclusive(tmp_path, after):
    dcgmi, marker = _dcgmi(tmp_path)
    root = _proc(tmp_path, _listener("0100007F:15B3", 0))
    (tmp_path / "tcp.after").write_text(HEAD + after)
    body = dcgmi.read_text().replace(
        "cat ", f"cp '{tmp_path / 'tcp.after'}' '{root / 'proc' / 'net' / 'tcp'}'\ncat ", 1)
    dcgmi.write_text(body)
    spec = runner.TestSpec("dcgm_r1", "dcgm_diag", (str(dcgmi), "diag", "-r", "1", "-j"), 10)
    out = runner.run_test(spec, root=root)
    assert marker.exists()
    assert out.inconclusive and "while dcgmi ran" in out.inconclusive and out.failed is None
