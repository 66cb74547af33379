"""The CLI backend's parsing and error typing, on output captured from Slurm 22.05.8."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from rsc_health.slurm import CliSlurm, RequeueRefused, SlurmCommandError, SlurmUnavailable
from rsc_health.slurm.cli_backend import parse_kv, parse_node_line

# `scontrol -o show node node02` from the test cluster, after an rsc_health drain.
DRAINED = (
    "NodeName=node02 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.32 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=43023 Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 FreeMem=22826 Sockets=2 Boards=1 "
    "State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu  BootTime=2026-11-22T01:09:11 SlurmdStartTime=2026-11-22T01:22:21 "
    "LastBusyTime=2026-11-22T01:22:21 CfgTRES=cpu=2,mem=1000M,billing=2,gres/gpu=8 AllocTRES= "
    "CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s "
    "Reason=rsc_health:now:xid79:gpu3 fell off the bus [root@2026-11-22T01:22:26]"
)


def test_drained_node_line_gives_reason_user_time_and_partitions(monkeypatch):
    # scontrol runs with TZ=UTC: its times are UTC whatever this process's own zone is.
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    info = parse_node_line(DRAINED)
    assert info.name == "node02" and info.state == "IDLE+DRAIN" and info.drain_set
    assert info.reason == "rsc_health:now:xid79:gpu3 fell off the bus"
    assert info.reason_user == "root"
    assert info.reason_time == datetime(2026, 11, 22, 1, 22, 26, tzinfo=UTC)
    assert info.partitions == ("gpu",)
    assert info.boot_time == datetime(2026, 11, 22, 1, 9, 11, tzinfo=UTC)
    assert parse_node_line(DRAINED.replace("BootTime=2026-11-22T01:09:11",
                                           "BootTime=None")).boot_time is None
    monkeypatch.undo()
    time.tzset()


def test_values_with_spaces_stay_whole():
    kv = parse_kv(DRAINED)
    assert kv["OS"] == "Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0"
    assert kv["CfgTRES"] == "cpu=2,mem=1000M,billing=2,gres/gpu=8"
    assert kv["AllocTRES"] == ""


def test_idle_node_has_no_reason():
    line = DRAINED.split(" Reason=")[0].replace("IDLE+DRAIN", "IDLE")
    info = parse_node_line(line)
    assert info.reason == "" and not info.drain_set and not info.down


def fake_bin(tmp_path, name: str, body: str) -> CliSlurm:
    script = tmp_path / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return CliSlurm(timeout_s=1, bin_dir=str(tmp_path))


def test_a_reboot_in_the_hour_dst_repeats_reads_as_the_time_it_was(tmp_path, monkeypatch):
    """scontrol prints wall time in its TZ. Read as local time, the second 01:30 of a DST
    fall-back (06:30 UTC in New York, 2026-11-01) reads as the first (05:30 UTC): a reboot
    then looks older than the boot noted under our drain, and its lift goes unseen. scontrol
    runs with TZ=UTC, and its times are read as UTC, whatever this process's zone."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        # Like scontrol: the boot (epoch 1793514600, 06:30 UTC) in the caller's TZ.
        line = DRAINED.replace("BootTime=2026-11-22T01:09:11",
                               "BootTime=$(date -d @1793514600 +%Y-%m-%dT%H:%M:%S)")
        slurm = fake_bin(tmp_path, "scontrol", f'echo "{line}"\n')
        boot = slurm.node("node02").boot_time
    finally:
        monkeypatch.undo()
        time.tzset()
    assert boot == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)


def test_a_hung_scontrol_is_slurm_unavailable(tmp_path):
    slurm = fake_bin(tmp_path, "scontrol", "exec sleep 30\n")
    with pytest.raises(SlurmUnavailable, match="did not answer within 1s"):
        slurm.node("node01")


def test_no_controller_is_slurm_unavailable(tmp_path):
    slurm = fake_bin(tmp_path, "scontrol", "echo 'slurm_load_node error: Unable to contact "
                     "slurm controller (connect failure)' >&2; exit 1\n")
    with pytest.raises(SlurmUnavailable):
        slurm.nodes()


def test_a_configless_client_without_a_controller_is_unavailable_in_one_line(tmp_path):
    # What 22.05's scontrol prints on a configless node whose DNS SRV lookup fails.
    slurm = fake_bin(tmp_path, "scontrol", (
        "echo 'scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host' >&2\n"
        "echo 'scontrol: error: fetch_config: DNS SRV lookup failed' >&2\n"
        "echo 'scontrol: fatal: Could not establish a configuration source' >&2; exit 1\n"))
    with pytest.raises(SlurmUnavailable) as caught:
        slurm.node("node01")
    assert "\n" not in str(caught.value)
    assert "Could not establish a configuration source" in str(caught.value)


