"""`healthctl qualify run` end to end on stand-in tools that print the real formats: a fleet's
first nodes bootstrap each other's peers, a node 5% slow fails, a tool that is missing, hangs or
warns that it could not allocate is inconclusive (exit 4), never a pass; results and the fleet's
own baseline are in the historian."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from click.testing import CliRunner

from rsc_health.cli import cli
from rsc_health.sim import qualify_tools as standin
from tests.standin_hostengine import HOST

# The stand-in dcgmi's verdict is taken only where root (or we) listen at its --host.
CONFIG = """
[qualify]
full = ["dcgm", "nccl", "burn"]
min_peers = 4
tier_budget_s = 60
[qualify.tests.dcgm]
plugin = "dcgm_diag"
command = ["dcgmi", "diag", "-r", "2", "-j", "--host", "@HOST@"]
timeout_s = 10
[qualify.tests.nccl]
plugin = "nccl_tests"
command = ["all_reduce_perf", "-g", "8"]
timeout_s = 10
[qualify.tests.burn]
plugin = "gpu_burn"
command = ["gpu_burn", "-tc", "60"]
timeout_s = 10
""".replace("@HOST@", HOST)


class Node:
    def __init__(self, tmp: Path, name: str, busbw: float = 231.0, gflops=(16950.0,) * 8,
                 dcgm: str | None = None, missing: tuple[str, ...] = (), hang: str = ""):
        self.name = name
        self.bin = tmp / f"bin-{name}"
        self.bin.mkdir(exist_ok=True)
        outputs = {
            "dcgmi": dcgm or standin.dcgm_diag({"Memory": ["Pass"] * 8, "PCIe": ["Pass"] * 8}),
            "all_reduce_perf": standin.nccl(busbw),
            "gpu_burn": standin.gpu_burn(list(gflops)),
        }
        for tool, text in outputs.items():
            if tool in missing:
                continue
            (self.bin / f"{tool}.out").write_text(text)
            body = "exec sleep 30" if tool == hang else f'cat "{self.bin}/{tool}.out"'
            script = self.bin / tool
            script.write_text(f"#!/bin/sh\n{body}\n")
            script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def run(self, cfg: Path, db: str, *extra: str):
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "RSC_HEALTH_DB": db}
        old = dict(os.environ)
        os.environ.update(env)
        try:
            return CliRunner().invoke(cli, ["--config", str(cfg), "qualify", "run", "--node",
                                            self.name, "--gpu-model", "NVIDIA H100 80GB HBM3",
                                            "--driver", "570.124.06", "--json", *extra])
        finally:
            os.environ.clear()
            os.environ.update(old)


def _setup(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert CliRunner().invoke(cli, ["--db", db, "db", "upgrade"]).exit_code == 0
    return cfg, db


def _fleet(tmp_path, cfg, db, n=5):
    spread = [231.0, 230.2, 231.6, 229.9, 230.8, 231.3, 230.5]
    return [Node(tmp_path, f"gpu{i:03d}", busbw=spread[i % len(spread)]).run(cfg, db)
            for i in range(n)]


def test_first_nodes_bootstrap_peers_then_a_node_5_percent_slow_fails(tmp_path):
    cfg, db = _setup(tmp_path)
    first = _fleet(tmp_path, cfg, db)
    # The first min_peers nodes have nobody to be judged by: inconclusive, measured, kept.
    assert [r.exit_code for r in first] == [4, 4, 4, 4, 0], [r.output[-300:] for r in first]
    slow = Node(tmp_path, "gpu100", busbw=231.0 * 0.95).run(cfg, db)
    doc = json.loads(slow.output)
    assert slow.exit_code == 3 and doc["verdict"] == "fail"
    [nccl] = [r for r in doc["results"] if r["metric"].startswith("nccl-bw/")]
    assert nccl["status"] == "fail" and nccl["basis"] == "peers" and nccl["peers"] == 5
    assert nccl["percentile"] == 0.0
    # A node whose one GPU is 6% slow fails on that GPU alone.
    gpus = (16950.0,) * 7 + (16950.0 * 0.94,)
    one = json.loads(Node(tmp_path, "gpu101", gflops=gpus).run(cfg, db).output)
    assert [(r["index"], r["status"]) for r in one["results"]
            if r["metric"].startswith("gpu-burn") and r["status"] != "pass"] == [("7", "fail")]
    again = Node(tmp_path, "gpu000").run(cfg, db)
    assert again.exit_code == 0, again.output[-400:]


def test_missing_hanging_or_unallocated_tools_are_inconclusive_never_a_pass(tmp_path):
    cfg, db = _setup(tmp_path)
    _fleet(tmp_path, cfg, db, n=6)
    cases = {
        "gpu200": dict(missing=("gpu_burn",)),
        "gpu201": dict(hang="all_reduce_perf"),
        "gpu202": dict(dcgm=standin.dcgm_diag({"Memory": ["Pass"] * 8}, warnings={
            "Memory": "Unable to allocate memory for the test on GPU 3"})),
    }
    for name, kw in cases.items():
        res = Node(tmp_path, name, **kw).run(cfg, db)
        doc = json.loads(res.output)
        assert res.exit_code == 4 and doc["verdict"] == "inconclusive", (name, res.output[-300:])
    # The tool said so itself: a DCGM Fail is a fail with DCGM's reason.
    bad = Node(tmp_path, "gpu203", dcgm=standin.dcgm_diag(
        {"Memory": ["Pass"] * 7 + ["Fail"]}, warnings={"Memory": "DBE on GPU 7"})).run(cfg, db)
    assert bad.exit_code == 3 and "DBE on GPU 7" in json.loads(bad.output)["reason"]


def test_baseline_and_show_read_the_fleets_own_results(tmp_path):
    cfg, db = _setup(tmp_path)
    _fleet(tmp_path, cfg, db, n=6)
    res = CliRunner().invoke(cli, ["--config", str(cfg), "--db", db, "qualify", "baseline",
                                   "--json"])
    rows = json.loads(res.output)
    [nccl] = [r for r in rows if r["metric"].startswith("nccl-bw/")]
    assert nccl["nodes"] == 6 and 230.0 < nccl["median"] < 231.5
    assert {r["idx"] for r in rows if r["metric"].startswith("gpu-burn")} == {str(i) for i in
                                                                               range(8)}
    show = CliRunner().invoke(cli, ["--config", str(cfg), "--db", db, "qualify", "show",
                                    "gpu005"])
    assert show.exit_code == 0 and "PASS" in show.output and "nccl-bw/" in show.output


def test_an_unreachable_historian_is_said_before_any_tool_runs(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    node = Node(tmp_path, "gpu300")
    marker = tmp_path / "ran"
    (node.bin / "gpu_burn").write_text(f"#!/bin/sh\ntouch {marker}\ncat {node.bin}/gpu_burn.out\n")
    res = node.run(cfg, "postgresql+psycopg://nobody@127.0.0.1:9/none")
    assert res.exit_code == 1 and "historian" in res.output.lower(), res.output[-400:]
    assert not marker.exists()


PAIR = """
[qualify.tests.pair]
plugin = "perftest"
command = ["ib_write_bw", "-s", "8388608", "{peer}"]
server_command = ["peer_server", "{peer}", "ib_write_bw", "-s", "8388608"]
server_wait_s = 0.05
timeout_s = 10
"""


def test_pairwise_runs_against_the_newest_passing_peer_and_without_one_is_inconclusive(tmp_path):
    cfg, db = _setup(tmp_path)
    pair_cfg = tmp_path / "pair.toml"
    pair_cfg.write_text(CONFIG.replace("full = ", "lite = [\"pair\"]\nfull = ", 1) + PAIR)
    lonely = Node(tmp_path, "gpu100")
    for tool in ("ib_write_bw", "peer_server"):
        script = lonely.bin / tool
        script.write_text(f'#!/bin/sh\necho "$@" >> "{lonely.bin}/{tool}.args"\n'
                          f'cat "{lonely.bin}/perftest.out"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (lonely.bin / "perftest.out").write_text(standin.perftest(23.9))
    first = lonely.run(pair_cfg, db, "--tier", "lite")
    assert "no known-good peer" in first.output
    assert not (lonely.bin / "ib_write_bw.args").exists()  # nothing ran without a peer
    # gpu000..003 bootstrap (inconclusive: never a known-good peer), gpu004 and gpu005 pass.
    assert [r.exit_code for r in _fleet(tmp_path, cfg, db, n=6)] == [4, 4, 4, 4, 0, 0]
    res = lonely.run(pair_cfg, db, "--tier", "lite")
    assert "ib-pair/ib_write_8388608_mlx5_0_bw" in res.output
    assert (lonely.bin / "ib_write_bw.args").read_text().split()[-1] == "gpu005"
    assert (lonely.bin / "peer_server.args").read_text().split()[0] == "gpu005"


def _pair_node(tmp_path, name: str, *, slow_with: str = "") -> Node:
    """A node whose pairwise client prints perftest's real format: 23.9 GB/s, or 20.0 against a
    peer in `slow_with` ("first": whichever peer it is run against first; "all": every peer)."""
    node = Node(tmp_path, name)
    (node.bin / "fast.out").write_text(standin.perftest(23.9))
    (node.bin / "slow.out").write_text(standin.perftest(20.0))
    first = node.bin / "first"
    pick = {"first": f'if [ -e "{first}" ]; then f=fast; else touch "{first}"; f=slow; fi',
            "all": "f=slow", "": "f=fast"}[slow_with]
    for tool in ("ib_write_bw", "peer_server"):
        script = node.bin / tool
        script.write_text(f'#!/bin/sh\necho "$@" >> "{node.bin}/{tool}.args"\n'
                          + ("" if tool == "peer_server" else f"{pick}\n")
                          + (f'cat "{node.bin}/fast.out"\n' if tool == "peer_server"
                             else f'cat "{node.bin}/$f.out"\n'))
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return node


def _pair_fleet(tmp_path) -> tuple[str, Path]:
    """(historian, the pairwise tier's config) with six nodes that passed the full tier and six
    that measured the pairwise metric (the first four of each unjudged, bootstrapping)."""
    cfg, db = _setup(tmp_path)
    pair_cfg = tmp_path / "pair.toml"
    pair_cfg.write_text(CONFIG.replace("full = ", "lite = [\"pair\"]\nfull = ", 1) + PAIR)
    assert [r.exit_code for r in _fleet(tmp_path, cfg, db, n=6)] == [4, 4, 4, 4, 0, 0]
    seeded = [_pair_node(tmp_path, f"gpu2{i:02d}").run(pair_cfg, db, "--tier", "lite")
              for i in range(6)]
    assert [r.exit_code for r in seeded] == [4, 4, 4, 4, 0, 0], seeded[-1].output[-400:]
    return db, pair_cfg


def test_a_pairwise_fail_or_no_answer_against_one_peer_is_run_again_against_a_second(
        tmp_path):
    """The chosen known-good peer may have degraded since its own pass: a node slow against it
    alone is run again against the next known-good peer. Slow against the first only: the run
    passes on the second's result and says the first was set aside. Slow against both: it
    fails, naming both. A peer an operator named (--peer) is not second-guessed.
    Every node's pairwise test goes to the same peer (the newest pass): one gone down or
    drained by hand since (no node_actions row says so) answered no run, and every
    qualification of the fleet proved nothing for as long as it stayed away. A pairwise test
    that proved nothing against the first peer is run again against the second too."""
    db, pair_cfg = _pair_fleet(tmp_path)

    away = _pair_node(tmp_path, "gpu320")
    marker = away.bin / "first"
    (away.bin / "ib_write_bw").write_text(
        f'#!/bin/sh\necho "$@" >> "{away.bin}/ib_write_bw.args"\n'
        f'if [ -e "{marker}" ]; then cat "{away.bin}/fast.out"; exit 0; fi\n'
        f'touch "{marker}"\necho " Couldn\'t connect to $4:18515" >&2\nexit 1\n')
    res = away.run(pair_cfg, db, "--tier", "lite")
    doc = json.loads(res.output)
    peers = [line.split()[-1] for line in
             (away.bin / "ib_write_bw.args").read_text().split("\n") if line]
    assert len(peers) == 2 and peers[0] != peers[1]
    assert res.exit_code == 0 and doc["verdict"] == "pass", res.output[-600:]
    assert f"against {peers[0]} proved nothing" in doc["reason"]

    once = _pair_node(tmp_path, "gpu300", slow_with="first")
    res = once.run(pair_cfg, db, "--tier", "lite")
    doc = json.loads(res.output)
    tried = (once.bin / "ib_write_bw.args").read_text().split("\n")
    peers = [line.split()[-1] for line in tried if line]
    assert len(peers) == 2 and peers[0] != peers[1]
    assert res.exit_code == 0 and doc["verdict"] == "pass", res.output[-600:]
    assert f"{peers[0]}'s result set aside" in doc["reason"]

    both = _pair_node(tmp_path, "gpu301", slow_with="all")
    res = both.run(pair_cfg, db, "--tier", "lite")
    doc = json.loads(res.output)
    assert res.exit_code == 3 and doc["verdict"] == "fail"
    assert "failed against two known-good peers" in doc["reason"]

    named = _pair_node(tmp_path, "gpu302", slow_with="first")
    res = named.run(pair_cfg, db, "--tier", "lite", "--peer", "gpu004")
    assert res.exit_code == 3
    assert len((named.bin / "ib_write_bw.args").read_text().split("\n")) == 2  # one run


def test_a_fault_the_pairwise_rerun_raises_is_looked_for_after_it(tmp_path):
    """The second peer's run stresses the node again: an XID 48 it raises (logged while the
    pairwise figures look fine) fails the run. Before, the checks' second look came before
    that re-run, and the node passed on the second peer's figures."""
    from tests.fixtures.nodes.node_copy import HEALTHY, copy_node
    from tests.unit.test_qualify_gate import GPU3_PCI, _qualify

    db, pair_cfg = _pair_fleet(tmp_path)

    root = copy_node(tmp_path / "root")
    node_cfg = tmp_path / "node.toml"  # the fixture's hardware: its own checks pass before
    node_cfg.write_text((HEALTHY / "config.toml").read_text()
                        + CONFIG.replace("full = ", "lite = [\"pair\"]\nfull = ", 1) + PAIR)
    node = _pair_node(tmp_path, "gpu310", slow_with="first")
    xid48 = (f"3,1500,36600000000,-;NVRM: Xid (PCI:{GPU3_PCI}): 48, pid=2814, "
             "name=ib_write_bw, An uncorrectable double bit error (DBE) has been detected on GPU "
             "in the framebuffer at partition 6, subpartition 0.")
    client = node.bin / "ib_write_bw"
    first = node.bin / "first"
    client.write_text(
        f'#!/bin/sh\necho "$@" >> "{node.bin}/ib_write_bw.args"\n'
        f'if [ -e "{first}" ]; then echo "{xid48}" >> "{root}/dev/kmsg"; f=fast; '
        f'else touch "{first}"; f=slow; fi\ncat "{node.bin}/$f.out"\n')

    res = _qualify(node, node_cfg, db, root, "--tier", "lite")
    doc = json.loads(res.output)
    assert len((node.bin / "ib_write_bw.args").read_text().split("\n")) == 3  # two peers
    assert res.exit_code == 3 and doc["verdict"] == "fail", res.output[-800:]
    assert "xid48" in doc["reason"]
    assert [f["code"] for f in doc["node_checks_after"]] == ["xid48"]


