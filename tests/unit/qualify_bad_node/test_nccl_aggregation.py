"""D1: nccl_tests.parse keeps the MOST FAVOURABLE bus bandwidth of the largest size: the max of
the out-of-place and in-place halves, and the max over repeated rows (nccl-tests -N run_cycles
prints the whole size sweep once per cycle). A node whose out-of-place busbw is 35% under its
peers, or whose second cycle collapses to half, passes qualification (exit 0)."""
from __future__ import annotations

from pathlib import Path

from rsc_health.qualify import parse  # noqa: E402
from rsc_health.sim import qualify_tools as standin  # noqa: E402
from tests.unit.qualify_bad_node.qhelp import NCCL, db, qrun, tier, tools  # noqa: E402

CONFIG = tier(NCCL)
BIG = "8589934592"


def _last_row(text: str) -> str:
    return [ln for ln in text.splitlines() if ln.strip().startswith(BIG)][0]


def out_of_place_slow(busbw: float = 231.0, slow: float = 150.0) -> str:
    text = standin.nccl(busbw)
    row = _last_row(text)
    tok = f"{busbw:>6.2f}"
    i = row.index(tok)                      # the out-of-place busbw cell (first of the two)
    return text.replace(row, row[:i] + f"{slow:>6.2f}" + row[i + len(tok):])


def second_cycle_collapsed(busbw: float = 231.0, slow: float = 115.0) -> str:
    """`-N 2`: nccl-tests prints every size once per cycle, then one summary."""
    good = standin.nccl(busbw).splitlines()
    bad = standin.nccl(slow).splitlines()
    rows_good = [ln for ln in good if ln.strip() and ln.strip()[0].isdigit()]
    rows_bad = [ln for ln in bad if ln.strip() and ln.strip()[0].isdigit()]
    head = [ln for ln in good if ln.startswith("#") and "Out of bounds" not in ln
            and "Avg bus" not in ln and "concluded" not in ln]
    tail = [ln for ln in good if "Out of bounds" in ln or "Avg bus" in ln or "concluded" in ln]
    return "\n".join(head + rows_good + rows_bad + tail) + "\n"


def test_parse_keeps_the_best_half_and_the_best_cycle():
    o = parse("nccl_tests", out_of_place_slow(), "all_reduce_perf")
    assert o.metrics[0].value == 150.0, o.metrics     # observed: 231.0 (the in-place half)
    o = parse("nccl_tests", second_cycle_collapsed(), "all_reduce_perf")
    assert o.metrics[0].value == 115.0, o.metrics     # observed: 231.0 (the first cycle)


def test_a_node_slow_out_of_place_or_in_its_second_cycle_passes_qualification(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    url = db(tmp_path)
    spread = [231.0, 230.2, 231.6, 229.9, 230.8, 231.3]
    codes = [qrun(cfg, url, f"gpu{i:03d}",
                  tools(tmp_path, f"gpu{i:03d}", {"all_reduce_perf": standin.nccl(b)}))[0]
             for i, b in enumerate(spread)]
    assert codes == [4, 4, 4, 4, 0, 0], codes
    # Control: a node uniformly 35% slow fails (exit 3).
    code, doc = qrun(cfg, url, "gpu100",
                     tools(tmp_path, "gpu100", {"all_reduce_perf": standin.nccl(150.0)}))
    assert code == 3, doc
    bad = {"gpu101": out_of_place_slow(), "gpu102": second_cycle_collapsed()}
    got = {}
    for node, text in bad.items():
        code, doc = qrun(cfg, url, node, tools(tmp_path, node, {"all_reduce_perf": text}))
        got[node] = (code, doc.get("verdict"), [(r["value"], r["status"]) for r in
                                                doc.get("results", [])])
    # Expected: both fail (exit 3). Observed: both pass (exit 0) at 231 GB/s.
    assert all(c == 3 for c, _v, _r in got.values()), got


def test_output_holding_an_ok_run_and_a_failed_one_fails():
    """Two runs in one output (a wrapper that retried and hid the exit status, a log appended
    to): only the first summary was read, and an OK one before a FAILED one passed."""
    from rsc_health.qualify.nccl_tests import parse as nccl

    good = (Path(__file__).resolve().parents[2] / "fixtures" / "qualify" / "tool-outputs"
            / "nccl_allreduce.log").read_text()
    assert nccl(good, "all_reduce_perf").failed is None
    failed = good.replace("Out of bounds values : 0 OK", "Out of bounds values : 12 FAILED")
    out = nccl(good + failed, "all_reduce_perf")
    assert out.failed == "out of bounds values: 12 FAILED"
