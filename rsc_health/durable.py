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

Root writes files only through write_atomic, which never opens a name someone else could have
planted (a symlink to /etc/shadow, a FIFO) and refuses a directory breaking DIRECTORY_RULE;
make_dirs gives new directories their mode whatever the umask.

Standard library only: the prolog imports this.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from rsc_health.collect.sysfs import ours, read_state
from rsc_health.compat import join_parts, json_loads, path_mode, path_parts, pure_path

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from collections.abc import Container

# Paths are str (os.path, no pathlib: issue 25's job-start diet); every function takes a str
# or an os.PathLike and reads it as pathlib.Path would (compat.pure_path): one name, one meaning.
_split, _join, _norm = path_parts, join_parts, pure_path


def _parent(path: str) -> str:
    """str(Path(path).parent) of a _norm'd path ("." for a bare name, "/" for "/")."""
    root, parts = _split(path)
    return _join(root, parts[:-1])


def _name(path: str) -> str:
    """Path(path).name of a _norm'd path."""
    parts = _split(path)[1]
    return parts[-1] if parts else ""


def _is_dir(path: str) -> bool:
    """pathlib's Path.is_dir (compat.path_mode says which errors are "no")."""
    mode = path_mode(path)
    return mode is not None and stat.S_ISDIR(mode)


def _is_symlink(path: str) -> bool:
    """pathlib's Path.is_symlink."""
    mode = path_mode(path, follow=False)
    return mode is not None and stat.S_ISLNK(mode)


# A filesystem that cannot fsync a directory says so with one of these; the rename is done,
# and there is nothing more a writer can do for it.
_NO_DIR_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EROFS}


def load_state_json(path: str | os.PathLike[str]) -> dict:
    """A node state file's JSON object; {} when there is none; {"lost": why, "lost_mtime":
    its mtime} when something is there that is not one (never blocks: read_bounded)."""
    path = _norm(path)
    try:
        data = json_loads(read_state(path))
    except FileNotFoundError:
        if not _is_symlink(path):
            return {}
        why = "a dangling symlink"
    except OSError as exc:
        why = exc.strerror or str(exc)
    except (ValueError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the decoder goes ("[[[[..."), garbled.
        why = "empty" if _size(path) == 0 else f"not JSON: {str(exc)[:60]}"
    else:
        if isinstance(data, dict):
            return data
        why = "not a JSON object"
    try:
        mtime: float | None = os.lstat(path).st_mtime
    except OSError:
        mtime = None
    return {"lost": why, "lost_mtime": mtime}


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY,
                 mode: int = 0o600) -> int:
    """A descriptor on the regular file at `path`, never following a symlink there nor blocking
    on a FIFO (O_NOFOLLOW|O_NONBLOCK, then fstat): OSError for anything else, naming it."""
    path = _norm(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symlink, not a file: refused", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{_kind(st.st_mode)}, not a file: refused", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


# ---- paths root trusts -----------------------------------------------------------------
# What root runs (site checks, NHC) or takes its orders from (the site config: it names the
# commands root runs, where root writes, which checks run) must be something no one else
# could have written or swapped: the file root's (or ours) and writable by no one else, and
# every directory on the way to it likewise, or sticky.

def owner_refusal(st: os.stat_result, what: str, *, uids: Container[int] = frozenset(),
                  gids: Container[int] = frozenset()) -> str:
    """Why a file or directory of this stat is not trusted, or "": what the node path's user
    (root under slurmd) runs or reads its orders from must be its own (or root's) and
    writable by no one else: a site check program, its directory, the site config. `uids` /
    `gids`: the users and groups also trusted to write it (a logging daemon's, for the kernel
    log files a check takes as evidence)."""
    prefix = f"{what}: " if what else ""
    if not ours(st.st_uid) and st.st_uid not in uids:
        return f"{prefix}owned by uid {st.st_uid}, not root; refused"
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid not in gids):
        return f"{prefix}writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); refused"
    return ""


def trust_refusal(st: os.stat_result, path: str | os.PathLike[str], what: str = "", *,
                  uids: Container[int] = frozenset(), gids: Container[int] = frozenset()) -> str:
    """Why root must not run or take orders from the file `path` (`st`: its stat, taken from
    the descriptor that will be read where there is one), or "": owner_refusal, then
    path_refusal. The one rule for the site config, a catalog override, a qualification tool
    or baseline, a site check program; with `uids` / `gids` (owner_refusal), the evidence a
    check takes (a kernel log file, a saved DCGM verdict)."""
    return (owner_refusal(st, what, uids=uids, gids=gids)
            or path_refusal(path, what, uids=uids, gids=gids))