def test_a_node_whose_gpu_burn_ran_on_7_of_8_gpus_is_never_a_pass(tmp_path):
    """A GPU NVML lists but CUDA cannot use: gpu-burn lists and tests the 7 it has (`Tested 7
    GPUs`), each as fast as its peers'. Every peer measured GPU 7 in this test: the node owes
    it, and lacking it is inconclusive (exit 4), never a pass (it passed before: exit 0)."""
    cfg, db = _setup(tmp_path)
    _fleet(tmp_path, cfg, db, n=6)
    res = Node(tmp_path, "gpu300", gflops=(16950.0,) * 7).run(cfg, db)
    doc = json.loads(res.output)
    assert res.exit_code == 4 and doc["verdict"] == "inconclusive", res.output[-400:]
    assert "burn: no result for gpu-burn/fp64_tc_flops:7" in doc["reason"]
    # Its 7 GPUs' figures were still judged and stored; a whole node passes.
    assert sum(r["metric"].startswith("gpu-burn/") for r in doc["results"]) == 7
    assert Node(tmp_path, "gpu301").run(cfg, db).exit_code == 0


def test_a_dcgm_warn_is_never_a_silent_pass(tmp_path):
    """DCGM diag's Warn (here DCGM's own PCIe replay-rate message, DCGM_FR_PCI_REPLAY_RATE_MSG)
    counted as a pass, said nowhere. Now the run is inconclusive and says it; a site that sets
    [qualify] dcgm_warn = "pass" gets a pass with the warning in its reason."""
    cfg, db = _setup(tmp_path)
    _fleet(tmp_path, cfg, db, n=6)
    replay = "Detected more than 8 PCIe replays per minute for GPU 7 : 31"
    dcgm = standin.dcgm_diag({"Memory": ["Pass"] * 8, "PCIe": ["Pass"] * 7 + ["Warn"]},
                             warnings={"PCIe": replay})
    res = Node(tmp_path, "gpu400", dcgm=dcgm).run(cfg, db)
    doc = json.loads(res.output)
    assert res.exit_code == 4 and doc["verdict"] == "inconclusive", res.output[-400:]
    assert f"dcgm: DCGM Warn on 1 result(s): PCIe GPU7: {replay}" in doc["reason"]
    assert [o["warned"] for o in doc["outcomes"] if o["test"] == "dcgm"][0].endswith(replay)
    lenient = tmp_path / "lenient.toml"
    lenient.write_text(CONFIG.replace("min_peers = 4", 'min_peers = 4\ndcgm_warn = "pass"'))
    res = Node(tmp_path, "gpu401", dcgm=dcgm).run(lenient, db)
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["reason"].startswith("passed with warnings: dcgm: DCGM")
    show = CliRunner().invoke(cli, ["--db", db, "--config", str(lenient), "qualify", "show",
                                    "gpu401"])
    assert replay in show.output, show.output[-600:]