def test_a_refusal_after_a_chain_of_errors_says_the_fatal_line_on_one_line(tmp_path):
    slurm = fake_bin(tmp_path, "scontrol", "echo 'scontrol: error: first' >&2; "
                     "echo 'scontrol: fatal: Invalid node name specified' >&2; "
                     "echo 'trailing noise' >&2; exit 1\n")
    with pytest.raises(SlurmCommandError) as caught:
        slurm.drain("nope", "rsc_health:manual:manual:x")
    assert str(caught.value).endswith("scontrol: fatal: Invalid node name specified")
    assert "first" in caught.value.stderr  # the whole of it is kept for whoever needs it


def test_requeue_refusal_is_typed(tmp_path):
    # What 22.05.8 prints for a job submitted with --no-requeue.
    slurm = fake_bin(tmp_path, "scontrol",
                     "echo 'Requested operation is presently disabled for job 1' >&2; exit 1\n")
    with pytest.raises(RequeueRefused):
        slurm.requeue("1")


def test_other_refusals_are_command_errors_with_slurms_message(tmp_path):
    slurm = fake_bin(tmp_path, "scontrol", "echo 'Invalid node name specified' >&2; exit 1\n")
    with pytest.raises(SlurmCommandError, match="Invalid node name specified"):
        slurm.drain("nope", "rsc_health:manual:manual:x")


def test_reason_reaches_scontrol_as_one_argument_never_through_a_shell(tmp_path):
    slurm = fake_bin(tmp_path, "scontrol", f'printf "%s\\n" "$@" > {tmp_path}/argv\n')
    slurm.drain("node01", "rsc_health:now:x:$(touch pwned); `id` | rm")
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == ["update", "NodeName=node01", "State=DRAIN",
                    "Reason=rsc_health:now:x:$(touch pwned); `id` | rm"]
    assert not (tmp_path / "pwned").exists()


def test_requeue_of_a_job_that_left_is_a_typed_error_not_text_to_match():
    """actions.py catches JobGone, never scontrol's wording."""
    import os
    import stat
    import tempfile
    from pathlib import Path

    from rsc_health.slurm import CliSlurm, JobGone

    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "scontrol"
        fake.write_text("#!/bin/sh\necho 'slurm_requeue error: Job is pending execution' >&2\n"
                        "exit 1\n")
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        with pytest.raises(JobGone):
            CliSlurm(bin_dir=tmp).requeue("12")
        assert os.path.exists(fake)


@pytest.mark.parametrize("name", ["node[01-64]", "node01,node02", "node01 State=RESUME",
                                  "-h", "node01\nnode02", ""])
def test_a_name_that_is_not_one_node_never_reaches_scontrol_update(tmp_path, name):
    """scontrol expands NodeName=node[01-64] and NodeName=a,b: one call would drain or resume
    every node named. Such a name is refused before anything runs."""
    slurm = fake_bin(tmp_path, "scontrol", f'printf "%s\\n" "$@" >> {tmp_path}/argv\n')
    with pytest.raises(SlurmCommandError, match="not one Slurm node name"):
        slurm.drain(name, "rsc_health:lemon:xid_cnt:xid_cnt 6 (min 5)")
    with pytest.raises(SlurmCommandError, match="not one Slurm node name"):
        slurm.resume(name)
    with pytest.raises(SlurmCommandError, match="not one Slurm node name"):
        slurm.node(name)
    assert not (tmp_path / "argv").exists()


def test_node_answers_for_the_node_asked_never_the_first_line_printed(tmp_path):
    # A show that lists more than the node asked for (an alias, a future scontrol): the state
    # and reason used to decide on node01 must be node01's, not whichever line came first.
    human = DRAINED.replace("rsc_health:now:xid79:gpu3 fell off the bus", "bad dimm -- bob")
    idle = "NodeName=node01 State=IDLE Partitions=gpu CfgTRES=cpu=2"
    slurm = fake_bin(tmp_path, "scontrol", f"echo '{idle.replace('node01', 'node02')}'\n"
                     f"echo '{human.replace('node02', 'node01')}'\n")
    info = slurm.node("node01")
    assert (info.name, info.reason) == ("node01", "bad dimm -- bob")
    gone = fake_bin(tmp_path, "scontrol", f"echo '{idle.replace('node01', 'node02')}'\n")
    with pytest.raises(SlurmCommandError, match="no such node"):
        gone.node("node01")


