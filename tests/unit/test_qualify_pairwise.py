"""Issue 24's pairwise test: this node's `ib_write_bw` client against a known-good peer's server,
on stand-ins that print perftest's real format (sim/qualify_tools.perftest, the layout of
../shared/data/qualify/tool-outputs/ib_loopback_*.log). The peer is a node with a stored recent
pass that is not being qualified; no peer, a peer that times out or is busy, a garbled output,
a setup mismatch and a hostile peer name are inconclusive, never fail and never pass."""

from __future__ import annotations

import sys

import pytest

from rsc_health.qualify import pairwise, parse
from rsc_health.qualify.judge import Rules
from rsc_health.qualify.verdict import judge_run
from rsc_health.sim import qualify_tools as standin


def printer(text: str, *, sleep: float = 0.0, rc: int = 0, err: str = "") -> list[str]:
    """argv of a stand-in that prints `text` (then `err` on stderr) and exits `rc`; the
    trailing "{peer}" proves the peer's name reaches the argv as one argument."""
    code = (f"import sys,time; time.sleep({sleep}); sys.stdout.write({text!r}); "
            f"sys.stderr.write({err!r}); sys.exit({rc})")
    return [sys.executable, "-c", code, "{peer}"]


def pair(client, server, peer="gpu-017", timeout_s=10.0):
    return pairwise.run_pair("ib_write_bw_pair", "perftest", client, server, peer,
                             timeout_s=timeout_s, server_wait_s=0.05)


def test_a_healthy_pair_yields_the_clients_bandwidth_judged_against_peers():
    out = pair(printer(standin.perftest(23.9, device="mlx5_0")),
               printer(standin.perftest(23.9, device="mlx5_0")))
    assert out.inconclusive is None and out.failed is None
    (m,) = out.metrics
    assert m.name == "ib-pair/ib_write_8388608_mlx5_0_bw" and m.value == pytest.approx(23.9)
    peers = [23.8, 24.0, 23.9, 24.1, 23.7, 23.95, 24.05, 23.85]
    ok = judge_run([out], peers_of=lambda _m, _t: peers, baseline=None, rules=Rules())
    slow = pair(printer(standin.perftest(21.5)), printer(standin.perftest(21.5)))
    bad = judge_run([slow], peers_of=lambda _m, _t: peers, baseline=None, rules=Rules())
    assert (ok.verdict, bad.verdict) == ("pass", "fail")


def test_no_known_good_peer_and_a_hostile_peer_name_are_inconclusive_and_run_nothing(tmp_path):
    marker = tmp_path / "ran"
    touch = [sys.executable, "-c", f"open({str(marker)!r}, 'w')", "{peer}"]
    assert "no known-good peer" in pair(touch, touch, peer=None).inconclusive
    for hostile in ("-oProxyCommand=touch /tmp/x", "a b", "gpu;rm -rf /", "../x", "x" * 300,
                    "gpu\n01"):
        out = pair(touch, touch, peer=hostile)
        assert out.inconclusive and "not a host name" in out.inconclusive and not out.metrics
    assert not marker.exists()


def test_a_peer_that_times_out_or_is_busy_is_inconclusive_never_fail_or_pass():
    good = printer(standin.perftest(23.9))
    slow = pair(good, printer("", sleep=30), timeout_s=1.0)
    assert "timed out" in slow.inconclusive and "gpu-017" in slow.inconclusive
    busy = pair(printer("", rc=1, err=" Couldn't connect to gpu-017:18515\n"),
                printer("", rc=1, err="Couldn't bind socket: Address already in use\n"))
    assert busy.inconclusive and busy.failed is None and not busy.metrics
    missing = pair(good, ["/nonexistent/ib_write_bw", "{peer}"])
    assert "could not start" in missing.inconclusive


@pytest.mark.parametrize("garbled", [
    "", "\x00\xff" * 100, standin.perftest(23.9).replace("23900.00", "-5"),
    standin.perftest(23.9).replace("BW average[MB/sec]", "BW average[PB/sec]"),
    "#bytes #iterations\n" + "9" * 50_000 + "\n"])
