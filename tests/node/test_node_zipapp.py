"""The one file an operator copies to compute nodes (scripts/build-node ->
rsc-health-node.pyz): built reproducibly, holding the node side and its pure-Python
dependencies only, and running the prolog, epilog, sweep, `healthctl check`/`snapshot` and
(with SQLAlchemy beside it) `spool flush` on the healthy fixture node, on this machine's Python
with nothing but the standard library (`-I -S`: no site-packages, no PYTHONPATH) and on a real
CPython 3.9 when there is one; the shipped Prolog= wrapper runs it through RSC_HEALTH_PYZ."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.nodepyz import REPO, build_pyz, find_python39
from tests.fixtures.nodes.node_copy import copy_node

PROLOG = REPO / "prolog" / "rsc-health-prolog"
XID79 = "4,9000,99000000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=77, name=python3, GPU has " \
        "fallen off the bus.\n"


@pytest.fixture(scope="module")
def pyz(tmp_path_factory) -> Path:
    built, why = build_pyz(tmp_path_factory.mktemp("pyz") / "rsc-health-node.pyz")
    if built is None:
        pytest.skip(why)  # the pinned wheels could not be fetched (no index reachable)
    return built


@pytest.fixture
def node(tmp_path):
    root = copy_node(tmp_path / "node")
    empty_bin = tmp_path / "bin"  # no scontrol: a drain verdict stays pending
    empty_bin.mkdir()
    env = {"PATH": f"{empty_bin}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "RSC_HEALTH_ROOT": str(root), "RSC_HEALTH_CONFIG": str(root / "config.toml"),
           "SLURMD_NODENAME": "node01", "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node01"}
    return root, env


def run(python: str, pyz: Path, env: dict, *args: str, flags=("-I", "-S"), cwd=None):
    return subprocess.run([python, *flags, str(pyz), *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=cwd or env["HOME"])


def heartbeats(root: Path) -> list[tuple[str, str]]:
    spool = root / "var/lib/rsc_health/spool"
    return [(b["source"], b["level"]) for f in sorted(spool.glob("*.jsonl"))
            for b in map(json.loads, f.read_text().splitlines()) if b["kind"] == "heartbeat"]


def test_two_builds_are_the_same_bytes(pyz, tmp_path):
    again, why = build_pyz(tmp_path / "again.pyz")
    assert again is not None, why
    assert again.read_bytes() == pyz.read_bytes()


def test_the_pyz_holds_the_node_side_and_pure_python_dependencies_only(pyz):
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(pyz) as zf:
        names = set(zf.namelist())
    for member in ("__main__.py", "rsc_health/nodepath.py", "rsc_health/default_config.toml",
                   "rsc_health/xid_catalog.toml", "rsc_health/sxid_catalog.toml",
                   "click/core.py", "pynvml.py",
                   "tomli/_parser.py"):
        assert member in names, member
    tops = {n.split("/")[0] for n in names}
    assert not tops & {"sqlalchemy", "pandas", "psycopg", "numpy"}, tops
    assert not any(n.startswith(("rsc_health/sim/", "rsc_health/report/")) for n in names)
    assert not any(n.endswith((".so", ".pyd")) for n in names)  # nothing tied to a platform
    sources = {n for n in names if n.endswith(".py")}
    assert {s + "c" for s in sources} <= names  # bytecode for the builder's Python


def test_prolog_epilog_and_sweep_run_from_the_pyz_on_the_standard_library_alone(pyz, node):
    root, env = node
    for stage in ("prolog", "epilog", "sweep"):
        done = run(sys.executable, pyz, env, stage)
        assert done.returncode == 0, (stage, done.stderr)
    assert heartbeats(root) == [("prolog", "ok"), ("epilog", "ok"), ("sweep", "ok")]


def test_check_and_snapshot_from_the_pyz_replay_the_same_verdict(pyz, node, tmp_path):
    root, env = node
    version = run(sys.executable, pyz, env, "--version")
    assert version.returncode == 0 and "version" in version.stdout, version.stderr
    live = run(sys.executable, pyz, env, "check")
    assert live.returncode == 0, live.stderr
    assert "verdict: OK" in live.stdout
    snap = tmp_path / "node01.json"
    done = run(sys.executable, pyz, env, "snapshot", "--out", str(snap))
    assert done.returncode == 0, done.stderr
    replay = run(sys.executable, pyz, env, "check", "--from", str(snap))
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.splitlines()[-2:] == live.stdout.splitlines()[-2:]


def test_the_prolog_wrapper_runs_the_pyz_and_still_drains_on_xid_79(pyz, node, tmp_path):
    root, env = node
    defaults = tmp_path / "defaults"
    defaults.write_text(f"RSC_HEALTH_PYZ={pyz}\nRSC_HEALTH_PYTHON={sys.executable}\n")
    env = dict(env, RSC_HEALTH_DEFAULTS=str(defaults))
    healthy = subprocess.run([str(PROLOG)], env=env, capture_output=True, text=True, timeout=120)
    assert healthy.returncode == 0, healthy.stderr
    with open(root / "dev/kmsg", "a") as fh:
        fh.write(XID79)
    drained = subprocess.run([str(PROLOG)], env=env, capture_output=True, text=True, timeout=120)
    assert drained.returncode == 1, drained.stderr
    assert "DRAIN_NOW" in drained.stderr
    assert heartbeats(root) == [("prolog", "ok"), ("prolog", "drain_now")]


def test_a_missing_pyz_lets_the_job_run(node, tmp_path):
    _, env = node
    defaults = tmp_path / "defaults"
    defaults.write_text(f"RSC_HEALTH_PYZ={tmp_path / 'gone.pyz'}\n")
    env = dict(env, RSC_HEALTH_DEFAULTS=str(defaults))
    done = subprocess.run([str(PROLOG)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert "could not run (exit 2" in done.stderr


def test_spool_flush_from_the_pyz_needs_sqlalchemy_beside_it(pyz, node, tmp_path):
    root, env = node
    assert run(sys.executable, pyz, env, "prolog").returncode == 0
    db = tmp_path / "history.db"
    bare = run(sys.executable, pyz, env, "--db", f"sqlite:///{db}", "spool", "flush")
    assert bare.returncode == 1
    assert "needs the Python package 'sqlalchemy'" in bare.stderr
    assert "rsc-health[node-flush]" in bare.stderr
    # This interpreter has SQLAlchemy (the [node-flush] extra): the pyz's flush delivers.
    done = run(sys.executable, pyz, env, "--db", f"sqlite:///{db}", "spool", "flush",
               flags=("-I",))
    assert done.returncode == 0, done.stderr
    from sqlalchemy import create_engine, func, select

    from rsc_health.historian import schema

    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        runs = conn.execute(select(schema.node_runs.c.node, schema.node_runs.c.source,
                                   schema.node_runs.c.level)).all()
        results = conn.execute(select(func.count()).select_from(schema.check_results)).scalar()
    engine.dispose()
    assert [tuple(r) for r in runs] == [("node01", "prolog", "ok")]
    assert results


def test_the_pyz_runs_the_node_path_on_python_3_9(node, tmp_path):
    python = find_python39()
    if python is None:
        pytest.skip("no CPython 3.9 on this machine (scripts/install-python39, or set "
                    "RSC_HEALTH_TEST_PYTHON39 to one); "
                    "tests/static/test_node_python.py still holds the node side to 3.9")
    # Built with 3.9's bytecode, as an operator builds it for a RHEL 9 fleet.
    pyz, why = build_pyz(tmp_path / "py39.pyz", python=python)
    assert pyz is not None, why
    root, env = node
    for stage in ("prolog", "epilog", "sweep"):
        done = run(python, pyz, env, stage)
        assert done.returncode == 0, (stage, done.stderr)
        assert "checker fault" not in done.stderr, done.stderr
    check = run(python, pyz, env, "check")
    assert check.returncode == 0 and "verdict: OK" in check.stdout, check.stderr
    with open(root / "dev/kmsg", "a") as fh:
        fh.write(XID79)
    drained = run(python, pyz, env, "prolog")
    assert drained.returncode == 1, drained.stderr
    assert "checker fault" not in drained.stderr, drained.stderr
    assert heartbeats(root) == [("prolog", "ok"), ("epilog", "ok"), ("sweep", "ok"),
                                ("prolog", "drain_now")]


def test_the_nhc_adapter_runs_from_the_pyz(pyz, node):
    """[site] nhc_conf: the adapter is a program the site family starts; from the zip it is
    the .pyz itself (`nhc-adapter`), not a file path inside the archive."""
    from tests.node.site_fakes import fake_nhc

    root, env = node
    fake_nhc(root, "fail")
    with open(root / "config.toml", "a") as fh:
        fh.write('\n[site]\nnhc_conf = "/etc/nhc/nhc.conf"\nnhc_path = "/usr/sbin/nhc"\n')
    done = run(sys.executable, pyz, env, "check", "--only", "site")
    assert done.returncode == 2, done.stdout + done.stderr  # DRAIN_AFTER_JOB, as installed
    assert "check_fs_mount: /scratch not mounted" in done.stdout  # NHC stops at its first


def test_help_lists_every_command_and_one_the_pyz_lacks_says_where_to_run_it(pyz, node):
    """The pyz holds the node side only. `--help` (listing every command) and `lemons` ended in
    `ModuleNotFoundError: No module named 'rsc_health.commands.metrics'`, so an operator on a
    node could not even list the commands (helper-113). Now each listed command a node lacks
    says so when run; the node's own still run."""
    _, env = node
    helped = run(sys.executable, pyz, env, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "check" in helped.stdout and "lemons" in helped.stdout
    lemons = run(sys.executable, pyz, env, "lemons")
    assert lemons.returncode == 1 and "Traceback" not in lemons.stderr, lemons.stderr
    assert "not in the node zipapp" in lemons.stderr, lemons.stderr
    shown = run(sys.executable, pyz, env, "config", "show")
    assert shown.returncode == 0, shown.stderr
