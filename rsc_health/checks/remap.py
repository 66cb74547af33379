"""Row remapping (Ampere and later) and page retirement (older GPUs).

A failed remap means the bank has no spare rows left: hardware repair, drain now. A pending
remap takes effect at the next GPU reset, so the node drains after the job and a reset (not a
technician) clears it: repair=False.
"""

from __future__ import annotations

from rsc_health.checks._finding import checker_error, fail, ok, readable_gpus
from rsc_health.collect.counters import plausible
from rsc_health.collect.gpu import flag, val
from rsc_health.model import Finding, Severity


def check(state, cfg: dict) -> list[Finding]:
    gcfg = cfg.get("gpu", {})
    out: list[Finding] = []
    for g, comp in readable_gpus(state):
        before = len(out)
        rows = val(g.answers.get("remapped_rows"))
        if isinstance(rows, dict):
            # Flags are bools or 0/1 (pynvml's ints): an NVML error answer or any other value
            # (1.0, "true") is one the checker could not read, never a truthy "failed".
            failure, pending = (flag(rows.get(k)) for k in ("failure", "pending"))
            unreadable = [f"{k} {why}" for k, (_, why) in (("failure", failure),
                                                             ("pending", pending)) if why]
            if unreadable:
                out.append(checker_error("remap", comp, f"{comp} row remap unreadable: "
                                         f"{', '.join(unreadable)}"))
            if failure[0]:
                out.append(
                    fail("remap", comp, Severity.DRAIN_NOW, "remap_failed",
                         f"{comp} row remapping failed", repair=True, **rows)
                )
            elif pending[0]:
                out.append(
                    fail("remap", comp, Severity.DRAIN_AFTER_JOB, "remap_pending",
                         f"{comp} row remap pending, needs a GPU reset", repair=False, **rows)
                )
        pages = val(g.answers.get("retired_pages"))
        if isinstance(pages, dict):
            sbe, dbe = val(pages.get("sbe")), val(pages.get("dbe"))
            # A count no GPU holds (negative, 2**70, 1.5, true) was not read right: it must
            # neither drain as "exhausted" nor count as zero in silence.
            odd = [f"{k} {v!r:.40}" for k, v in (("sbe", sbe), ("dbe", dbe))
                   if v is not None and not plausible(v)]
            pending, why = flag(pages.get("pending"))
            if why:
                odd.append(f"pending {why}")
            if odd:
                out.append(checker_error("remap", comp, f"{comp} retired pages unreadable: "
                                         f"{', '.join(odd)}"))
            total = sum(v for v in (sbe, dbe) if plausible(v))
            limit = int(gcfg.get("retired_pages_max", 60))
            if total >= limit:
                out.append(
                    fail("remap", comp, Severity.DRAIN_NOW, "retired_pages_exhausted",
                         f"{comp} {total} retired pages (limit {limit})", repair=True)
                )
            elif pending:
                out.append(
                    fail("remap", comp, Severity.DRAIN_AFTER_JOB, "retire_pending",
                         f"{comp} page retirement pending, needs a GPU reset", repair=False)
                )
        if len(out) == before and (isinstance(rows, dict) or isinstance(pages, dict)):
            out.append(ok("remap", comp, f"{comp} remapping ok"))
    return out