def test_a_garbled_client_output_is_inconclusive(garbled):
    out = pair(printer(garbled), printer(standin.perftest(23.9)))
    assert out.inconclusive and out.failed is None and not out.metrics


def test_a_setup_mismatch_between_the_two_ends_is_inconclusive():
    here = standin.perftest(23.9)
    mtu = pair(printer(here), printer(here.replace("4096[B]", "1024[B]")))
    assert "setup mismatch" in mtu.inconclusive and "Mtu" in mtu.inconclusive
    link = pair(printer(here), printer(here.replace("Link type       : IB",
                                                    "Link type       : Ethernet")))
    assert "Link type" in link.inconclusive
    size = pair(printer(here), printer(standin.perftest(23.9, size=65536)))
    assert "message sizes" in size.inconclusive


def test_nccl_pairwise_from_one_launcher_needs_ranks_on_the_peer_and_flags_wrong_results():
    both = standin.nccl(46.0, ranks=16, hosts=("gpu-009", "gpu-017"))
    out = pairwise.run_pair("nccl_pair", "nccl_tests", printer(both), [], "gpu-017",
                            timeout_s=10.0, here="gpu-009")
    assert out.inconclusive is None
    assert [m.name for m in out.metrics] == ["nccl-pair/allreduce_8589934592_busbw"]
    alone = standin.nccl(231.0, ranks=8, hosts=("gpu-009",))
    one = pairwise.run_pair("nccl_pair", "nccl_tests", printer(alone), [], "gpu-017",
                            timeout_s=10.0)
    assert "setup mismatch" in one.inconclusive and not one.metrics
    wrong = standin.nccl(46.0, ranks=16, hosts=("gpu-009", "gpu-017"), wrong=3)
    bad = pairwise.run_pair("nccl_pair", "nccl_tests", printer(wrong, rc=1), [], "gpu-017",
                            timeout_s=10.0)
    assert bad.failed and "wrong" in bad.failed
    hung = pairwise.run_pair("nccl_pair", "nccl_tests", printer(both, sleep=30), [], "gpu-017",
                             timeout_s=1.0)
    assert "timed out" in hung.inconclusive


def test_nccl_ranks_on_the_peer_and_a_third_host_never_pass_for_this_node():
    """The launcher put its ranks on the peer and on some other host, none here (a hostfile
    or -H list that does not name this node): the run measured nothing of this node. It was
    taken as a pairwise result (two hosts, the peer among them); now inconclusive."""
    elsewhere = standin.nccl(46.0, ranks=16, hosts=("gpu-017", "gpu-031"))
    out = pairwise.run_pair("nccl_pair", "nccl_tests", printer(elsewhere), [], "gpu-017",
                            timeout_s=10.0, here="gpu-009")
    assert out.inconclusive and "setup mismatch" in out.inconclusive and not out.metrics
    # The same ranks with this node among them (any case, any domain) are a result.
    mixed = standin.nccl(46.0, ranks=16, hosts=("GPU-009.cluster", "gpu-017"))
    ok = pairwise.run_pair("nccl_pair", "nccl_tests", printer(mixed), [], "gpu-017",
                           timeout_s=10.0, here="gpu-009")
    assert ok.inconclusive is None and ok.metrics


def test_a_peer_that_is_this_node_is_inconclusive_and_runs_nothing(tmp_path):
    """ib_write_bw against itself is the HCA's loopback: the cable and switch port a pairwise
    test is for are never crossed, so its bandwidth says nothing of them."""
    marker = tmp_path / "ran"
    touch = [sys.executable, "-c", f"open({str(marker)!r}, 'w')", "{peer}"]
    for me in ("gpu-009", "GPU-009", "gpu-009.cluster"):
        out = pairwise.run_pair("ib_write_bw_pair", "perftest", touch, touch, me,
                                timeout_s=10.0, server_wait_s=0.05, here="gpu-009")
        assert out.inconclusive and "this node" in out.inconclusive and not out.metrics
    assert not marker.exists()


