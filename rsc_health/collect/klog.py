"""The kernel log read where a hang can be abandoned: plain-file sources from a child.

/dev/kmsg is a character device read non-blocking: it cannot hang. A plain-file source
(`[xid] sources`, rsyslog's kernel-only file) lives on a disk, and a disk that stops answering
(a failing local disk, an NFS or FUSE /var/log) blocks its stat and read in the kernel, where
no deadline reaches. Read in the run's own process, that read held the run until its watchdog,
and then held its exit too: a thread in a FUSE or NFS read the daemon holds does not die, so
the prolog never returned to slurmd and every family after it went unjudged. So when any
source is not /dev/kmsg, the whole read (kmsg.read_new_events: the ring, the files, the
ring's word on the files' lines) runs in an abandonable child (collect.bounded), like NVML,
statvfs and the InfiniBand ports. Past its timeout the child is abandoned, recorded
(collect.hangs: `kernel_log xid`, since, sweeps, its pid) and not asked again while it waits;
the ring buffer alone is then read in-process, and the files' cursor entries are kept where
they were, so nothing the files hold is consumed unread. /dev/kmsg alone (the default) forks
nothing.

Standard library only: the prolog uses this on every job start.
"""

from __future__ import annotations

import time

from rsc_health.collect import hangs, kmsg

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from _typeshed import StrPath  # str | os.PathLike[str]

KERNEL_LOG = "kernel_log"  # the probe's kind (collect.hangs); a name per family reading it
RING = "/dev/kmsg"
# The child's share of the time the collectors have left: a first read of a large file
# (kmsg.MAX_READ) takes seconds; what is left is for the families after it.
SHARE_OF_DEADLINE = 0.5
TIMEOUT_S = 10.0  # with no stage deadline (`healthctl check`)


def probe(family: str) -> str:
    return f"{KERNEL_LOG} {family}"


def read(root: StrPath, env, family: str, *, parse: Callable = kmsg.parse_line,
         event: type = kmsg.XidEvent) -> kmsg.XidRead:
    """kmsg.read_new_events of [xid] sources past `family`'s cursor, bounded: see the module.
    A hang and what was read instead are said in the read's errors (checker findings)."""
    cfg = env.cfg
    sources = list(cfg.get("xid.sources"))
    cursor = env.cursors.get(family) or {}
    kw: dict[str, Any] = {"file_backlog": bool(cfg.get("xid.file_backlog")), "parse": parse,
                          "writers": kmsg.log_writers(cfg.get("xid.log_writers"))}
    files = [s for s in sources if s != RING]
    if not files:
        return kmsg.read_new_events(root, sources, cursor, **kw)
    name = probe(family)
    state = env.state
    state.probes_asked.append(name)
    waiting = env.hangs_before.get(name) or {}
    if hangs.still_waiting(waiting):
        state.hung_probes[name] = (f"the kernel log read abandoned before (pid "
                                   f"{waiting['pid']}) is still waiting in the kernel")
        return _ring_alone(root, sources, files, cursor, kw,
                           f"{', '.join(files)}: {state.hung_probes[name]}; not read again "
                           "until it returns (the ring buffer alone was read)")
    from rsc_health.collect import bounded

    timeout = TIMEOUT_S
    if env.deadline is not None:
        timeout = max(0.05, (env.deadline - time.monotonic()) * SHARE_OF_DEADLINE)
    try:
        doc = bounded.call(lambda: _as_doc(kmsg.read_new_events(root, sources, cursor, **kw)),
                           timeout, mark=hangs.marker(name, root))
    except bounded.Died as exc:  # a crash, not a hang: nothing is left waiting
        return _ring_alone(root, sources, files, cursor, kw,
                           f"{', '.join(files)}: the kernel log reader {exc}; the ring "
                           "buffer alone was read")
    except bounded.Abandoned as exc:
        state.hung_probes[name] = f"the kernel log read did not answer within {timeout:.1f}s"
        state.probe_pids[name] = exc.pid
        return _ring_alone(root, sources, files, cursor, kw,
                           f"{', '.join(files)}: {state.hung_probes[name]} (a disk or mount "
                           "that stopped answering?); the ring buffer alone was read, the "
                           "files' lines wait unconsumed")
    return kmsg.XidRead([event(**e) for e in doc["events"]], list(doc["errors"]),
                        doc["cursor"])


def _as_doc(read: kmsg.XidRead) -> dict:
    return {"events": [e.to_dict() for e in read.events], "errors": read.errors,
            "cursor": read.cursor}


def _ring_alone(root: StrPath, sources: list[str], files: list[str], cursor: dict, kw: dict,
                said: str) -> kmsg.XidRead:
    """The ring buffer's read (when it is a source), the files' cursor entries kept as they
    were (nothing of them consumed), and `said` among the errors."""
    ring = [s for s in sources if s == RING]
    got = kmsg.read_new_events(root, ring, cursor, **kw) if ring else kmsg.XidRead(
        [], [], {**cursor, "files": {}})
    files_before = cursor.get("files")
    kept: dict = files_before if isinstance(files_before, dict) else {}
    entries = dict(got.cursor.get("files") or {})
    entries.update({s: e for s, e in kept.items() if s in files})
    # A cursor that could not be trusted ("lost": unreadable, cut by a power loss) stays so
    # for the files not read: their next read judges only what was logged since it was last
    # written, not a whole kern.log of old XIDs (file_backlog).
    lost = {k: cursor[k] for k in ("lost", "lost_mtime") if k in cursor}
    return kmsg.XidRead(got.events, [*got.errors, said],
                        {**got.cursor, "files": entries, **lost})
