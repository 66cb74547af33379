"""The spool between a writer and a flush, and under a clock that stands still or steps back.

- A writer opens pending.jsonl, and before it holds the flock a flush claims the file (renames
  it to a batch), reads it, delivers it and deletes it: the writer's records must not go into
  the claimed inode (delivered already, then unlinked) but into a new pending file. Realistic
  when the writer waits on the flock behind another writer's slow fsync while the flush's
  claim gets the lock first.
- Batch names come from the wall clock: a clock stepped back to (or frozen at) the instant of
  an undelivered batch must not make claim() rename over it."""

from __future__ import annotations

from datetime import datetime

import pytest

from rsc_health import spool


def _numbers(paths) -> list[int]:
    out = []
    for path in paths:
        out.extend(rec["n"] for _, rec, _ in spool.read_batch(path) if rec)
    return sorted(out)


def test_a_flush_between_a_writers_open_and_its_lock_loses_nothing(tmp_path, monkeypatch):
    sdir = tmp_path / "spool"
    spool.append(sdir, [{"kind": "check", "n": 1}])
    delivered: list[int] = []
    real_fcntl = spool.fcntl

    class FlushFirst:
        """fcntl as seen by spool.py, running one whole flush just before the writer's lock."""

        done = False

        def __getattr__(self, name):
            return getattr(real_fcntl, name)

        def flock(self, fd, op):
            if not FlushFirst.done:
                FlushFirst.done = True
                for batch in spool.claim(sdir):
                    delivered.extend(_numbers([batch]))
                    spool.done(batch)
            return real_fcntl.flock(fd, op)

    monkeypatch.setattr(spool, "fcntl", FlushFirst())
    spool.append(sdir, [{"kind": "check", "n": 2}])
    monkeypatch.setattr(spool, "fcntl", real_fcntl)

    assert delivered == [1]
    later = spool.claim(sdir)
    assert _numbers(later) == [2]


@pytest.fixture
def frozen_clock(monkeypatch):
    """The spool's clock stopped at one instant (stepped back onto, or frozen at, the moment
    a batch was named)."""

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 3, 1, 12, 0, 0, 0)

    monkeypatch.setattr(spool, "datetime", Frozen)


def test_a_clock_stepped_back_onto_an_undelivered_batch_does_not_overwrite_it(tmp_path,
                                                                                frozen_clock):
    sdir = tmp_path / "spool"
    spool.append(sdir, [{"kind": "check", "n": 1}])
    first = spool.claim(sdir)  # the database is down: the batch waits
    spool.append(sdir, [{"kind": "check", "n": 2}])
    both = spool.claim(sdir)
    assert len(first) == 1 and len(both) == 2
    assert _numbers(both) == [1, 2]


def test_batches_claimed_at_one_instant_keep_their_order(tmp_path, frozen_clock):
    sdir = tmp_path / "spool"
    for n in range(3):
        spool.append(sdir, [{"kind": "check", "n": n}])
        batches = spool.claim(sdir)
    assert [_numbers([b]) for b in batches] == [[0], [1], [2]]
