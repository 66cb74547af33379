"""Every `healthctl` command the README shows is run as written, on a real site: the real Slurm
cluster of tests/slurm, a demo historian (SQLite), a node tree (the healthy fixture) and a fresh
PostgreSQL database for `db upgrade`.

The README's placeholders become this site's (gpu042 -> node04, DIR and /var/lib paths -> temp
paths, DATE -> the demo's last day); `a | b` alternatives are each run, and a line with
`[--options]` runs bare and with them. Each run must exit with the code the README promises (0
unless listed), print something, and print no traceback. Two lines run elsewhere, at a scale
or on nodes this site cannot give them: they name the test that runs them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from rsc_health.config import load_config
from rsc_health.sim.config import SimConfig
from rsc_health.sim.historian import simulated_historian
from tests.cli_forkserver import CliForkServer
from tests.fixtures.nodes.node_copy import copy_node
from tests.unit.test_readme_commands import COMMANDS

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("RSC_HEALTH_TEST_PG",
                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")

# Lines run by another test, at the scale or on the nodes they need.
RUN_ELSEWHERE = {
    "healthctl lemons --apply":
        "tests/slurm/test_lemons_real_slurm.py::test_lemon_is_drained_ticketed_and_never_auto_resumed",
    # The flow needs nodes rsc-health drained and the tools of a tier (stand-ins there).
    "healthctl qualify start 'gpu[040-043]' --tier full":
        "tests/slurm/test_qualify_flow.py::test_a_repaired_node_passes_and_returns_to_service_with_a_stored_pass",
    "healthctl qualify run --tier lite":
        "tests/unit/test_qualify_run.py::test_first_nodes_bootstrap_peers_then_a_node_5_percent_slow_fails",
    # A person's clear needs a suspect, and the tier needs slurm.conf's rsc_trusted and the lua.
    'healthctl suspects clear gpu042 --reason "jobs were mis-sharded, not the node"':
        "tests/slurm/test_suspect_tier.py::test_suspect_tier_survives_reconfigure_and_restart_on_real_slurm",
}
# Exit codes the README documents for a command on this site (default: 0).
EXIT_CODES = {
    "status": {0, 1},  # 1 while a guard holds or a node is stale: the drain above trips it
}
# tune-lemons simulates 25 fleets of 256 nodes by default: the same command, smaller.
SMALLER = {"tune-lemons": ["--nodes", "32", "--days", "20", "--sim-seeds", "1",
                           "--holdout-seeds", "2"]}


def expand(line: str) -> list[str]:
    """`a | b | c [--x]` -> each alternative, bare and with its bracketed options."""
    # `[--opt]` after a space is optional; `'gpu[040-043]'` is a hostlist.
    optional = re.findall(r"(?<=\s)\[([^\]]+)\]", line)
    bare = re.sub(r"\s+\[[^\]]+\]", "", line).strip()
    head, _, alts = bare.partition("healthctl ")
    variants = []
    words = alts.split(" | ")
    if len(words) > 1:
        first, *rest = words
        prefix = first.rsplit(" ", 1)[0] + " " if " " in first.split("--")[0].strip() else ""
        variants = [f"healthctl {first}"] + [f"healthctl {prefix}{w}" for w in rest]
    else:
        variants = [bare]
    out = []
    for v in variants:
        out.append(v)
        if optional:
            out.append(v + " " + " ".join(optional))
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("readme")
    # The demo's historian (its fleet simulated, ingested and attributed as `healthctl demo`
    # does), without the report and fail-slow act the demo adds: the README's own lines run
    # those (`healthctl report`, the suspects), and they were a third of this test's set-up.
    built = simulated_historian(
        SimConfig.from_config(load_config(None), nodes=48, days=20, seed=3), tmp / "demo")
    root = copy_node(tmp / "node")
    (root / "var/lib/rsc_health/spool").mkdir(parents=True)
    (tmp / "other-tool.jsonl").write_text(json.dumps({
        "kind": "check", "id": "other-tool-1", "time": "2026-11-20T10:00:00+00:00",
        "node": "node04", "source": "other-tool", "check": "mount", "component": "/scratch",
        "status": "fail", "severity": "drain_after_job", "code": "mount_missing",
        "reason": "/scratch not mounted"}) + "\n")
    # The fleet inventory and GPU inventory an operator imports (README: ingest inventory/gpus).
    (tmp / "fleet.csv").write_text("node,cluster,partition,from,to\n" + "".join(
        f"node{i:02d},,gpu,2026-01-01 00:00:00,\n" for i in range(1, 7)))
    (tmp / "gpus.csv").write_text("serial,node,slot,from,to\n"
                                  "1654024031139,node01,0,2026-01-01 00:00:00,\n")
    # A ticket system's export (README: ticket import): one closed, one still open.
    (tmp / "export.csv").write_text("node,opened,closed,reason\n"
                                    "node03,2026-11-01 08:00:00,2026-11-03 17:00:00,PSU\n"
                                    "node04,2026-11-18 09:30:00,,GPU3 RMA\n")
    # Step times a job left (README: ingest steps): the drop-file fixture.
    (tmp / "steps").mkdir()
    (tmp / "steps" / "job-7002.jsonl").write_bytes(
        (REPO / "tests/fixtures/failslow/steps-drop.jsonl").read_bytes())
    name = "readme_" + uuid.uuid4().hex[:8]
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    pg = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    yield {"tmp": tmp, "db": built.url, "root": root, "pg": pg, "as_of": built.as_of.isoformat()}
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def localise(line: str, site: dict, ticket: str | None) -> list[str]:
    tmp, root = site["tmp"], site["root"]
    subs = [
        ("--db postgresql+psycopg://rsc_health@dbhost/rsc_health", f"--db {site['pg']}"),
        # Rendered for this checkout, into a temp directory, never the machine's systemd.
        ("install-units manager --from .",
         f"install-units manager --from {REPO} --dest {tmp}/units"),
        ("--db sqlite:////var/lib/rsc_health/history.db", f"--db sqlite:///{tmp}/fresh.db"),
        ("/var/lib/node_exporter/textfile_collector/", f"{tmp}/textfile/"),
        ("/var/lib/rsc_health/spool", f"{root}/var/lib/rsc_health/spool"),
        ("/var/lib/rsc_health/report", f"{tmp}/report"),
        ("'gpu[040-043]'", "'node[05-06]'"),
        ("gpu042.json", f"{tmp}/gpu042.json"),
        ("node.json", f"{tmp}/node.json"),
        ("other-tool.jsonl", f"{tmp}/other-tool.jsonl"),
        ("--file fleet.csv", f"--file {tmp}/fleet.csv"),
        ("--file gpus.csv", f"--file {tmp}/gpus.csv"),
        ("--file export.csv", f"--file {tmp}/export.csv"),
        ("/shared/steps/", f"{tmp}/steps/"),
        ("--root DIR", f"--root {root}"),
        ("--workdir DIR", f"--workdir {tmp}/tune"),
        ("--out DIR", f"--out {tmp}/report-day"),
        ("DATE", str(site["as_of"])[:10]),
        ("ticket close 17", f"ticket close {ticket or 17}"),
    ]
    for old, new in subs:
        line = line.replace(old, new)
    line = re.sub(r"\b(gpu042|node0042|NODE)\b", "node04", line)
    words = shlex.split(line)[1:]
    for command, extra in SMALLER.items():
        if command in words:
            words += extra
    return words


def test_every_readme_command_runs_on_a_real_site(slurm_cluster, site):
    (site["tmp"] / "textfile").mkdir(exist_ok=True)
    env = dict(slurm_cluster.env, RSC_HEALTH_DB=site["db"], RSC_HEALTH_ROOT=str(site["root"]),
               RSC_HEALTH_CONFIG=os.devnull, PYTHONPATH=str(REPO))
    ticket = None
    ran = []
    # Each line is its own `python -m rsc_health.cli` process in this environment and directory,
    # forked from one server that imported pandas and the rest once (tests/cli_forkserver.py:
    # ~2 CPU-s of start and import per line saved, 60-odd lines).
    with CliForkServer(env, site["tmp"]) as server:
        for line in COMMANDS:
            if line in RUN_ELSEWHERE:
                path, _, name = RUN_ELSEWHERE[line].partition("::")
                assert f"def {name}(" in (REPO / path).read_text(), RUN_ELSEWHERE[line]
                continue
            for variant in expand(line):
                argv = localise(variant, site, ticket)
                proc = server.run(argv, timeout=300)
                command = next(w for w in argv if not w.startswith("-") and "/" not in w
                               and "://" not in w)
                allowed = EXIT_CODES.get(command, {0})
                assert proc.returncode in allowed, (variant, argv, proc.stdout[-2000:],
                                                    proc.stderr[-2000:])
                assert "Traceback" not in proc.stderr, (variant, proc.stderr[-2000:])
                assert (proc.stdout + proc.stderr).strip(), variant
                if argv[:2] == ["ticket", "open"]:
                    ticket = re.search(r"\d+", proc.stdout).group(0)
                ran.append(variant)
        # The README's first export is `systemctl start rsc-health-export.service` (as the
        # timer's user, never root): what that unit runs, as its install-units line rendered it.
        unit = (site["tmp"] / "units" / "rsc-health-export.service").read_text()
        start = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
        argv = localise("healthctl " + shlex.join(shlex.split(start.partition("=")[2])[1:]),
                        site, ticket)
        proc = server.run(argv, timeout=300)
        assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(ran) >= len(COMMANDS)
    assert (site["tmp"] / "textfile" / "rsc_health_fleet.prom").read_text().startswith("#")
    assert (site["tmp"] / "report-day").is_dir()
