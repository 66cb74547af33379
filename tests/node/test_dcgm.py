"""DCGM's verdicts as findings: `dcgmi health -c -j` (real healthy output; an unhealthy one as
DCGM's Health.cpp writes it) and `dcgmi diag -j` (real DCGM 2.x output; DCGM 4's schema)
through the one reader of diag JSON (qualify.dcgm_diag); dcgmi run bounded, only when asked;
what says nothing of the node is the checker's."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rsc_health.checks import _program
from rsc_health.model import Level, Severity, Status
from rsc_health.sim.qualify_tools import dcgm_diag, dcgm_health

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"


def _judge(node, **dcgm_cfg):
    from rsc_health.engine import run
    from rsc_health.policy import decide

    cfg = node.config
    cfg.data["dcgm"].update(dcgm_cfg)
    findings = run(cfg, node.root, only={"dcgm"})
    return [f for f in findings if f.status is not Status.OK], decide(findings)


def _dcgmi(node, body: str) -> None:
    node.write("usr/bin/dcgmi", "#!/bin/sh\n" + body + "\n")
    node.path("usr/bin/dcgmi").chmod(0o755)


def _prints(node, text: str) -> None:
    node.write("out.txt", text)
    _dcgmi(node, f"cat '{node.path('out.txt')}'")


def test_off_by_default_nothing_is_spawned(node, monkeypatch):
    monkeypatch.setattr(_program, "run", lambda *a, **k: pytest.fail("ran dcgmi"))
    bad, verdict = _judge(node)
    assert bad == [] and verdict.level is Level.OK


def test_the_real_healthy_health_report_is_healthy(node):
    node.write("saved/health.json", (FIXTURES / "health-healthy.json").read_text())
    bad, verdict = _judge(node, health_file="/saved/health.json")
    assert bad == [] and verdict.level is Level.OK


def test_each_health_incident_is_a_finding_on_its_entity(node):
    _prints(node, dcgm_health([
        ("GPU", 1, "Memory system", "Failure", "A volatile double-bit ECC error has occurred"),
        ("GPU", 1, "PCIe system", "Warning", "Detected more than 8 PCIe replays per minute"),
        ("Switch", 0, "NVLINK system", "Warning", "NvSwitch non-fatal error"),
    ]))
    bad, verdict = _judge(node, enabled=True)
    got = {(f.component, f.code, f.severity) for f in bad}
    assert got == {("gpu1", "dcgm_health_memory", Severity.DRAIN_AFTER_JOB),
                   ("gpu1", "dcgm_health_pcie", Severity.WARN),
                   ("nvswitch0", "dcgm_health_nvlink", Severity.WARN)}
    assert verdict.level is Level.DRAIN_AFTER_JOB
    memory = next(f for f in bad if f.code == "dcgm_health_memory")
    assert "double-bit ECC" in memory.reason and not memory.repair


def test_watches_not_enabled_or_no_host_engine_is_the_checkers(node):
    _dcgmi(node, "echo 'Error: Health watches not enabled. Please enable watches.'\nexit 255")
    bad, verdict = _judge(node, enabled=True)
    assert [(f.family, f.code) for f in bad] == [("checker", "dcgm_unreadable")]
    assert "Health watches not enabled" in bad[0].reason
    assert verdict.level is Level.CHECKER_ERROR


def test_the_real_dcgm2_diag_passes_and_a_failed_test_drains_after_the_job(node):
    real = (FIXTURES / "diag-r2-dcgm2.json").read_text()
    node.write("saved/diag.json", real)
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert bad == [] and verdict.level is Level.OK
    doc = json.loads(real)
    memory = doc["DCGM GPU Diagnostic"]["test_categories"][2]["tests"][0]["results"][0]
    memory.update(status="Fail", warnings=[{"warning": "Error using CUDA API cudaMemcpy"}])
    node.write("saved/diag.json", json.dumps(doc))
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert [(f.component, f.code) for f in bad] == [("gpu0", "dcgm_diag_gpu_memory")]
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_dcgm4_diag_run_by_the_sweep_fails_warns_and_untested_is_the_checkers(node):
    _dcgmi(node, f"""case "$1" in
  health) cat '{node.path("h.json")}' ;;
  diag) cat '{node.path("d.json")}' ;;
