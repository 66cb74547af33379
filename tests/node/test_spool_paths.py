"""The spool as plain paths (issue 25: the prolog imports no pathlib): what the spool did with
Path it still does with str and os.path, for whatever path a caller hands it (str or Path,
relative, trailing slash), and what it hands back is str."""

from __future__ import annotations

import os

import pytest

from rsc_health import spool


def _lines(path) -> list[int]:
    return [rec["n"] for _, rec, _ in spool.read_batch(path) if rec]


@pytest.mark.parametrize("spelling", ["spool", "spool/", "./spool//", "ABS"])
def test_a_spool_dir_spelled_any_way_takes_records_and_gives_back_str_batches(
        tmp_path, monkeypatch, spelling):
    """A relative name ("spool": its parent is ".", which is fsync'd when the directory is
    made) or one with trailing or doubled slashes, as str or Path."""
    monkeypatch.chdir(tmp_path)
    where = str(tmp_path / "spool") if spelling == "ABS" else spelling
    spool.append(where, [{"kind": "check", "n": 1}])
    spool.append(tmp_path / "spool", [{"kind": "check", "n": 2}])
    assert oct(os.stat(tmp_path / "spool").st_mode & 0o777) == oct(spool.SPOOL_DIR_MODE)
    batches = spool.claim(where)
    assert all(type(b) is str for b in batches) and len(batches) == 1
    assert os.path.samefile(os.path.dirname(batches[0]), tmp_path / "spool")
    assert _lines(batches[0]) == [1, 2]
    spool.done(batches[0])
    spool.done(batches[0])  # gone already: not an error
    assert spool.claim(tmp_path / "spool") == []


def test_a_spool_claim_takes_only_names_like_a_batch_in_name_order(tmp_path):
    """batch-*.jsonl as the glob matched it: the claimed batch and those waiting since an
    earlier failed delivery, sorted by name (the ~N of a clock stepped back after the name
    it repeats); a temporary or hidden name, or one only like a batch, is left alone."""
    sdir = tmp_path / "spool"
    spool.append(sdir, [{"kind": "check", "n": 3}])
    for name, n in (("batch-20240301T000000000000.jsonl", 1),
                    ("batch-20240301T000000000000~1.jsonl", 2), ("batch-.jsonl", 0)):
        (sdir / name).write_text(f'{{"kind":"check","n":{n}}}\n')
    for other in ("batch-1.jsonl.tmp", ".batch-1.jsonl", "xbatch-1.jsonl", "batch-1.json",
                  "batch.jsonl", "Batch-1.jsonl"):
        (sdir / other).write_text('{"kind":"check","n":99}\n')
    batches = spool.claim(sdir)
    names = [os.path.basename(b) for b in batches]
    assert names[:3] == ["batch-.jsonl", "batch-20240301T000000000000.jsonl",
                         "batch-20240301T000000000000~1.jsonl"]
    assert len(names) == 4 and names[3].startswith("batch-2") and names == sorted(names)
    assert [n for b in batches for n in _lines(b)] == [0, 1, 2, 3]


def test_a_spool_claim_of_a_missing_dir_finds_nothing(tmp_path):
    assert spool.claim(tmp_path / "none") == []
    assert not (tmp_path / "none").exists()


def test_a_second_spool_flush_is_refused_while_one_holds_the_lock_and_not_after(tmp_path):
    """flush_lock, taken on entering the `with`: a second one raises SpoolBusy and holds
    nothing; once the first leaves (even by an exception), the next takes it."""
    sdir = tmp_path / "spool"
    sdir.mkdir()
    lock = spool.flush_lock(str(sdir))
    with lock:
        with pytest.raises(spool.SpoolBusy, match="another spool flush"):
            with spool.flush_lock(sdir):
                pass
    with pytest.raises(KeyError):
        with spool.flush_lock(sdir):
            raise KeyError("a delivery failed")
    with spool.flush_lock(sdir):
        assert os.path.isfile(sdir / spool.FLUSH_LOCK)
    fds = os.listdir("/proc/self/fd")
    with pytest.raises(spool.SpoolBusy):
        with spool.flush_lock(sdir), spool.flush_lock(sdir):
            pass
    assert os.listdir("/proc/self/fd") == fds  # neither the refused nor the held one leaks


def test_without_lone_surrogates_turns_each_into_a_replacement_character():
    value = {"path\udce9": ["/gpfs/caf\udce9", 7, {"x": "ok \ud800\udfff"}]}
    assert spool.without_lone_surrogates(value) == {
        "path\ufffd": ["/gpfs/caf\ufffd", 7, {"x": "ok \ufffd\ufffd"}]}
