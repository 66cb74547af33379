"""Text a person or a user can put into Slurm (a node's Features, Comment or Extra, a drain
Reason, a job's name or --comment) comes back in scontrol's and squeue's output. None of it may
steer what we read as a node's name, state, partitions or reason, or which jobs are on a node:
where the text makes the line ambiguous the node is refused, never guessed at."""

from __future__ import annotations

import pytest

from rsc_health.slurm import SlurmCommandError
from rsc_health.slurm.cli_backend import parse_node_line

from .test_cli_backend import DRAINED, fake_bin
from .test_healthctl_slurm import healthctl

IDLE = DRAINED.split(" Reason=")[0].replace("IDLE+DRAIN", "IDLE")


# ---- parsing, on lines shaped like 22.05.8's `scontrol -o show node` ------------------------
def test_a_comment_holding_our_reason_is_not_the_reason_of_a_node_that_has_none():
    # Slurm prints Reason, then Comment, then Extra: with no Reason, a Comment that reads
    # "Reason=rsc_health:..." must not become the node's reason (is_ours would say yes).
    line = (IDLE.replace("State=IDLE", "State=DOWN")
            + " Comment=see Reason=rsc_health:now:xid79:gpu3 [root@2026-11-22T01:22:26]")
    info = parse_node_line(line)
    assert info.down and info.reason == ""


def test_partitions_in_a_comment_do_not_put_a_partitionless_node_into_a_partition():
    line = IDLE.replace(" Partitions=gpu ", " ") + " Comment=moved Partitions=gpu,big"
    assert parse_node_line(line).partitions == ()


def test_a_persons_reason_full_of_key_value_text_stays_theirs():
    line = IDLE.replace("State=IDLE", "State=IDLE+DRAIN") + (
        " Reason=bob: bad State=IDLE Partitions=x Reason=rsc_health:now:a:b "
        "[bob@2026-11-22T01:22:26] Comment=c State=IDLE Extra=e NodeName=node09")
    info = parse_node_line(line)
    assert (info.name, info.state, info.partitions) == ("node02", "IDLE+DRAIN", ("gpu",))
    assert info.reason == "bob: bad State=IDLE Partitions=x Reason=rsc_health:now:a:b"
    assert info.reason_user == "bob"


@pytest.mark.parametrize("features", ["a State=IDLE", "a Partitions=big State=IDLE"])
def test_features_holding_a_state_make_the_node_ambiguous_not_idle(features):
    # Features print before State: "a State=IDLE" would be read as the state of a drained node.
    line = DRAINED.replace("AvailableFeatures=(null)", f"AvailableFeatures={features}")
    with pytest.raises(SlurmCommandError, match="ambiguous"):
        parse_node_line(line)


def test_a_multiline_comment_is_part_of_its_node_and_adds_no_record(tmp_path):
    two = [DRAINED + " Comment=racked\nby bob State=IDLE", IDLE.replace("node02", "node03")]
    slurm = fake_bin(tmp_path, "scontrol", "cat <<'EOF'\n" + "\n".join(two) + "\nEOF\n")
    assert [(n.name, n.state) for n in slurm.nodes()] == [("node02", "IDLE+DRAIN"),
                                                          ("node03", "IDLE")]


def test_a_node_listed_twice_is_asked_for_alone_whose_first_line_is_its_own(tmp_path):
    # node03's Comment holds a newline and a line that reads like node02, idle; the whole-fleet
    # listing shows node02 twice. Asked alone, Slurm prints node02's own record first.
    forged = IDLE.replace("AvailableFeatures=(null) ", "")
    fleet = [IDLE.replace("node02", "node03") + " Comment=x", forged, DRAINED]
    slurm = fake_bin(tmp_path, "scontrol",
                     # asked for one node: a name after `show node` (with or without -a)
                     'for a; do last=$a; done\n'
                     f'if [ "$last" != node ]; then echo \'{DRAINED}\'; exit; fi\n'
                     "cat <<'EOF'\n" + "\n".join(fleet) + "\nEOF\n")
    assert [(n.name, n.state) for n in slurm.nodes()] == [("node03", "IDLE"),
                                                          ("node02", "IDLE+DRAIN")]
    assert slurm.node("node02").state == "IDLE+DRAIN"


