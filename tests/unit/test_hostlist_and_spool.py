import json

import pytest

from rsc_health import spool
from rsc_health.hostlist import HostlistError, compress, expand
from rsc_health.model import Finding, Severity, Status, utcnow


def test_expand_slurm_hostlists():
    assert expand("node[001-003,010],gpu7") == ["node001", "node002", "node003", "node010", "gpu7"]
    assert expand("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    assert expand("None assigned") == []


def test_compress_is_inverse_of_expand():
    hosts = ["node001", "node002", "node003", "node010", "login"]
    assert compress(hosts) == "node[001-003,010],login"
    assert expand(compress(hosts)) == ["node001", "node002", "node003", "node010", "login"]


def test_bad_hostlist_is_a_clear_error():
    with pytest.raises(HostlistError, match="unbalanced"):
        expand("node[1-3")


def test_a_name_of_thousands_of_brackets_expands_without_recursion(monkeypatch):
    """helper-112: one bracket was one level of recursion, so `n[1][1]...` (3,000 brackets, one
    host by count, under MAX_HOSTS) raised RecursionError, which no caller catches: a sacct
    load died whole, and the prolog's first-node test with it."""
    from rsc_health import hostlist
    from rsc_health.node import act

    deep = "n" + "[1]" * 3000
    assert hostlist.count(deep) == 1
    assert expand(deep) == ["n" + "1" * 3000]
    wide = "n" + "[0-1]" * 12  # 4,096 names, the first bracket varying slowest
    names = expand(wide)
    assert len(names) == len(set(names)) == hostlist.count(wide)
    assert names[0] == "n" + "0" * 12 and names[1] == "n" + "0" * 11 + "1"
    assert names[-1] == "n" + "1" * 12 and names == sorted(names)
    monkeypatch.setenv("SLURM_JOB_NODELIST", deep)
    assert act._first_node("n1") is False


def test_compress_then_expand_gives_back_the_hosts():
    """Random host sets of Slurm-like names (seeded): expand(compress(hosts)) names each once."""
    import random

    from rsc_health.hostlist import is_one_node

    rng = random.Random(112)
    for _ in range(3000):
        hosts = ["".join(rng.choice("ab1-_.0") for _ in range(rng.randint(1, 5)))
                 for _ in range(rng.randint(1, 8))]
        hosts = [h for h in dict.fromkeys(hosts) if is_one_node(h)]
        if hosts:
            again = expand(compress(hosts))
            assert sorted(again) == sorted(hosts), (hosts, compress(hosts))


def test_spool_append_claim_read(tmp_path):
    f_bad = Finding("xid", "gpu3", Status.FAIL, Severity.DRAIN_NOW, "fell off", code="xid79")
    f_ok = Finding("mount", "/home", Status.OK, Severity.NONE, "ok")
    recs = spool.check_records([f_bad, f_ok], node="n1", source="sweep", time=utcnow(), job_id=None)
    assert [(r["check"], r["component"], r["status"]) for r in recs] == [
        ("xid", "gpu3", "fail"),
        ("mount", "*", "ok"),
    ]
    spool.append(tmp_path, recs)
    batches = spool.claim(tmp_path)
    assert len(batches) == 1 and not (tmp_path / spool.PENDING).exists()
    with open(batches[0], "a") as fh:
        fh.write("{not json\n")
    rows = list(spool.read_batch(batches[0]))
    assert [r[1]["id"] for r in rows[:2]] == [r["id"] for r in recs]
    assert rows[2][0] == 3 and rows[2][1] is None
    with open(batches[0]) as fh:
        assert json.loads(fh.readline())["kind"] == "check"


def _peak_bytes(fn, *args):
    import tracemalloc

    tracemalloc.start()
    try:
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 - returned for the caller to assert on
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_huge_literal_times_many_hosts_is_refused_before_any_name_is_built():
    """Noticed in review of the hostlist fix: MAX_HOSTS bounded the names, not their length,
    so 100 KB of text before `[1-100000]` built 10 GB of names (a sacct row, a job's
    NodeList). Here 10 KB x 10,000: 100 MB, refused having built none."""
    from rsc_health import hostlist

    huge = "y" * 10_000 + "[1-10000]"
    assert hostlist.count(huge) == 10_000  # under MAX_HOSTS: the count alone lets it by
    refused, peak = _peak_bytes(expand, huge)
    assert isinstance(refused, HostlistError) and "characters" in str(refused)
    assert peak < 5_000_000
    assert hostlist.longest(huge) == 10_005 and hostlist.longest("n[1-3],gpu[08-100]") == 6
    import random

    rng = random.Random(127)  # longest and count as expand has it, without expanding
    for _ in range(1000):
        expr = ",".join(
            "".join(rng.choice(["a", "b-", f"[{rng.randint(0, 9)}-{rng.randint(9, 12)}]",
                                f"[{rng.randint(95, 99)}-10{rng.randint(0, 2)}]",
                                f"[0{rng.randint(0, 9)},7]", "[1][2]"])
                    for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 3)))
        names = expand(expr)
        assert hostlist.measure(expr) == (len(names), max(map(len, names))), expr


def test_a_sacct_nodelist_with_a_name_past_128_characters_builds_none_of_them():
    """The ingest refused such a NodeList only after building every name (its fast path too):
    a 100 KB prefix on `[1-100000]` was gigabytes before the 128-character check."""
    from rsc_health.historian.ingest.sacct_parse import expand_nodelist

    for nodelist in ("x" * 10_000 + "[1-10000]", "a[1-2]," + "x" * 10_000 + "[1-10000]"):
        said, peak = _peak_bytes(expand_nodelist, nodelist)
        assert said == "NodeList has a host name longer than 128 characters"
        assert peak < 5_000_000
    assert expand_nodelist("n" + "x" * 126 + "[1-2]") == ["n" + "x" * 126 + str(n)
                                                         for n in (1, 2)]
