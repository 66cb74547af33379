"""dcgmi asks nv-hostengine at `[dcgm] host` (and a dcgm_diag qualification test at its
command's --host), and host_refusal takes its verdict only where root answers. It told a host
of this node from another machine's by its spelling alone: "localhost" and the addresses
Python's ipaddress reads as loopback were checked, and every other spelling of this node was
"another machine's nv-hostengine, trusted as the operator set it": "localhost." (the FQDN),
"127.1", "0", "2130706433" and "::ffff:127.0.0.1" (which the C library resolves, as dcgmi
does, to this node's loopback), and this node's own name or its own interface address. On any
of those a user's listener on port 5555 answered dcgmi with "Healthy" or a passing diag. Now a
host is resolved, and any address of this node is held to the listener rule."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rsc_health.checks.dcgm import host_refusal

HEAD = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
        "timeout inode\n")


def _listener(local: str, uid: int) -> str:
    return (f"   0: {local} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 {uid:5d}"
            "        0 91234 1 0000000004a0664b 100 0 0 10 0\n")


def _root(tmp_path: Path, *rows: str, tcp6: tuple[str, ...] = ()) -> Path:
    root = tmp_path / "root"
    (root / "proc" / "net").mkdir(parents=True)
    (root / "proc" / "net" / "tcp").write_text(HEAD + "".join(rows))
    (root / "proc" / "net" / "tcp6").write_text(HEAD + "".join(tcp6))
    return root


def _hex4(addr: str) -> str:
    """An IPv4 address as /proc/net/tcp prints it (the kernel's host-order word)."""
    return f"{int.from_bytes(socket.inet_aton(addr), 'little'):08X}"


@pytest.mark.parametrize("host", ["localhost.", "LOCALHOST.:5555", "127.1", "0", "2130706433",
                                  "0x7f000001", "::ffff:127.0.0.1", "[::ffff:127.0.0.1]:5555"])
def test_every_spelling_of_loopback_is_held_to_the_listener_rule(tmp_path, host):
    user = _root(tmp_path / "u", _listener("0100007F:15B3", 1000))  # a user's, 127.0.0.1:5555
    assert "uid 1000" in host_refusal(user, host)
    assert host_refusal(_root(tmp_path / "r", _listener("0100007F:15B3", 0)), host) == ""


def test_a_user_on_the_wildcard_answers_this_nodes_own_name(tmp_path):
    host = socket.gethostname()
    root = _root(tmp_path, _listener("00000000:15B3", 1000))  # a user's, on 0.0.0.0:5555
    assert "uid 1000" in host_refusal(root, host)


def _own_address() -> str | None:
    """An address of one of this machine's interfaces other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.77", 9))  # no packet is sent: the route picks the source
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_a_user_on_this_nodes_own_address_answers_it(tmp_path):
    addr = _own_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    # A user's listener bound to exactly that address (nv-hostengine down).
    root = _root(tmp_path / "u", _listener(f"{_hex4(addr)}:15B3", 1000))
    assert "uid 1000" in host_refusal(root, addr)
    assert "uid 1000" in host_refusal(root, f"{addr}:5555")
    # Root's there: asked. Nothing there: the next user to bind it would answer.
    assert host_refusal(_root(tmp_path / "r", _listener(f"{_hex4(addr)}:15B3", 0)), addr) == ""
    assert "nothing listens" in host_refusal(_root(tmp_path / "n"), addr)
    # A user's listener on the loopback does not answer dcgmi at the node's own address.
    assert host_refusal(_root(tmp_path / "l", _listener(f"{_hex4(addr)}:15B3", 0),
                              _listener("0100007F:15B3", 1000)), addr) == ""


def test_another_machines_host_engine_is_still_trusted_as_the_operator_set_it(tmp_path):
    root = _root(tmp_path, _listener("00000000:15B3", 1000))
    assert host_refusal(root, "198.51.100.7") == ""  # TEST-NET-2: no interface of this node
    assert host_refusal(root, "[2001:db8::5]:5555") == ""


def test_a_host_that_does_not_resolve_is_refused_not_trusted(tmp_path):
    root = _root(tmp_path, _listener("0100007F:15B3", 0))
    assert "resolve" in host_refusal(root, "no-such-host.invalid")