esac""")
    node.write("h.json", dcgm_health())
    node.write("d.json", dcgm_diag({"Memory": ["Pass", "Fail"], "PCIe": ["Warn", "Pass"],
                                    "Targeted Stress": ["Fail", "Pass"]},
                                   warnings={"Targeted Stress": "GPU 0 is being used by "
                                             "another process", "Memory": "DBE detected"}))
    bad, verdict = _judge(node, enabled=True, diag_level=1)
    got = {(f.family, f.component, f.code) for f in bad}
    assert got == {("dcgm", "gpu1", "dcgm_diag_memory"), ("dcgm", "gpu0", "dcgm_diag_pcie"),
                   ("checker", "gpu0", "dcgm_unreadable")}
    assert verdict.level is Level.DRAIN_AFTER_JOB
    node.write("d.json", dcgm_diag({}, runtime_error="host engine not running"))
    bad, _ = _judge(node, enabled=True, diag_level=1)
    assert [f.code for f in bad] == ["dcgm_unreadable"] and "runtime error" in bad[0].reason


def test_a_hung_or_missing_dcgmi_is_the_checkers_and_bounded(node):
    _dcgmi(node, "sleep 30")
    started = time.monotonic()
    bad, verdict = _judge(node, enabled=True, timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert [f.code for f in bad] == ["dcgm_unreadable"] and "in time" in bad[0].reason
    bad, verdict = _judge(node, enabled=True, dcgmi="/opt/none/dcgmi")
    assert [f.code for f in bad] == ["dcgm_unreadable"] and "missing" in bad[0].reason
    assert verdict.level is Level.CHECKER_ERROR


@pytest.mark.parametrize("text", [
    '{"body": [1, 2], "header": []}',
    '{"body": {"Overall Health": {"value": "Exploded"}}}',
    '{"body": {"Overall Health": {"value": "Failure"}, "GPU": {"children": {"0": 7}}}}',
    "\x00\xff" * 100,
    '{"body": {"Overall Health": {"value": "Warning"}, "GPU": {"children": {"0": {"children":'
    ' {"Errors": {"children": {"SM system": {"value": "Warning", "overflow": ["\\u001b[31mx"]'
    '}}}}}}}}}',
])
def test_hostile_health_output_never_crashes_and_drains_only_on_a_failure(node, text):
    _prints(node, text)
    bad, verdict = _judge(node, enabled=True)
    assert bad  # something is said
    assert all("\x1b" not in f.reason for f in bad)
    if "Failure" in text:
        assert verdict.level is Level.DRAIN_AFTER_JOB  # DCGM said so overall
    else:
        assert verdict.level in (Level.CHECKER_ERROR, Level.WARN)


def test_a_flood_of_output_is_cut_and_not_judged(node):
    _dcgmi(node, "head -c 9000000 /dev/zero")
    bad, verdict = _judge(node, enabled=True)
    assert [f.code for f in bad] == ["dcgm_unreadable"] and verdict.level is Level.CHECKER_ERROR


# /proc/net/tcp as the kernel prints it: a LISTEN socket (st 0A) on 127.0.0.1:5555 (0100007F:15B3).
def _tcp_listener(local: str, uid: int) -> str:
    return (f"   0: {local} 00000000:0000 0A 00000000:00000000 00:00000000 00000000 {uid:5d}"
            "        0 91234 1 0000000004a0664b 100 0 0 10 0\n")


def _proc_net_tcp(node, *rows: str, table: str = "tcp") -> None:
    head = node.path(f"proc/net/{table}").read_text().splitlines(keepends=True)[0]
    node.write(f"proc/net/{table}", head + "".join(rows))


def _socket(node, where: str, owner: int, dir_mode: int) -> None:
    """A unix socket inode as nv-hostengine -d leaves it (mknod: the test root's path is
    longer than a socket address may be)."""
    import os
    import stat

    path = node.path(where)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(dir_mode)
    os.mknod(path, stat.S_IFSOCK | 0o777)
    os.chown(path, owner, owner)


def _recording_dcgmi(node) -> Path:
    marker = node.path("dcgmi-ran")
    node.write("h.json", dcgm_health())
    node.write("d.json", dcgm_diag({"Memory": ["Pass"]}))
    _dcgmi(node, f"""echo "$@" >> '{marker}'
