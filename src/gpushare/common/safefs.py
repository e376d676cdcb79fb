# SPDX-License-Identifier: GPL-2.0-or-later
"""Root-side file operations that never follow a path a user could have placed.

Every directory is reached from ``/`` one component at a time with
``O_DIRECTORY|O_NOFOLLOW`` and checked with ``fstat`` (owner, mode); every entry below
it is created, read, replaced or removed relative to that directory's descriptor.
A symlink, a pre-created entry or an unsafe owner/mode is refused with an
``UnsafePathError`` that names the path and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import time
from typing import Optional

__all__ = ["UnsafePathError", "check_root_owned_file", "discard_tree_at",
           "ensure_trash_at", "file_stamp", "make_owned_dir", "open_dir_at",
           "open_root_dir", "purge_trash_at", "read_small_file_at", "remove_file_at",
           "remove_tree_at", "trash_entries_at", "write_file_atomic",
           "write_file_atomic_at"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(OSError):
    """A path is not safe for root to use; the message names it and says what to fix."""


def _describe(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}"


def _check_root_dir(st: os.stat_result, path: str, leaf: bool = False) -> None:
    """A directory root may trust: root-owned, writable by others only if sticky (like /tmp)
    and only on the way to a ``leaf``, the directory root keeps its own entries in: in a
    sticky one any user could still take a name before root does."""
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} is not a directory; remove it")
    if st.st_uid != 0:
        raise UnsafePathError(
            f"{path} is not owned by root ({_describe(st)}); remove it or chown root:root"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError(
                f"{path} is writable by group or others ({_describe(st)}); chmod go-w it"
            )
        if leaf:
            raise UnsafePathError(
                f"{path} is writable by group or others ({_describe(st)}), sticky or not: "
                "root keeps its files there; chmod go-w it, or use a directory below it"
            )


def _open_component(parent_fd: int, name: str, path: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(
                f"{path} is a symbolic link or not a directory; remove it"
            ) from None
        raise


def open_root_dir(path: str, create: bool = True, mode: int = 0o755) -> int:
    """Open an absolute directory whose every component is a root-owned, safe directory.

    A directory above it may be writable by others when sticky (like /tmp); the directory
    itself may not, sticky or not (as the C glue checks ``state_dir=``, spank/gs_safefs.c).
    Missing components are created root-owned with ``mode`` when ``create`` is true.
    Returns a descriptor the caller closes.
    """
    if not os.path.isabs(path):
        raise UnsafePathError(f"{path} is not an absolute path")
    fd = os.open("/", _DIR_FLAGS)
    current = "/"
    names = [part for part in os.path.normpath(path).split("/") if part]
    try:
        _check_root_dir(os.fstat(fd), current)
        for i, name in enumerate(names):
            current = os.path.join(current, name)
            try:
                child = _open_component(fd, name, current)
            except FileNotFoundError:
                if not create:
                    raise
                created = True
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    created = False
                child = _open_component(fd, name, current)
                if created and os.fstat(child).st_uid == 0:
                    os.fchmod(child, mode)
            os.close(fd)
            fd = child
            _check_root_dir(os.fstat(fd), current, leaf=i == len(names) - 1)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_dir_at(parent_fd: int, name: str, path: str, root_owned: bool = False) -> int:
    """Open the directory ``name`` below ``parent_fd`` without following a symlink.

    With ``root_owned`` the directory must also be root-owned and not writable by others.
    """
    fd = _open_component(parent_fd, name, path)
    if root_owned:
        try:
            _check_root_dir(os.fstat(fd), path)
        except BaseException:
            os.close(fd)
            raise
    return fd


def make_owned_dir(parent_fd: int, name: str, path: str, uid: int, gid: int,
                   mode: int = 0o700) -> None:
    """Create ``name`` fresh below ``parent_fd`` for ``uid``; refuse anything already there."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        st = os.lstat(name, dir_fd=parent_fd)
        raise UnsafePathError(
            f"{path} exists already ({_describe(st)}"
            f"{', a symbolic link' if stat.S_ISLNK(st.st_mode) else ''}); "
            "it was not created by gpushare: remove it"
        ) from None
    fd = _open_component(parent_fd, name, path)
    try:
        st = os.fstat(fd)
        if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafePathError(f"{path} changed while being created ({_describe(st)})")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def check_root_owned_file(path: str) -> str:
    """Check that a file root will run or trust is root-owned and not writable by others.

    The file (after resolving symlinks) must be root-owned and not writable by group or
    others; so must every directory above it, except that a sticky one (like /tmp) may be
    writable, since nobody else can replace root's entries there. Returns the resolved path.
    """
    if not os.path.isabs(path):
        raise UnsafePathError(f"{path} is not an absolute path; give the full path")
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise UnsafePathError(f"{path} does not exist; install it or fix the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{path} is not a regular file")
    # Through a symlink, the file checked is its target: name it, as that is what to fix.
    shown = path if real == path else f"{real} (where {path} leads)"
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(
            f"{shown} must be owned by root and not writable by group or others "
            f"({_describe(st)}); chown root:root and chmod go-w it"
        )
    directory = os.path.dirname(real)
    while True:
        try:
            _check_root_dir(os.stat(directory), directory)
        except UnsafePathError as err:
            raise UnsafePathError(f"{path}: {err}, or move the file elsewhere") from None
        if directory == "/":
            return real
        directory = os.path.dirname(directory)