def from_file(path, text: str, rc: int = 0) -> list[str]:
    """argv of a stand-in that prints a file's `text` (too long for an argv) and exits `rc`."""
    path.write_text(text)
    code = "import sys; sys.stdout.write(open(sys.argv[1]).read()); sys.exit(int(sys.argv[2]))"
    return [sys.executable, "-c", code, str(path), str(rc), "{peer}"]


def test_a_launcher_output_cut_at_its_byte_limit_never_passes(tmp_path):
    """NCCL_DEBUG=INFO (or a peer rank's warnings) floods the launcher's stdout between the
    result rows: past 1 MiB it is cut, and with it the last rows (the largest size, its
    `#wrong`) and the `Out of bounds values` line. The rows before the cut were taken as the
    result: a node whose largest messages came back wrong could pass. Now a cut output is
    inconclusive, unless what was read already shows a wrong result (that fails)."""
    text = standin.nccl(46.0, ranks=16, hosts=("gpu-009", "gpu-017"), wrong=3)
    lines = text.splitlines(keepends=True)
    last_rows = max(i for i, line in enumerate(lines) if line.split()[:1] == ["4294967296"])
    flood = "gpu-017:4242:4242 [0] NCCL INFO Channel 00/32 :    0   1   2   3   4   5\n" * 20000
    cut = "".join(lines[:last_rows]) + flood + "".join(lines[last_rows:])
    out = pairwise.run_pair("nccl_pair", "nccl_tests", from_file(tmp_path / "cut.log", cut), [],
                            "gpu-017", timeout_s=20.0, here="gpu-009")
    assert out.failed is None and not out.metrics
    assert out.inconclusive and "cut" in out.inconclusive
    seen = "".join(lines) + flood  # the wrong row was read before the cut: that fails
    bad = pairwise.run_pair("nccl_pair", "nccl_tests",
                            from_file(tmp_path / "seen.log", seen, rc=1), [], "gpu-017",
                            timeout_s=20.0, here="gpu-009")
    assert bad.failed and "wrong" in bad.failed


def test_a_client_output_cut_at_its_byte_limit_is_inconclusive(tmp_path):
    here = standin.perftest(23.9)
    flooded = "x" * (1 << 20) + "\n" + here
    out = pair(from_file(tmp_path / "c.log", flooded), printer(here))
    assert "could not start" not in (out.inconclusive or "")
    assert out.inconclusive and out.failed is None and not out.metrics


@pytest.mark.parametrize("tag", ["[1,0]<stdout>:", "0: "], ids=["mpirun-tag-output", "srun-label"])
def test_nccl_output_a_launcher_tagged_line_by_line_is_read(tag):
    """`mpirun --tag-output` ([jobid,rank]<stdout>:) and `srun --label` (rank: ) put a prefix
    before every line rank 0 prints: no row, header or rank line was found, and every
    pairwise run proved nothing, the node drained again at each retry however healthy."""
    text = standin.nccl(46.0, ranks=16, hosts=("gpu-009", "gpu-017"))
    tagged = "".join(tag + line for line in text.splitlines(keepends=True))
    out = pairwise.run_pair("nccl_pair", "nccl_tests", printer(tagged), [], "gpu-017",
                            timeout_s=10.0, here="gpu-009")
    assert out.inconclusive is None, out.inconclusive
    assert [(m.name, m.value) for m in out.metrics] == [
        ("nccl-pair/allreduce_8589934592_busbw", 46.0)]
    wrong = standin.nccl(46.0, ranks=16, hosts=("gpu-009", "gpu-017"), wrong=3)
    bad = "".join(tag + line for line in wrong.splitlines(keepends=True))
    assert "3 wrong" in parse("nccl_tests", bad).failed