case "$1" in health) cat '{node.path("h.json")}' ;; diag) cat '{node.path("d.json")}' ;; esac""")
    return marker


def test_dcgmi_is_pointed_at_the_configured_host_engine(node):
    marker = _recording_dcgmi(node)
    bad, verdict = _judge(node, enabled=True, diag_level=1)
    assert bad == [] and verdict.level is Level.OK
    assert marker.read_text().splitlines() == [
        "health -g 0 -c -j --host 127.0.0.1:5555", "diag -r 1 -j --host 127.0.0.1:5555"]
    # nv-hostengine -d on a socket root owns in a root-only directory.
    _socket(node, "run/nvidia-dcgm/nv-hostengine.sock", 0, 0o755)
    marker.unlink()
    bad, verdict = _judge(node, enabled=True, host="unix:///run/nvidia-dcgm/nv-hostengine.sock")
    assert bad == [] and verdict.level is Level.OK
    assert marker.read_text() == "health -g 0 -c -j --host unix:///run/nvidia-dcgm/nv-hostengine.sock\n"


@pytest.mark.parametrize(("rows", "table", "said"), [
    # nv-hostengine down, a user's listener on its port answers "Healthy".
    ([_tcp_listener("0100007F:15B3", 1000)], "tcp", "uid 1000, not root"),
    # ...or on 0.0.0.0:5555, or on [::1]:5555 beside root's 127.0.0.1 (localhost may be ::1).
    ([_tcp_listener("00000000:15B3", 1000)], "tcp", "uid 1000, not root"),
    ([_tcp_listener("00000000000000000000000001000000:15B3", 1000)], "tcp6", "uid 1000"),
    # nothing listens: the next user to bind the port would answer.
    ([], "tcp", "nothing listens on 127.0.0.1:5555"),
])
def test_dcgmi_never_asks_a_host_engine_port_a_user_could_answer(node, rows, table, said):
    marker = _recording_dcgmi(node)
    if table == "tcp":
        _proc_net_tcp(node, *rows)
    else:
        _proc_net_tcp(node, *rows, table="tcp6")
    bad, verdict = _judge(node, enabled=True, diag_level=1)
    assert not marker.exists()  # dcgmi never asked whoever listens there
    assert [(f.family, f.code) for f in bad] == [("checker", "dcgm_unreadable")] * 2
    assert said in bad[0].reason and verdict.level is Level.CHECKER_ERROR


def test_a_host_engine_socket_someone_else_could_own_or_swap_is_refused(node):
    marker = _recording_dcgmi(node)
    for where, owner, mode in (("tmp/nv-hostengine", 1000, 0o1777),   # a user's, in /tmp
                               ("srv/dcgm/he.sock", 0, 0o777)):      # root's, swappable
        _socket(node, where, owner, mode)
        bad, verdict = _judge(node, enabled=True, host=f"unix:///{where}")
        assert not marker.exists(), where
        assert [f.code for f in bad] == ["dcgm_unreadable"], where
        assert verdict.level is Level.CHECKER_ERROR
    assert "uid 1000" in _judge(node, enabled=True, host="unix:///tmp/nv-hostengine")[0][0].reason
    bad, _ = _judge(node, enabled=True, host="unix:///run/none.sock")
    assert "not running" in bad[0].reason and not marker.exists()
    bad, _ = _judge(node, enabled=True, host="--help")
    assert "not an address" in bad[0].reason and not marker.exists()


@pytest.mark.parametrize("after", [
    # nv-hostengine restarted while dcgmi ran (its socket is a new one): between the two, the
    # port was free, and whoever bound it first answered dcgmi.
    _tcp_listener("0100007F:15B3", 0).replace(" 91234 ", " 91299 "),
    # a user's listener took the port while dcgmi ran (and still holds it).
    _tcp_listener("0100007F:15B3", 1000),
    # nothing listens any more: it left, perhaps after answering.
    "",
])
def test_a_host_engine_listener_that_changed_while_dcgmi_ran_is_not_believed(node, after):
    marker = _recording_dcgmi(node)
    _proc_net_tcp(node, _tcp_listener("0100007F:15B3", 0))  # root's nv-hostengine, inode 91234
    head = node.path("proc/net/tcp").read_text().splitlines(keepends=True)[0]
    node.write("tcp.after", head + after)
    node.write("h.json", dcgm_health())
    _dcgmi(node, f"""echo "$@" >> '{marker}'
