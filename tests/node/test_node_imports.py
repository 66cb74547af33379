"""The node path's import budget: what a prolog loads is part of every job's start-up.

`healthctl check` must not import the historian's heavy libraries; a healthy prolog, run as
slurmd runs it (a fresh interpreter, `python -c JOB_START_CODE prolog` as the script does), loads
the standard library and the node path's own modules listed here: no third-party package, no
Slurm side, no module kept for faults, drains or other families' programs
(benchmarks/bench_prolog.py measures what they cost).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.nodes.node_copy import copy_node

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "sqlalchemy", "matplotlib", "scipy")

PROBE = """
import sys
from click.testing import CliRunner
from rsc_health.cli import cli
result = CliRunner().invoke(cli, ["--root", sys.argv[1], "--config", sys.argv[2], "check"])
assert result.exit_code == 0, result.output
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("HEAVY:", ",".join(heavy))
"""

# Every rsc_health module a healthy prolog may load (the default prolog_families). A new one
# here is a cost on every job start: import it where it is used, or add it with its reason.
NODE_PATH_MODULES = {
    "rsc_health", "rsc_health.nodepath", "rsc_health.node", "rsc_health.node.stage",
    "rsc_health.node.store", "rsc_health.node.sinks", "rsc_health.node.exits",
    "rsc_health.node.act", "rsc_health.node.start", "rsc_health.config",
    "rsc_health.compat",  # what 3.11 gives, on the 3.9 and 3.10 that nodes ship
    "rsc_health.record",  # dataclasses without importing them (inspect, ast, dis, tokenize)
    "rsc_health.lazyre",  # patterns compiled when first used
    "rsc_health._packaged_keys",  # the packaged files' bytes, and the defaults read before a config
    "rsc_health.model", "rsc_health.policy", "rsc_health.spool", "rsc_health.durable",
    "rsc_health.engine", "rsc_health.xid",
    "rsc_health.checks", "rsc_health.checks._finding", "rsc_health.checks.state",
    "rsc_health.checks.env",
    "rsc_health.checks._program",
    # Not host or telemetry: their counters are their own collect's (Family.counters_own).
    *(f"rsc_health.checks.{f}" for f in ("gpu", "xid", "ecc", "remap", "nvlink", "pcie",
                                          "infiniband", "mount", "site", "sxid",
                                          "leftover", "fabric", "dcgm")),
    "rsc_health.collect", "rsc_health.collect.node", "rsc_health.collect.sysfs",
    "rsc_health.collect.bounded", "rsc_health.collect.counters", "rsc_health.collect.kmsg",
    "rsc_health.collect.klog",
    "rsc_health.collect.gpu", "rsc_health.collect.mounts", "rsc_health.collect.hangs",
    "rsc_health.collect.ibports",  # the ports read once for infiniband and telemetry
}
# Not these, though a job start that parses its config loads them: a healthy prolog loads the
# compiled config (config.load_config_compiled), which is validated and merged already, so
# the schema (rsc_health.config_schema: ConfigError lives in the package for that reason) and
# the packaged TOML literals (rsc_health._packaged, 131 KB of bytecode: the watchdog's first
# budget and the compiled config's place come from rsc_health._packaged_keys) stay unloaded.
assert not {"rsc_health.config_schema", "rsc_health._packaged"} & NODE_PATH_MODULES
# Standard-library modules a healthy prolog has no use for: each is a cost on every job start
# (or, for subprocess and socket, a sign that something talks to Slurm or runs a program).
NOT_ON_A_HEALTHY_PROLOG = {
    "subprocess", "socket", "logging", "traceback", "random", "tempfile", "shutil", "hashlib",
    "uuid", "difflib", "argparse", "csv", "sqlite3", "decimal", "email", "http", "urllib.request",
    "syslog", "zoneinfo", "zipfile", "tarfile", "gzip", "platform", "getpass", "pprint",
    "dataclasses", "inspect", "ast", "dis", "tokenize",  # rsc_health.record says why
    "runpy",  # `python -m`: rsc_health.node.start says why
    "tomllib",  # after the first job start: config.load_config_compiled says why
    "typing",  # annotations only: `TYPE_CHECKING = False` in the node path's modules
    "threading",  # the watchdog is a bare _thread: rsc_health.node.exits.Watchdog says why
    # Issue 25's diet: the standard library's heavy modules, each a share of a bare start
    # (benchmarks/bench_prolog.py: pathlib +43 M instructions with what it pulls in, json +31 M,
    # re +25 M, enum +17 M, contextlib +13.5 M, collections +7 M, datetime +6.5 M against a
    # bare 38 M). The node path reads JSON and times through compat's doors to the same C code
    # (_json, _datetime), paths as str with os.path, patterns only on rare paths (lazyre).
    "pathlib", "json", "re", "enum", "datetime", "contextlib", "collections", "functools",
    "fnmatch", "urllib", "ipaddress", "ntpath", "warnings", "importlib", "operator", "keyword",
    "reprlib", "copy", "copyreg", "weakref", "types", "string", "struct",
    "grp", "pwd",  # [xid] log_writers, looked up only when a source asks (kmsg._NamedIds)
}


def test_healthctl_check_imports_no_pandas_sqlalchemy_or_matplotlib(tmp_path):
    root = tmp_path / "node"
    copy_node(root)
    code = PROBE.replace("{heavy!r}", repr(set(HEAVY)))
    out = subprocess.run([sys.executable, "-c", code, str(root), str(root / "config.toml")],
                         capture_output=True, text=True, check=True).stdout
    assert "HEAVY: \n" in out or out.strip().endswith("HEAVY:")


def _imported(argv: list[str], env: dict[str, str], cwd: Path) -> set[str]:
    """The modules a fresh interpreter imported (python -X importtime, on stderr)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and not line.rstrip().endswith("package"):
            names.add(line.rsplit("|", 1)[1].strip())
    assert names, proc.stderr[-2000:]
    return names