def file_stamp(path: str) -> list[int]:
    """What changes when a file is edited, replaced or touched: a file derived from it (a
    compiled plan, a reused NVML answer) stands only while this is the same."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def read_small_file_at(dir_fd: int, name: str, limit: int = 1 << 20) -> Optional[bytes]:
    """Read a regular file below ``dir_fd`` without following symlinks; None if absent."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePathError(f"{name} is a symbolic link; remove it") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(f"{name} is not a regular file; remove it")
        chunks = []
        remaining = limit
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_file_atomic_at(dir_fd: int, name: str, data: bytes, mode: int = 0o644,
                         exact_mode: bool = False) -> None:
    """Replace ``name`` below ``dir_fd`` atomically (temporary file, fsync, rename), so no
    reader ever sees half a file. The file gets ``mode`` less the umask, or with
    ``exact_mode`` ``mode`` itself; on failure the temporary file is removed."""
    tmp = f".{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        try:
            if exact_mode:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_file_atomic(path: str, data: bytes, mode: int = 0o644,
                      exact_mode: bool = False) -> None:
    """``write_file_atomic_at`` by path, in a directory the caller has checked or need not
    (it is reached as the path says)."""
    directory, name = os.path.split(path)
    dir_fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        write_file_atomic_at(dir_fd, name, data, mode, exact_mode)
    finally:
        os.close(dir_fd)