cp '{node.path("tcp.after")}' '{node.path("proc/net/tcp")}'
cat '{node.path("h.json")}'""")
    bad, verdict = _judge(node, enabled=True)
    assert marker.exists()  # asked: root answered when it was asked...
    assert [(f.family, f.code) for f in bad] == [("checker", "dcgm_unreadable")]
    assert "while dcgmi ran" in bad[0].reason  # ...but who answered it is not known
    assert verdict.level is Level.CHECKER_ERROR


def test_a_host_engine_listener_that_stayed_put_is_believed(node):
    marker = _recording_dcgmi(node)
    _proc_net_tcp(node, _tcp_listener("0100007F:15B3", 0))
    bad, verdict = _judge(node, enabled=True, diag_level=1)
    assert bad == [] and verdict.level is Level.OK and len(marker.read_text().splitlines()) == 2


CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qualify" / "captures"


def test_a_diag_failed_only_on_persistence_mode_warns_and_never_drains(node):
    """A real DCGM 4.2.3 `dcgmi diag -r 1 -j` from a GB10 (tests/fixtures/qualify/captures):
    `software` Fail with DCGM_FR_PERSISTENCE_MODE (error_id 29) alone, a setting of the node.
    It drained the node after the job as if a part had failed; now it is a warning. The same
    document with a hardware error id beside it still drains."""
    real = (CAPTURES / "dcgm_diag-r1-dcgm4.2.3-gb10-persistence-mode.json").read_text()
    node.write("saved/diag.json", real)
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert bad and all(f.severity is Severity.WARN for f in bad), bad
    assert any("node setting" in f.reason for f in bad)
    assert verdict.level is Level.WARN

    hardware = real.replace("\"error_id\" : 29", "\"error_id\" : 95", 1)  # not a setting
    assert hardware != real
    node.write("saved/diag.json", hardware)
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert verdict.level is Level.DRAIN_AFTER_JOB


def test_a_diag_summary_fail_no_result_places_is_the_checkers_not_ok(node):
    """The sweep's reading of the same document: not a drain (no part named), never ok."""
    import json as _json

    doc = _json.loads((CAPTURES / "dcgm_diag-r1-dcgm4.2.3-gb10-persistence-mode.json")
                      .read_text())
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0].update(
        status="Pass", warnings=[])
    node.write("saved/diag.json", _json.dumps(doc))
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert [(f.family, f.code) for f in bad] == [("checker", "dcgm_unreadable")], bad
    assert "summary says Fail" in bad[0].reason


def test_a_diag_double_bit_error_drains_though_an_allocation_failed_beside_it(node):
    """helper-112: a Fail listing a double-bit ECC error and the allocation the broken GPU then
    failed was read as "did not test" (a checker error, never a drain) because one warning
    sounded like it: the node with the DBE stayed in service. The real GB10 capture (DCGM 4,
    error_ids) and the real DCGM 2.x document (texts alone), each with such a memory result."""
    doc = json.loads((CAPTURES / "dcgm_diag-r1-dcgm4.2.3-gb10-persistence-mode.json")
                     .read_text())
    tests = doc["DCGM Diagnostic"]["test_categories"][0]["tests"]
    tests[0]["results"][0].update(status="Pass", warnings=[])
    tests[0]["test_summary"]["status"] = "Pass"
    dbe = "Detected 2 volatile double-bit ECC error(s) in GPU 1."
    alloc = "Couldn't allocate at least 80.0% of GPU memory on GPU 1"
    tests.append({"name": "memory", "test_summary": {"status": "Fail"}, "results": [
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Fail",
         "warnings": [{"error_category": 10, "error_id": 56, "error_severity": 4,
                       "warning": alloc},
                      {"error_category": 10, "error_id": 4, "error_severity": 6,
                       "warning": dbe}]}]})
    node.write("saved/diag.json", json.dumps(doc))
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert [(f.family, f.component, f.code) for f in bad] == [
        ("dcgm", "gpu1", "dcgm_diag_memory")], bad
    assert dbe in bad[0].reason and verdict.level is Level.DRAIN_AFTER_JOB

    dcgm2 = json.loads((FIXTURES / "diag-r2-dcgm2.json").read_text())
    memory = dcgm2["DCGM GPU Diagnostic"]["test_categories"][2]["tests"][0]["results"][0]
    memory.update(status="Fail", warnings=[{"warning": alloc}, {"warning": dbe}])
    node.write("saved/diag.json", json.dumps(dcgm2))
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert [(f.family, f.component) for f in bad] == [("dcgm", "gpu0")], bad
    assert verdict.level is Level.DRAIN_AFTER_JOB

    # The allocation alone: the diag did not test, the checker's, no drain.
    memory.update(warnings=[{"warning": alloc}])
    node.write("saved/diag.json", json.dumps(dcgm2))
    bad, verdict = _judge(node, diag_file="/saved/diag.json")
    assert [(f.family, f.code) for f in bad] == [("checker", "dcgm_unreadable")], bad
    assert verdict.level is not Level.DRAIN_AFTER_JOB