def path_refusal(path: str | os.PathLike[str], what: str = "", *,
                 uids: Container[int] = frozenset(), gids: Container[int] = frozenset()) -> str:
    """Why someone else could swap what `path` names for their own, or "": every directory
    holding a name on the way to it (each symlink's own directory, then its target's), up to
    /, must be root's (or ours) and writable by no one else, or sticky (/tmp: no one else can
    rename or remove root's entries in it)."""
    prefix = f"{what}: " if what else ""
    try:
        holders = sorted(path_holders(_norm(path)))
    except OSError as exc:
        return f"{prefix}{exc.strerror or exc}"
    for directory in holders:
        try:
            st = os.lstat(directory)
        except OSError as exc:
            return f"{prefix}{directory}: {exc.strerror or exc}"
        if not ours(st.st_uid) and st.st_uid not in uids:
            return f"{prefix}{directory} on its path is owned by uid {st.st_uid}; refused"
        # gids is asked only of a group-writable directory (kmsg's are looked up when asked).
        writable = st.st_mode & stat.S_IWOTH or (
            st.st_mode & stat.S_IWGRP and st.st_gid not in gids)
        if writable and not st.st_mode & stat.S_ISVTX:
            return (f"{prefix}{directory} on its path is writable by group or others (mode "
                    f"{stat.S_IMODE(st.st_mode):o}); refused")
    return ""


def path_holders(path: str, depth: int = 0) -> set[str]:
    """The directories the kernel looks a name up in to reach `path`, symlinks followed (as
    real paths): whoever can write one of them can change what `path` names."""
    if depth > 40:
        raise OSError(errno.ELOOP, "too many symlinks", path)
    here, holders = "/", {"/"}
    for name in _split(os.path.join(os.getcwd(), path))[1]:
        if name == "..":
            here = os.path.dirname(here)
            continue
        holders.add(here)
        step = os.path.join(here, name)
        if os.path.islink(step):
            holders |= path_holders(os.path.join(here, os.readlink(step)), depth + 1)
            step = os.path.realpath(step)
        here = step
    return holders


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the names in directory `path` (created, renamed, removed) durable."""
    fd = os.open(_norm(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _fsync_dir_fd(fd)
    finally:
        os.close(fd)


class UnsafeDirectory(PermissionError):
    """A directory root must not write into: see DIRECTORY_RULE."""


# The one rule for every directory the product writes a file into (state, spool, textfile,
# report, metrics export); write_atomic refuses any other, naming the rule.
DIRECTORY_RULE = ("root writes only into a directory that is its own and that no one else may "
                  "write unless it is sticky: chmod go-w or chmod +t it")


def unsafe_directory(st: os.stat_result) -> str:
    """Why a directory of this stat breaks DIRECTORY_RULE, or ""."""
    mode = stat.S_IMODE(st.st_mode)
    if not ours(st.st_uid):
        return f"owned by uid {st.st_uid}"
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        return f"writable by {'others' if mode & stat.S_IWOTH else 'its group'} (mode {mode:o})"
    return ""


def kept_by_root_alone(directory: str | os.PathLike[str]) -> bool:
    """Whether `directory` is one root may write into though it did not make it: it exists, no
    symlink leads to it, and neither it nor any directory above it can be changed by anyone
    else (unsafe_directory). `healthctl check --root DIR` may be pointed anywhere, and a
    record read from a directory someone else controls could say anything."""
    try:
        where = _norm(os.path.abspath(directory))
        if not _is_dir(where) or os.path.realpath(where) != where:
            return False
        root, parts = _split(where)
        return not any(unsafe_directory(os.lstat(_join(root, parts[:n])))
                       for n in range(len(parts), -1, -1))
    except OSError:
        return False


def _judge(st: os.stat_result, directory: str) -> None:
    why = unsafe_directory(st)
    if why:
        raise UnsafeDirectory(f"{directory} is {why}: refused ({DIRECTORY_RULE})")


def _judge_links(directory: str) -> None:
    """Every symlink on the way to `directory` (it and each directory above it that exists),
    as named: a symlink is only as good as the directory it stands in (its owner could have
    planted it: the owner of Debian's /var/lib/prometheus swapped node-exporter/ for a link to
    a root-only directory, and root wrote rsc_health.prom there; one level higher, root made
    textfile/ wherever the link led and wrote there, found by helper-96)."""
    _judge_links_at(_norm(os.path.abspath(directory)), 0)


def _judge_links_at(directory: str, depth: int) -> None:
    """_judge_links, and the same of each link's target in turn (root's own link to a path
    through another user's directory, where that user planted a link: found by helper-108)."""
    if depth > 40:
        raise UnsafeDirectory(f"{directory}: too many symlinks on the way: refused")
    root, parts = _split(directory)
    for n in range(1, len(parts) + 1):
        here = _join(root, parts[:n])
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return  # the rest is made by make_dirs, inside what was judged
        if stat.S_ISLNK(st.st_mode):
            if not ours(st.st_uid):  # planted in a sticky directory (/tmp)
                raise UnsafeDirectory(f"{here} is a symlink owned by uid {st.st_uid}: "
                                      f"refused ({DIRECTORY_RULE})")
            above = _parent(here)
            _judge(os.stat(above), above)
            target = os.path.normpath(os.path.join(above, os.readlink(here)))
            _judge_links_at(target, depth + 1)


