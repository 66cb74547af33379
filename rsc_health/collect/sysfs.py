"""Tolerant readers for sysfs attribute files: a missing or garbled file is None, never raised."""

from __future__ import annotations

import errno
import os
import stat

from rsc_health import lazyre
from rsc_health.compat import pure_path

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

_INT = lazyre.compile(r"^\s*(-?\d+)")
# A sysfs attribute is at most a page; procfs tables and state files are larger but bounded.
ATTR_BYTES = 1 << 16
FILE_BYTES = 16 << 20


def pure(path: StrPath) -> str:
    """`str(pathlib.PurePosixPath(path))` without pathlib (compat.pure_path, the node path's
    one reading of a path): repeated and trailing slashes and "." parts dropped, ".." kept (a
    name is what it names, never resolved), "" is ".". Where a path is a key (a file read once
    and looked up by the path a family builds), both sides go through this, as a Path's
    equality did."""
    return pure_path(path)


def ours(uid: int) -> bool:
    """Whether a file or directory of this owner is the node path's own: root's, or the
    running user's (an operator's read-only `healthctl check`, a test). The one reading of
    "owned by us" for what the node path reads its orders and state from."""
    return uid == 0 or uid == os.geteuid()


def read_bounded(path: StrPath, limit: int = FILE_BYTES) -> bytes:
    """A regular file's bytes, at most `limit`. Anything else where a file should be raises
    OSError at once: a FIFO would block read() for ever, a device such as /dev/zero never
    ends (the node path ate memory until MemoryError), and a directory has no bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return _read_fd(fd, path, limit)
    finally:
        os.close(fd)


def _read_fd(fd: int, path: StrPath, limit: int, st: os.stat_result | None = None) -> bytes:
    if not stat.S_ISREG((st or os.fstat(fd)).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    chunks, size = [], 0
    while chunk := os.read(fd, min(1 << 16, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return b"".join(chunks)


def read_state(path: StrPath, limit: int = FILE_BYTES) -> bytes:
    """read_bounded for a file the node path wrote itself (a pending verdict, a cursor, the
    counters): one owned by another user is refused (OSError EPERM), whatever the directory
    let them do. In a state dir someone else owns, or one others could write, a planted
    pending verdict failed every job and drained a healthy node. Root's and this process's
    own files are read (an operator's read-only `healthctl check` reads root's)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not ours(st.st_uid):
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid}, not root's nor this "
                          "process's", str(path))
        return _read_fd(fd, path, limit, st)
    finally:
        os.close(fd)


def read_text(path: StrPath) -> str | None:
    try:
        return read_bounded(path, ATTR_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return None


def parse_int(text: str | None) -> int | None:
    """Leading integer ("4: ACTIVE" -> 4, "16" -> 16, "0x030200" is not for this)."""
    if text is None:
        return None
    m = _INT.match(text)
    return int(m.group(1)) if m else None


def parse_count(text: str | None) -> int | None:
    """A counter file's value: ASCII decimal digits and nothing else. parse_int's leniency
    ("1e30" -> 1, "7junk" -> 7, Arabic-Indic digits) would turn a garbled read into a count."""
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


def parse_counters(text: str | None) -> dict[str, int]:
    """AER-style "NAME VALUE" lines ("RxErr 0", "TOTAL_ERR_COR 2"); bad lines are skipped."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[1].isascii():
            out[parts[0]] = int(parts[1])
    return out