# ---- the real cluster ----------------------------------------------------------------------
@pytest.mark.slurm
def test_features_reading_state_idle_never_let_us_drain_over_or_resume_a_persons_drain(
        slurm_cluster, tmp_path):
    c = slurm_cluster
    c.run(["scontrol", "update", "NodeName=node03", "AvailableFeatures=a State=IDLE",
           "ActiveFeatures=a State=IDLE"])
    try:
        c.run(["scontrol", "update", "NodeName=node03", "State=DRAIN", "Reason=bob: RMA 42"])
        out = healthctl(c, "drain", "node03", "--reason", "rack work", root=tmp_path)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stdout + out.stderr
        assert c.node("node03")["Reason"].startswith("bob: RMA 42")
        out = healthctl(c, "resume", "node03", root=tmp_path)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "DRAIN" in c.node_state("node03")
    finally:
        c.run(["scontrol", "update", "NodeName=node03", "AvailableFeatures=",
               "ActiveFeatures="], check=False)


@pytest.mark.slurm
def test_a_reason_comment_and_extra_full_of_slurm_text_on_the_real_cluster(slurm_cluster,
                                                                         monkeypatch):
    c = slurm_cluster
    monkeypatch.setenv("SLURM_CONF", c.env["SLURM_CONF"])
    from rsc_health.slurm import CliSlurm

    slurm = CliSlurm(timeout_s=20)
    long = "x" * 65536
    c.run(["scontrol", "update", "NodeName=node04",
           "Comment=c Reason=rsc_health:now:xid79:gpu [root@2026-01-01T00:00:00]\n"
           "NodeName=node05 State=IDLE+DRAIN Partitions=gpu CfgTRES=x",
           "Extra=e State=IDLE Partitions=big"])
    try:
        c.run(["scontrol", "update", "NodeName=node04", "State=DRAIN",
               b"Reason=bob: bad State=IDLE caf\xe9 | \"q\" \nReason=rsc_health:now:a:b "
               + long.encode()])
        info = slurm.node("node04")
        assert (info.state, info.partitions) == ("IDLE+DRAIN", ("gpu",))
        assert info.reason.startswith("bob: bad State=IDLE caf") and info.reason_user
        fleet = {n.name: n for n in slurm.nodes()}
        assert sorted(fleet) == c.node_names
        assert fleet["node05"].state == "IDLE" and not fleet["node05"].reason
    finally:
        # The harness reads Slurm's output as UTF-8: the Latin-1 reason must not outlive us.
        c.run(["scontrol", "update", "NodeName=node04", "State=RESUME", "Comment=", "Extra="],
              check=False)


def test_one_ambiguous_node_is_left_out_of_the_listing_not_every_nodes_drain(tmp_path):
    """node03's Features read "a State=IDLE". The whole-fleet listing raised on it, and every
    node's first drain, the guard, the suspect tier and lemons --apply read that listing: a
    dead GPU on node04 could not drain while node03's text stood. Now node03 alone is refused
    (left out, named in refused_nodes; asked for by name it still raises)."""
    bad = DRAINED.replace("node02", "node03").replace("AvailableFeatures=(null)",
                                                      "AvailableFeatures=a State=IDLE")
    fleet = [DRAINED, bad, IDLE.replace("node02", "node04")]
    slurm = fake_bin(tmp_path, "scontrol", "cat <<'EOF'\n" + "\n".join(fleet) + "\nEOF\n")
    assert [(n.name, n.state) for n in slurm.nodes()] == [("node02", "IDLE+DRAIN"),
                                                          ("node04", "IDLE")]
    assert slurm.refused_nodes == ["node03"]
    with pytest.raises(SlurmCommandError, match="ambiguous"):
        slurm.nodes(["node03"])