def test_an_update_slurm_only_partly_took_is_an_error_though_scontrol_exits_0(tmp_path):
    """scontrol 22.05, asked for features and a weight past its largest, applies the features,
    drops the weight, prints its error and exits 0: not a change made."""
    slurm = fake_bin(tmp_path, "scontrol", "echo 'scontrol: error: Weight value (4294967294) "
                     "is greater than 4294967280' >&2; exit 0\n")
    with pytest.raises(SlurmCommandError, match="greater than 4294967280"):
        slurm.update_node("node01", features=["rsc_trusted"], weight=5)


@pytest.mark.parametrize("stderr", ["", "scontrol: warning: something to know"])
def test_an_update_that_exits_0_without_an_error_is_done(tmp_path, stderr):
    slurm = fake_bin(tmp_path, "scontrol", f"echo '{stderr}' >&2; exit 0\n")
    slurm.drain("node01", "rsc_health:now:xid79:gpu3")  # no exception


def test_a_read_that_says_error_on_stderr_and_exits_0_still_answers(tmp_path):
    slurm = fake_bin(tmp_path, "scontrol", "echo 'scontrol: error: a passing complaint' >&2; "
                     "exit 0\n")
    assert slurm.nodes() == []


def test_a_requeue_slurm_took_is_done_though_squeue_cannot_say_so_after(tmp_path):
    """`scontrol requeue Incomplete` answered 0; the squeue that tells a requeued job from one
    left alone (ended) found slurmctld gone. The requeue raised SlurmUnavailable: the drain-now
    kept its verdict pending and its requeue went unreported. What slurmctld answered stands."""
    fake_bin(tmp_path, "squeue", "echo 'squeue: error: Unable to contact slurm controller "
                                 "(connect failure)' >&2; exit 1\n")
    slurm = fake_bin(tmp_path, "scontrol", "exit 0\n")
    slurm.requeue("42")  # no exception


def test_a_requeue_of_a_job_that_had_ended_is_job_gone(tmp_path):
    from rsc_health.slurm import JobGone

    fake_bin(tmp_path, "squeue", "echo CANCELLED\n")
    slurm = fake_bin(tmp_path, "scontrol", "exit 0\n")
    with pytest.raises(JobGone, match="had ended"):
        slurm.requeue("42")


def test_a_time_with_a_zone_keeps_it_and_garbage_is_no_time():
    from rsc_health.slurm.cli_backend import slurm_time

    assert slurm_time("2026-11-01T01:30:00-05:00") == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
    assert slurm_time("2026-11-01T06:30:00") == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
    for text in ("Unknown", "None", "(null)", "", None, "2026-13-01T00:00:00", "x" * 10_000,
                 "2026-11-01T01:30:00\n|x"):
        assert slurm_time(text) is None, text


def test_a_persons_reason_with_a_bracketed_time_past_the_calendar_breaks_no_listing(tmp_path):
    """A person's reason holding "[ops@9999-12-31T23:59:59-01:00]" (Slurm 22.05.8 stores and
    prints it as written, before its own stamp): it was read as the reason's stamp, its UTC
    overflowed, and every listing failed with OverflowError: no node of the fleet drained
    while it stood, `healthctl status` died. Slurm's own stamp is the one read; a record that
    still cannot be read is that node refused, the others listed."""
    person = "RMA [ops@9999-12-31T23:59:59-01:00] pending"
    line = DRAINED.replace("rsc_health:now:xid79:gpu3 fell off the bus", person)
    info = parse_node_line(line)
    assert info.drain_set and info.reason == person and info.reason_user == "root"
    assert info.reason_time == datetime(2026, 11, 22, 1, 22, 26, tzinfo=UTC)
    from rsc_health.slurm.cli_backend import slurm_time
    assert slurm_time("9999-12-31T23:59:59-01:00") is None
    assert slurm_time("0001-01-01T00:00:00+01:00") is None
    idle = "NodeName=node01 State=IDLE Partitions=gpu CfgTRES=cpu=2"
    slurm = fake_bin(tmp_path, "scontrol", f"echo '{line}'\necho '{idle}'\n")
    assert [(n.name, n.reason) for n in slurm.nodes()] == [("node02", person), ("node01", "")]
    # a record past what the parser foresees is its node refused, not the listing
    import rsc_health.slurm.cli_backend as cb
    real = cb.parse_node_line

    def fussy(rec):
        if rec.startswith("NodeName=node02 "):
            raise OverflowError("date value out of range")
        return real(rec)

    cb.parse_node_line = fussy
    try:
        assert [n.name for n in slurm.nodes()] == ["node01"]
        assert slurm.refused_nodes == ["node02"]
    finally:
        cb.parse_node_line = real
