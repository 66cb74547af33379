"""The test daemons' ports (tests/ports.py): a cluster takes eight before any daemon binds one,
and four xdist workers start clusters at once. Once, slurmdbd and node04's slurmd were given
the same port and no node came up ("timed out after 180s waiting for all nodes IDLE")."""

from __future__ import annotations

from tests import ports


def test_a_process_is_never_given_the_same_port_twice():
    got = [ports.free_port() for _ in range(300)]
    assert len(set(got)) == len(got)


def test_each_worker_draws_from_a_band_of_its_own(monkeypatch):
    bands = {}
    for n in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        got = {ports.free_port() for _ in range(20)}
        start, end = ports._band(ports.ephemeral_low())
        assert all(start <= p < end for p in got)
        bands[n] = (start, end)
    spans = sorted(bands.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # disjoint