def test_a_metric_is_judged_against_the_same_tests_peers_only(tmp_path):
    """dcgm-diag/passed_results from `dcgmi diag -r 1` (lite) and `-r 2` (full) share a name:
    a healthy node's lite run (8 results) was judged against the full runs' 16 and failed
    (-50%, exit 3: drained), and a mix of both set a median that passed a full run missing a
    quarter of its results. Peers are now the same test's: the first lite runs have none
    (inconclusive), then they judge each other."""
    cfg, db = _setup(tmp_path)
    _fleet(tmp_path, cfg, db, n=6)
    lite = tmp_path / "lite.toml"
    lite.write_text(CONFIG.replace("[qualify.tests.dcgm]", 'lite = ["dcgm_r1"]\n'
                                   '[qualify.tests.dcgm_r1]\nplugin = "dcgm_diag"\n'
                                   'command = ["dcgmi", "diag", "-r", "1", "-j", "--host", '
                                   f'"{HOST}"]\n'
                                   "timeout_s = 10\n[qualify.tests.dcgm]"))
    quick = standin.dcgm_diag({"Deployment": ["Pass"] * 8})
    codes = [Node(tmp_path, f"gpu6{i:02d}", dcgm=quick).run(lite, db, "--tier", "lite")
             for i in range(5)]
    assert [r.exit_code for r in codes] == [4, 4, 4, 4, 0], [r.output[-300:] for r in codes]
    last = json.loads(codes[-1].output)["results"][0]
    assert (last["basis"], last["peers"], last["median"]) == ("peers", 4, 8.0)
