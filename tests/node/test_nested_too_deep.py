"""Input nested deeper than a decoder goes: Python's json decoder raises RecursionError, not
ValueError, at about sys.getrecursionlimit() levels (`[` * 1000: a kilobyte, well under every
size limit), and tomllib (tomli on 3.9/3.10) at about 330 to 500 (`a = [[[[...`). A reader
that caught only ValueError let it through: a garbled pending verdict failed every later run
with a checker fault (the node never drained again), a site config pushed with one made the
prolog a checker fault instead of judging with the last good config, an XID catalog override
with one silenced every family instead of its own, and one dcgmi output lost the other's
findings. Each is now what a truncated or garbled file of its kind already was.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc_health import nodepath
from rsc_health.cli import cli
from rsc_health.collect import bounded
from rsc_health.config import LAST_GOOD_FILE, last_good_config
from rsc_health.model import Level, Severity, Status
from rsc_health.sim.qualify_tools import dcgm_diag
from tests.fixtures.nodes.node_copy import NODE_STATE

from .test_nodepath_faults import XID79, _drains, _no_slurm, _records, node_env  # noqa: F401
from .test_state_dir_read_only import node01_slurm

# Deep enough for either decoder at any stack depth, and under the 64 KiB a line or an
# attribute file may be (sysfs.ATTR_BYTES, [failslow] steps_max_line_bytes).
DEEP = 50_000


def test_a_pending_verdict_nested_too_deep_is_discarded_and_the_node_still_drains(
        node_env, capsys):  # noqa: F811
    """The reported case: `[` * 200000 in pending_verdict.json made the verdict step of every
    sweep and prolog a checker fault, for good (nothing ever removed the file)."""
    sdir = node_env / NODE_STATE
    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: node01_slurm()) == 0
    (sdir / nodepath.PENDING_VERDICT_FILE).write_text("[" * 200_000)
    (node_env / "dev/kmsg").open("a").write(XID79)
    capsys.readouterr()
    slurm = node01_slurm()

    assert nodepath.run_stage("sweep", slurm_factory=lambda cfg, d: slurm) == 0

    err = capsys.readouterr().err
    assert "checker fault" not in err
    assert f"corrupt {nodepath.PENDING_VERDICT_FILE} discarded" in err
    assert [reason.split(":")[2] for _, _, reason in _drains(slurm)] == ["xid79"]
    assert nodepath.load_pending(sdir) is None  # acted on: nothing left pending


def test_a_config_push_nested_too_deep_is_a_broken_push_judged_with_the_last_good_one(
        node_env, capsys):  # noqa: F811
    """tomllib raised RecursionError, not TOMLDecodeError: no ConfigError, so the prolog
    skipped the broken-config path (judge with the last good config) and was a checker fault
    that let a job start on a GPU that had fallen off the bus."""
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0  # loads, kept
    site = Path(os.environ["RSC_HEALTH_CONFIG"])
    site.write_text(site.read_text() + "\n[deep]\nlist = " + "[" * DEEP + "\n")
    (node_env / "dev/kmsg").open("a").write(XID79)
    capsys.readouterr()

    assert nodepath.main(["prolog"]) == 1  # slurmd drains, the job goes elsewhere

    err = capsys.readouterr().err
    assert "checker fault" not in err
    assert "nested too deep" in err and "judged with the last good config" in err
    codes = {r.get("code") for r in _records(node_env) if r["kind"] == "check"}
    assert {"config_error", "xid79"} <= codes


def test_a_kept_config_nested_too_deep_is_no_kept_config(node_env):  # noqa: F811
    """last_good_config is read while the site's config is broken; raising there (outside
    the broken-config path's own handling) made that run a checker fault."""
    assert nodepath.run_stage("sweep", slurm_factory=_no_slurm) == 0
    kept = node_env / NODE_STATE / LAST_GOOD_FILE
    assert last_good_config(node_env) is not None
    kept.write_text('{"toml": ' + "[" * DEEP)

    assert last_good_config(node_env) is None


def test_an_xid_catalog_override_nested_too_deep_costs_only_the_xid_family(node, tmp_path):
    """A CatalogError costs its family; the RecursionError escaped the engine, which then
    judged nothing at all (one `checker failed` finding for every family)."""
    from rsc_health.engine import run

    override = tmp_path / "xid_site.toml"
    override.write_text("[codes.13]\nname = " + "[" * DEEP + "\n")
    cfg = node.config
    cfg.data["xid"]["catalog_override"] = str(override)

    findings = run(cfg, node.root)

    errors = [f for f in findings if f.status is Status.ERROR]
    assert [(f.family, f.component) for f in errors] == [("checker", "xid catalog")]
    assert "nested too deep" in errors[0].reason
    assert {"gpu", "ecc", "mount", "infiniband"} <= {f.family for f in findings}