def remove_file_at(dir_fd: int, name: str) -> bool:
    """Unlink ``name`` below ``dir_fd`` (a symlink itself, never its target); False if absent."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


TRASH = ".trash"  # below the directory a discarded tree was in: root's, mode 0700
PURGE_BUDGET = 20000  # entries one purge removes or looks at before it leaves the rest
_OPEN_DIRS_MAX = 16  # directories a purge holds open; deeper ones move up to the trash
_DISCARDS = itertools.count()


def remove_tree_at(parent_fd: int, name: str, budget: int = PURGE_BUDGET,
                   keep_trash: bool = False) -> bool:
    """Remove ``name`` below ``parent_fd`` and all it holds, walking by descriptor.

    A symlink is unlinked, never followed; a directory swapped for a symlink mid-walk is
    unlinked as the link it has become. Any depth and any kind of entry (FIFO, socket,
    device) is removed without recursion; after ``budget`` entries, or when a writer
    still adds entries, what is left stays in the trash beside it (``discard_tree_at``),
    for the next ``purge_trash_at`` to finish. Never raises for what the tree holds.
    False if ``name`` was absent.
    """
    return discard_tree_at(parent_fd, name, budget, keep_trash)


def discard_tree_at(parent_fd: int, name: str, budget: int = PURGE_BUDGET,
                    keep_trash: bool = False) -> bool:
    """Take ``name`` below ``parent_fd`` out of every user's reach at once, then purge it.

    A directory is renamed into ``<parent>/.trash/`` (root's, 0700, the same filesystem),
    so it is gone from its place in one step whatever it holds or whoever still writes
    into it; ``purge_trash_at`` then removes it by descriptor, at most ``budget`` entries
    per call. Anything else is unlinked. False if ``name`` was absent.
    With ``keep_trash`` the emptied trash stays, where users can fill the file system.
    """
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(name, dir_fd=parent_fd)
            return True
    for _ in range(3):  # another purge may remove the empty trash between open and rename
        trash_fd = _open_trash(parent_fd)
        try:
            try:
                os.rename(name, _trash_name(name), src_dir_fd=parent_fd, dst_dir_fd=trash_fd)
            except FileNotFoundError:
                if not _lexists_at(parent_fd, name):
                    return False
                continue
            except NotADirectoryError:  # swapped for a file or link since the lstat
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=parent_fd)
                return True
            _purge_then_tidy(parent_fd, trash_fd, budget, keep_trash)
            return True
        finally:
            os.close(trash_fd)
    raise FileNotFoundError(errno.ENOENT, f"cannot move {name} into {TRASH}")


def purge_trash_at(parent_fd: int, budget: int = PURGE_BUDGET,
                   keep_trash: bool = False) -> bool:
    """Go on removing what ``discard_tree_at`` moved into ``<parent>/.trash/``, at most
    ``budget`` entries; True when the trash is empty (or absent)."""
    try:
        trash_fd = open_dir_at(parent_fd, TRASH, TRASH, root_owned=True)
    except FileNotFoundError:
        return True
    try:
        return _purge_then_tidy(parent_fd, trash_fd, budget, keep_trash)
    finally:
        os.close(trash_fd)


def ensure_trash_at(parent_fd: int) -> None:
    """Make ``<parent>/.trash`` while there is room: a later discard needs no inode."""
    os.close(_open_trash(parent_fd))


def _purge_then_tidy(parent_fd: int, trash_fd: int, budget: int, keep: bool) -> bool:
    """``_purge``, then the trash itself once empty (unless ``keep``): a clean node has none."""
    if not _purge(trash_fd, budget):
        return False
    if keep:
        return True
    with contextlib.suppress(OSError):  # not empty: another discard came in meanwhile
        os.rmdir(TRASH, dir_fd=parent_fd)
    return True


def _lexists_at(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def trash_entries_at(parent_fd: int) -> list[str]:
    """What waits in ``<parent>/.trash/`` to be purged (``gpushare check`` reports it)."""
    try:
        trash_fd = open_dir_at(parent_fd, TRASH, TRASH, root_owned=True)
    except FileNotFoundError:
        return []
    try:
        return sorted(os.listdir(trash_fd))
    finally:
        os.close(trash_fd)


def _open_trash(parent_fd: int) -> int:
    """``<parent>/.trash``, made when absent. Another discard that emptied the trash may
    remove it between the mkdir and the open (``_purge_then_tidy``): made again then."""
    for _ in range(3):
        with contextlib.suppress(FileExistsError):
            os.mkdir(TRASH, 0o700, dir_fd=parent_fd)
        try:
            fd = open_dir_at(parent_fd, TRASH, TRASH, root_owned=True)
        except FileNotFoundError:
            continue
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, 0o700)
        return fd
    raise FileNotFoundError(errno.ENOENT, f"{TRASH} removed as often as it was made")


def _trash_name(name: str) -> str:
    """A name no other discard takes: the tree's name, this process and a clock."""
    return f"{name[:64]}.{os.getpid()}.{time.monotonic_ns()}.{next(_DISCARDS)}"


def _purge(trash_fd: int, budget: int) -> bool:
    """Remove the trash's entries, each by ``_purge_entry``, within ``budget``; True when
    nothing is left. Passes repeat while they make progress (a deep tree's lower parts
    come back to the trash's top); an entry that fails stays for the next purge."""
    names = os.listdir(trash_fd)
    while names and budget > 0:
        for name in names:
            if budget <= 0:
                break
            try:
                budget = _purge_entry(trash_fd, name, budget)
            except OSError:
                budget -= 1  # left in the trash: a later purge tries again
        left = os.listdir(trash_fd)
        if set(left) == set(names):
            return False  # no progress: a writer keeps up, or entries refuse removal
        names = left
    return not names


def _purge_entry(trash_fd: int, name: str, budget: int) -> int:
    """Remove ``name`` below ``trash_fd`` depth first with an explicit stack of open
    directories, never following a link; returns the budget left.

    Every entry is unlinked first and opened as a directory only when the unlink says it
    is one, so nothing is trusted from a listing a writer may change. A directory deeper
    than ``_OPEN_DIRS_MAX`` is moved up into the trash and purged as its own entry, so
    any depth needs a bounded number of descriptors and no recursion. Each directory is
    listed once per visit, so a wide one costs what it holds, not its square.
    """
    stack: list[_Open] = []
    try:
        if not _unlink_or_open(trash_fd, name, stack):
            return budget - 1
        while stack and budget > 0:
            top = stack[-1]
            if top.pending is None:
                top.pending = os.listdir(top.fd)
            if top.pending:
                entry = top.pending.pop()
                budget -= 1
                if len(stack) >= _OPEN_DIRS_MAX and _is_dir_at(top.fd, entry):
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(entry, _trash_name(entry), src_dir_fd=top.fd,
                                  dst_dir_fd=trash_fd)
                else:
                    _unlink_or_open(top.fd, entry, stack)
                continue
            stack.pop()
            os.close(top.fd)
            parent_fd = stack[-1].fd if stack else trash_fd
            try:
                os.rmdir(top.name, dir_fd=parent_fd)
            except FileNotFoundError:
                pass
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # A writer added entries meanwhile: walk it again while the budget lasts.
                budget -= 1
                _unlink_or_open(parent_fd, top.name, stack)
        if len(stack) > 1:
            # Out of budget deep down: the next purge starts from here, not from the top.
            with contextlib.suppress(OSError):
                os.rename(stack[-1].name, _trash_name(stack[-1].name),
                          src_dir_fd=stack[-2].fd, dst_dir_fd=trash_fd)
        return budget
    finally:
        for held in stack:
            os.close(held.fd)


class _Open:
    """A directory a purge has open: its descriptor, its name in the one above, and the
    entries of its listing still to remove (None: not listed yet)."""

    __slots__ = ("fd", "name", "pending")

    def __init__(self, fd: int, name: str) -> None:
        self.fd = fd
        self.name = name
        self.pending: Optional[list[str]] = None


def _unlink_or_open(dir_fd: int, name: str, stack: list[_Open]) -> bool:
    """Unlink ``name`` (a file, FIFO, socket or link: never followed); when it is a
    directory, open it onto ``stack`` instead and return True."""
    for _ in range(3):  # a writer may swap the entry between the two calls
        try:
            os.unlink(name, dir_fd=dir_fd)
            return False
        except FileNotFoundError:
            return False
        except IsADirectoryError:
            pass
        except PermissionError:
            # EPERM is what unlink says for a directory where EISDIR is not given.
            if not _is_dir_at(dir_fd, name):
                raise
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                continue  # no longer a directory: unlink what it became
            raise
        stack.append(_Open(child, name))
        return True
    return False


def _is_dir_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode)
    except FileNotFoundError:
        return False