def _judge_link(directory: str, opened: os.stat_result) -> None:
    """The directory as named, beside the one opened: the symlinks on its way judged again
    (_judge_links), and a name that no longer leads to what was opened was swapped
    meanwhile."""
    _judge_links(directory)
    st = os.stat(directory)
    if (st.st_dev, st.st_ino) != (opened.st_dev, opened.st_ino):
        raise UnsafeDirectory(f"{directory} changed while it was opened: refused")


def judge_directory(path: str | os.PathLike[str]) -> None:
    """UnsafeDirectory unless the directory at `path` (followed) meets DIRECTORY_RULE."""
    path = _norm(path)
    _judge(os.stat(path), path)


def ready_dir(path: str | os.PathLike[str]) -> None:
    """`path` made if missing (make_dirs) and judged by DIRECTORY_RULE now, before work that
    would be lost at the first write (UnsafeDirectory)."""
    path = _norm(path)
    _judge_links(path)
    make_dirs(path)
    _judge(os.stat(path), path)


def make_dirs(path: str | os.PathLike[str], mode: int = 0o755) -> None:
    """`path` made with exactly `mode` and its missing parents 0755, whatever the umask (under
    umask 000 mkdir's own mode would give 0777). Existing directories are left as they are."""
    root, parts = _split(path)
    if _is_dir(_join(root, parts)):
        return
    missing = []
    for n in range(len(parts), -1, -1):  # the path, its parent, ... up to / (or .)
        directory = _join(root, parts[:n])
        if _is_dir(directory):
            break
        missing.append(directory)
    for directory in reversed(missing):
        want = mode if directory is missing[0] else 0o755
        try:
            os.mkdir(directory, want)
        except FileExistsError:
            if _is_dir(directory):
                continue
            raise
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, want)
        finally:
            os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o644,
                 sync_dir: bool = True) -> None:
    """Replace `path` with `data`, the product's one way to write a file as root: after a
    crash or a power cut it holds the old bytes or the new ones, never a mix, never nothing.

    The bytes go to a new name no one can guess (O_CREAT|O_EXCL|O_NOFOLLOW, so nothing already
    there, planted or not, is ever opened), made `mode` whatever the umask, fsync'd and
    renamed over `path` (a symlink standing there is replaced, never followed). Every step is
    relative to the directory opened once and judged by DIRECTORY_RULE (UnsafeDirectory when
    it breaks it); a missing directory is made 0755. sync_dir=False leaves the directory's
    fsync to the caller (several files of one directory, one fsync). Raises OSError."""
    path = _norm(path)
    parent, name = _parent(path), _name(path)
    payload = data.encode() if isinstance(data, str) else data
    _judge_links(parent)  # before make_dirs: no directory made where a planted link leads
    make_dirs(parent)
    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _judge(os.fstat(dfd), parent)
        _judge_link(parent, os.fstat(dfd))
        fd, tmp = _create_unique(dfd, name, mode)
        try:
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except IsADirectoryError:
                _set_aside(path, dfd)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)  # a full disk keeps the old file, and no litter
            except OSError:
                pass
            raise
        if sync_dir:
            _fsync_dir_fd(dfd)
    finally:
        os.close(dfd)


def _create_unique(dfd: int, name: str, mode: int) -> tuple[int, str]:
    """A new file in directory `dfd` under a name no one can guess, and its name."""
    for _ in range(100):
        tmp = f".{name}.{os.urandom(8).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         mode, dir_fd=dfd)
        except FileExistsError:
            continue  # someone is guessing (64 random bits): take another
        try:
            os.fchmod(fd, mode)  # the umask narrowed (or, at 000, did not) what open made
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        return fd, tmp
    raise OSError(errno.EEXIST, "no free temporary name after 100 tries", name)


def _fsync_dir_fd(dfd: int) -> None:
    try:
        os.fsync(dfd)
    except OSError as exc:
        if exc.errno not in _NO_DIR_SYNC:
            raise


def remove(path: str | os.PathLike[str]) -> bool:
    """Remove a state file for good (a power cut must not bring it back). True when it was
    there; a directory at its name is set aside."""
    path = _norm(path)
    if not _clear_name(path):
        return False
    fsync_dir(_parent(path))
    return True


def _clear_name(path: str | os.PathLike[str]) -> bool:
    """Nothing at `path` any more: a file, FIFO or symlink is unlinked, a directory set aside.
    False when nothing was there."""
    path = _norm(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        _set_aside(path)
    except PermissionError:
        # unlink(2) of a directory answers EISDIR on Linux, EPERM on others.
        if not _is_dir(path) or _is_symlink(path):
            raise
        _set_aside(path)
    return True


def _set_aside(path: str, dir_fd: int | None = None) -> None:
    """A directory where a state file belongs (`path`, _norm'd): renamed out of the way, kept
    for a person to look at, so the state can be written again."""
    name = _name(path)
    aside = f"{name}.not-a-file-{time.time_ns()}"
    if dir_fd is None:
        os.rename(path, os.path.join(_parent(path), aside))
    else:
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
