"""MemorySlurm, the in-memory Slurm that ships with the package, is CliSlurm's twin: every
method CliSlurm offers, with the same parameters, the same typed errors and Slurm's own
compound states (tests/slurm/test_memory_slurm_twin.py runs the same story on the real
cluster)."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

from rsc_health.slurm import (
    CliSlurm,
    JobGone,
    RequeueRefused,
    SlurmAPI,
    SlurmCommandError,
    SlurmUnavailable,
)
from rsc_health.slurm.memory import MemorySlurm

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _public(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in inspect.getmembers(cls)
            if callable(fn) and not name.startswith("_")}


def test_every_clislurm_method_has_a_memoryslurm_twin_taking_the_same_parameters():
    real, memory = _public(CliSlurm), _public(MemorySlurm)
    missing = sorted(set(real) - set(memory))
    assert missing == [], f"CliSlurm methods without a MemorySlurm twin: {missing}"
    differ = [f"{name}{real[name]} vs {memory[name]}" for name in real
              if list(real[name].parameters) != list(memory[name].parameters)]
    assert differ == []


def test_memoryslurm_is_a_slurmapi():
    protocol = {n for n in SlurmAPI.__dict__ if not n.startswith("_")}
    assert protocol and protocol <= set(_public(MemorySlurm))


def slurm() -> MemorySlurm:
    return MemorySlurm(["n01", "n02"], now=lambda: NOW)


def test_a_drain_is_a_compound_state_with_the_callers_reason_user_and_time():
    s = slurm()
    s.drain("n01", "rsc_health:now:xid79:gpu3 fell off the bus")
    info = s.node("n01")
    assert (info.state, info.reason, info.reason_user, info.reason_time) == (
        "IDLE+DRAIN", "rsc_health:now:xid79:gpu3 fell off the bus", "root", NOW)
    assert info.drain_set and not info.down and info.partitions == ("gpu",)
    assert s.calls == [("drain", "n01", "rsc_health:now:xid79:gpu3 fell off the bus")]
    with pytest.raises(SlurmCommandError, match="must specify a reason"):
        s.drain("n02", "")


def test_a_node_draining_under_a_job_is_drained_once_the_job_is_requeued():
    s = slurm()
    job = s.start_job("n01")
    assert s.node("n01").state == "ALLOCATED"
    s.drain("n01", "rsc_health:now:xid79:x")
    assert s.node("n01").state == "ALLOCATED+DRAIN"
    assert [j.job_id for j in s.jobs_on_node("n01")] == [job]
    s.requeue(job)
    assert s.node("n01").state == "IDLE+DRAIN" and s.jobs_on_node("n01") == []
    assert s.job(job).state == "PENDING"
    s.requeue(job)  # `scontrol requeue Incomplete` of a pending job: left so, exit 0
    assert s.job(job).state == "PENDING" and s.jobs_on_node("n01") == []


def test_a_requeue_is_refused_for_a_no_requeue_job_and_a_job_gone_is_said():
    s = slurm()
    job = s.start_job("n02", requeue=False, whole_node=False)
    assert s.node("n02").state == "MIXED"
    with pytest.raises(RequeueRefused, match="presently disabled"):
        s.requeue(job)
    s.cancel(job)
    assert s.job(job) is None and s.node("n02").state == "IDLE"
    with pytest.raises(JobGone, match="Invalid job id"):
        s.requeue(job)
    s.cancel(job)  # gone already: scancel says nothing
    with pytest.raises(SlurmCommandError, match="not a job id"):
        s.cancel("abc")


def test_resume_lifts_a_drain_or_a_down_and_refuses_a_node_that_has_neither():
    s = slurm()
    with pytest.raises(SlurmCommandError, match="Invalid node state"):
        s.resume("n01")
    s.set_state("n01", "DOWN*+DRAIN", "Not responding", user="slurm")
    assert s.node("n01").down and s.node("n01").drain_set
    s.resume("n01")
    assert (s.node("n01").state, s.node("n01").reason) == ("IDLE", "")
    s.set_state("n02", "IDLE+DRAIN+REBOOT_REQUESTED", "bob: BIOS", user="bob")
    assert s.node("n02").in_hand == "REBOOT_REQUESTED"


def test_one_node_per_call_and_an_unknown_node_is_slurms_error():
    s = slurm()
    with pytest.raises(SlurmCommandError, match="not one Slurm node name"):
        s.drain("n[01-02]", "x")
    with pytest.raises(SlurmCommandError, match="not found"):
        s.node("n99")
    assert s.calls == []


def test_reservations_features_and_weights():
    s = slurm()
    s.create_reservation("rsc_health_qualify_n01", "n01")
    with pytest.raises(SlurmCommandError, match="Duplicate"):
        s.create_reservation("rsc_health_qualify_n01", "n01")
    assert s.reservations() == {"rsc_health_qualify_n01": ("n01", NOW)}
    job = s.submit(["--reservation=rsc_health_qualify_n01", "--nodelist=n01"], ["true"])
    assert s.job(job).state == "PENDING"
    with pytest.raises(SlurmCommandError, match="reservation is invalid"):
        s.submit(["--reservation=nope"], ["true"])
    s.delete_reservation("rsc_health_qualify_n01")
    s.delete_reservation("rsc_health_qualify_n01")  # gone already: as CliSlurm, no error
    assert s.reservations() == {}
    s.update_node("n01", features=["h200", "ib"], weight=50)
    assert (s.node("n01").features, s.node("n01").weight) == (("h200", "ib"), 50)
    s.update_node("n01", weight=7)  # either alone: the other left as it is
    s.update_node("n01", features=[])
    assert (s.node("n01").features, s.node("n01").weight) == ((), 7)
    assert s.calls[-2:] == [("update_node", "n01", None, 7), ("update_node", "n01", (), None)]


@pytest.mark.parametrize("features,weight", [
    (["h200", "a State=IDLE"], 50),  # a feature that would forge a field
    (["h200", "a,b"], 50),
    (["h200"], -1),
    (["h200"], 4294967281),  # past Slurm's largest: scontrol drops it and exits 0
    (["h200"], True),
    (None, None),  # nothing to update
])
def test_a_node_update_refused_in_part_is_refused_whole(features, weight):
    """Features and weight are one update: one refused part changes neither, for
    MemorySlurm and CliSlurm alike (CliSlurm refuses before running scontrol)."""
    s = slurm()
    s.add_node("n01", features=("h100",), weight=10)
    with pytest.raises(SlurmCommandError):
        s.update_node("n01", features=features, weight=weight)
    assert (s.info["n01"].features, s.info["n01"].weight) == (("h100",), 10)
    assert s.calls == []
    with pytest.raises(SlurmCommandError):
        CliSlurm(bin_dir="/nonexistent").update_node("n01", features=features, weight=weight)


def test_the_largest_weight_slurm_takes_is_accepted():
    s = slurm()
    s.update_node("n01", features=["h100"], weight=4294967280)
    assert s.info["n01"].weight == 4294967280


def test_a_stopped_slurmctld_answers_nothing_until_it_is_back():
    s = slurm()
    s.stop()
    for call in (lambda: s.node("n01"), lambda: s.nodes(), lambda: s.drain("n01", "x"),
                 lambda: s.jobs_on_node("n01"), lambda: s.reservations()):
        with pytest.raises(SlurmUnavailable):
            call()
    s.start()
    assert s.node("n01").state == "IDLE" and s.calls == []


def test_a_call_that_landed_before_slurmctld_froze():
    s = slurm()
    s.stop_after("drain")  # the drain is taken and answered; the next look times out
    s.drain("n01", "rsc_health:now:a:b")
    with pytest.raises(SlurmUnavailable):
        s.nodes()
    s.start()
    s.stop_after("drain", answered=False)  # taken, but its answer never came back
    with pytest.raises(SlurmUnavailable):
        s.drain("n02", "rsc_health:now:a:b")
    s.start()
    assert s.node("n02").drain_set and s.reads == 1


def test_clislurm_reads_features_and_weight_from_scontrol():
    from rsc_health.slurm.cli_backend import parse_node_line
    from tests.slurm.test_cli_backend import DRAINED

    line = DRAINED.replace("AvailableFeatures=(null)", "AvailableFeatures=h200,ib").replace(
        "Weight=1", "Weight=50")
    info = parse_node_line(line)
    assert (info.features, info.weight) == (("h200", "ib"), 50)
    assert (parse_node_line(DRAINED).features, parse_node_line(DRAINED).weight) == ((), 1)