def test_one_dcgmi_output_nested_too_deep_keeps_the_others_findings(node):
    """health printed `[[[[...`: its reader raised RecursionError, the whole family was one
    `dcgm check failed` and the failed diag beside it (a drain after the job) was lost."""
    from rsc_health.engine import run
    from rsc_health.policy import decide

    node.write("h.json", "[" * DEEP)
    node.write("d.json", dcgm_diag({"Memory": ["Pass", "Fail"]}, warnings={"Memory": "DBE"}))
    node.write("usr/bin/dcgmi", f"""#!/bin/sh
case "$1" in
  health) cat '{node.path("h.json")}' ;;
  diag) cat '{node.path("d.json")}' ;;
esac
""")
    node.path("usr/bin/dcgmi").chmod(0o755)
    cfg = node.config
    cfg.data["dcgm"].update(enabled=True, diag_level=1)

    findings = run(cfg, node.root, only={"dcgm"})

    bad = {(f.family, f.component, f.code) for f in findings if f.status is not Status.OK}
    assert bad == {("checker", "dcgmi", "dcgm_unreadable"), ("dcgm", "gpu1", "dcgm_diag_memory")}
    assert "printed no JSON" in next(f.reason for f in findings if f.family == "checker")
    assert decide(findings).level is Level.DRAIN_AFTER_JOB
    assert next(f for f in findings if f.family == "dcgm").severity is Severity.DRAIN_AFTER_JOB


@pytest.mark.parametrize(("section", "key"), [
    ("gpu", "replay_file"), ("mounts", "probe_replay_file"), ("site", "replay_file"),
    ("telemetry", "clock_replay_file"), ("dcgm", "replay_file"), ("fabric", "replay_file"),
    ("leftover", "replay_file")])
def test_a_replay_file_nested_too_deep_is_its_familys_checker_error(node, section, key):
    """Already so before: each family's collector runs under a guard that catches Exception
    (RecursionError is a RuntimeError), so this pins that the guard stays that wide."""
    from rsc_health.engine import run

    node.write("deep.json", "[" * DEEP)
    cfg = node.config
    cfg.data.setdefault(section, {}).update({key: "/deep.json"})
    if section == "gpu":
        cfg.data["gpu"]["backend"] = "replay"

    findings = run(cfg, node.root, save_state=False)

    errors = [f for f in findings if f.status is Status.ERROR]
    assert len(errors) == 1 and "RecursionError" in errors[0].reason, errors
    assert errors[0].family == "checker" and errors[0].component != "engine"
    assert len({f.family for f in findings}) > 5  # the other families were judged


def _deep_line_then_die():
    """A child whose library wrote a deeply nested line into its answer pipe (the only
    descriptor above stderr a probe child keeps), then died without answering."""
    fd = max(int(name) for name in os.listdir("/proc/self/fd"))
    os.write(fd, b'{"ok": ' + b"[" * DEEP + b"\n")
    os._exit(0)


def test_a_probe_child_that_prints_a_line_nested_too_deep_costs_only_its_own_answer():
    """Decoding it raised RecursionError out of bounded.collect: every child's answer was lost
    and none was reaped or killed (a hung statvfs child beside it was left waiting)."""
    children = {"deep": bounded.start(_deep_line_then_die),
                "fine": bounded.start(lambda: {"answer": 42})}

    done = bounded.collect(children, time.monotonic() + 10)

    assert done["fine"] == {"ok": {"answer": 42}}
    assert bounded.DIED in done["deep"]


def test_a_hung_nvml_childs_last_report_nested_too_deep_is_no_partial_answer():
    """The last report of an NVML child abandoned at its deadline is unpacked in the hang's
    own handler; a RecursionError there lost the hang itself (no nvml_hung, never counted
    toward nvml_wedged) for a `gpu: RecursionError` checker error. Now it is a report that
    does not decode: the hang is recorded as one before the device count."""
    from rsc_health.collect import gpu

    good = gpu.unpack_report({"device_count": 1, gpu.PACKED: ['{"index": 0}']})
    assert good == {"device_count": 1, "devices": [{"index": 0}]}
    assert gpu.unpack_report({"device_count": 1, gpu.PACKED: ["[" * DEEP]}) is None


@pytest.mark.parametrize("text", ["[" * DEEP, '{"schema": "rsc_health.snapshot/1", "files": {',
                                  '{"schema": "something else"}'],
                         ids=["nested-too-deep", "cut-short", "not-a-snapshot"])
def test_replaying_a_snapshot_that_cannot_be_read_is_a_checker_error_exit_4(tmp_path, text):
    """`check` exits with the verdict (1 is WARN); a snapshot it could not read exited 1
    (healthctl: error: RecursionError, JSONDecodeError; click's Error for another schema)."""
    snap = tmp_path / "snap.json"
    snap.write_text(text)

    res = CliRunner().invoke(cli, ["check", "--from", str(snap)])

    assert res.exit_code == Level.CHECKER_ERROR.exit_code == 4, res.output
    assert res.output.startswith(f"checker error: {snap}: ")