def test_a_healthy_prolog_loads_only_the_standard_library_and_its_own_modules(tmp_path):
    root = copy_node(tmp_path / "node")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "RSC_HEALTH", "PYTHON"))}
    env.update(PYTHONPATH=str(REPO), RSC_HEALTH_ROOT=str(root), SLURMD_NODENAME="node01",
               RSC_HEALTH_CONFIG=str(root / "config.toml"), SLURM_JOB_ID="77",
               SLURM_JOB_NODELIST="node[01-02]")
    # What this interpreter loads before any code of ours is not the prolog's: only what the
    # prolog adds to a bare start is judged. Without site (-S): this checkout's venv loads
    # pathlib, re and enum for its editable install's finder before any code runs, which would
    # hide the node path's own imports of them (a node install has no such hook; a healthy
    # prolog needs nothing from site-packages, asserted below).
    bare = _imported(["-S", "-c", "pass"], env, tmp_path)
    assert not {"pathlib", "re", "enum", "json"} & bare, sorted(bare)
    from rsc_health.node.start import JOB_START_CODE  # what prolog/rsc-health-prolog runs

    first = _imported(["-S", "-c", JOB_START_CODE, "prolog"], env, tmp_path) - bare
    assert "tomllib" in first  # the first job start parses the TOML and compiles it
    loaded = _imported(["-S", "-c", JOB_START_CODE, "prolog"], env, tmp_path) - bare

    spool = root / "var/lib/rsc_health/spool"
    beats = [json.loads(line) for f in sorted(spool.glob("*.jsonl"))
             for line in f.read_text().splitlines() if '"heartbeat"' in line]
    assert [(b["source"], b["level"]) for b in beats] == [("prolog", "ok")] * 2  # healthy

    ours = {m for m in loaded if m.split(".")[0] == "rsc_health"}
    assert {"rsc_health.config", "rsc_health.collect.kmsg"} <= ours
    assert ours <= NODE_PATH_MODULES, sorted(ours - NODE_PATH_MODULES)
    others = loaded - ours
    # importtime also lists a try-import that failed (copy tries Jython's org.python.core).
    third_party = {m for m in others if m.split(".")[0] not in sys.stdlib_module_names
                   and importlib.util.find_spec(m.split(".")[0]) is not None}
    assert not third_party, sorted(third_party)
    unneeded = {m for m in others if m in NOT_ON_A_HEALTHY_PROLOG
                or m.split(".")[0] in NOT_ON_A_HEALTHY_PROLOG}
    assert not unneeded, sorted(unneeded)
