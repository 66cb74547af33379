"""Expected mounts: present, of the expected type, writable when they should be, and alive.

All are drain-now (jobs would fail or hang on them) and transient (repair=False): a remount
fixes them, and a clean sweep resumes the node.
"""

from __future__ import annotations

from rsc_health.checks._finding import fail, ok
from rsc_health.collect import hangs
from rsc_health.model import Finding, Severity


def check(state, cfg: dict) -> list[Finding]:
    expected = cfg.get("mounts", {}).get("expected", [])
    if state.mounts is None:
        return []
    # The last mount on a path is the visible one (mounts stack).
    by_path = {m.path: m for m in state.mounts}
    out: list[Finding] = []
    for want in expected:
        path = want.get("path")
        if not path:
            continue
        m = by_path.get(path)
        fstype = want.get("fstype")
        if m is None or (fstype and m.fstype != fstype):
            got = f"{m.fstype} mounted" if m else "not mounted"
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_missing",
                     f"{path} {got}, expected {fstype or 'a mount'}", repair=False)
            )
            continue
        probe = state.mount_probes.get(path)
        if probe is not None and probe.hung:
            # Since when and for how many sweeps (collect.hangs): the heartbeat and textfile
            # name the probe; the reason, which Slurm shows, stays short.
            name = hangs.statvfs(path)
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_hung",
                     f"{path} ({m.fstype}) did not answer statvfs in {probe.seconds:.1f}s",
                     repair=False, probe=name, **getattr(state, "hangs", {}).get(name, {}))
            )
        elif probe is not None and not probe.ok:
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_error",
                     f"{path} ({m.fstype}) statvfs failed: {probe.error}", repair=False)
            )
        elif want.get("rw", True) and m.read_only:
            out.append(
                fail("mount", path, Severity.DRAIN_NOW, "mount_ro",
                     f"{path} ({m.fstype}) is read-only", repair=False)
            )
        else:
            out.append(ok("mount", path, f"{path} {m.fstype} ok"))
    return out
