"""Node-local state files that survive a power cut: whole, or as they were before.

Writing a temporary file and renaming it over the old one keeps a killed writer from leaving
half a file, but not a power cut: until the bytes are fsync'd a disk may commit the rename
and not the data (XFS, ext4 without auto_da_alloc), and the file comes back empty; until the
directory is fsync'd it may forget the rename, or a new file's name, altogether. An empty XID
cursor re-reads a kernel log from its start (old XIDs judged again: a repaired node drained);
a forgotten pending verdict lets jobs start on a node with a known fault.

Whatever stands at a state file's name (a FIFO, a symlink to a device, a directory a person
made) is replaced, never opened for writing: opening a FIFO to write blocks until someone reads.
Reading one (load_state_json) tells "there is none" (the first run) from "there is one and it
cannot be read" (lost state): the two call for different things.

Standard library only: the prolog imports this.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

from rsc_health.collect.sysfs import read_bounded

# A filesystem that cannot fsync a directory says so with one of these; the rename is done,
# and there is nothing more a writer can do for it.
_NO_DIR_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EROFS}


def load_state_json(path: Path) -> dict:
    """A node state file's JSON object; {} when there is none; {"lost": why, "lost_mtime":
    its mtime} when something is there that is not one (never blocks: read_bounded)."""
    try:
        data = json.loads(read_bounded(path))
    except FileNotFoundError:
        if not path.is_symlink():
            return {}
        why = "a dangling symlink"
    except OSError as exc:
        why = exc.strerror or str(exc)
    except ValueError as exc:
        why = "empty" if _size(path) == 0 else f"not JSON: {str(exc)[:60]}"
    else:
        if isinstance(data, dict):
            return data
        why = "not a JSON object"
    try:
        mtime: float | None = path.lstat().st_mtime
    except OSError:
        mtime = None
    return {"lost": why, "lost_mtime": mtime}


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def fsync_dir(path: Path) -> None:
    """Make the names in directory `path` (created, renamed, removed) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_DIR_SYNC:
            raise
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | str, *, sync_dir: bool = True) -> None:
    """Replace `path` with `data`: after a crash or a power cut it holds the old bytes or the
    new ones, never a mix, never nothing. sync_dir=False leaves the directory's fsync to the
    caller (several files of one directory, one fsync). Raises OSError."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    _clear_name(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            _set_aside(path)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk keeps the old file, and no litter
        raise
    if sync_dir:
        fsync_dir(path.parent)


def remove(path: Path) -> bool:
    """Remove a state file for good (a power cut must not bring it back). True when it was
    there; a directory at its name is set aside."""
    path = Path(path)
    if not _clear_name(path):
        return False
    fsync_dir(path.parent)
    return True


def _clear_name(path: Path) -> bool:
    """Nothing at `path` any more: a file, FIFO or symlink is unlinked, a directory set aside.
    False when nothing was there."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        _set_aside(path)
    except PermissionError:
        # unlink(2) of a directory answers EISDIR on Linux, EPERM on others.
        if not path.is_dir() or path.is_symlink():
            raise
        _set_aside(path)
    return True


def _set_aside(path: Path) -> None:
    """A directory where a state file belongs: renamed out of the way, kept for a person to
    look at, so the state can be written again."""
    aside = path.with_name(f"{path.name}.not-a-file-{time.time_ns()}")
    os.rename(path, aside)
