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
import os
import stat
from typing import Optional

__all__ = [
    "UnsafePathError",
    "check_root_owned_file",
    "file_stamp",
    "make_owned_dir",
    "open_dir_at",
    "open_root_dir",
    "read_small_file_at",
    "remove_file_at",
    "remove_tree_at",
    "write_file_atomic",
    "write_file_atomic_at",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DEPTH = 64


class UnsafePathError(OSError):
    """A path is not safe for root to use; the message names it and says what to fix."""


def _describe(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}"


def _check_root_dir(st: os.stat_result, path: str) -> None:
    """A directory root may trust: root-owned, writable by others only if sticky (like /tmp)."""
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{path} is not a directory; remove it")
    if st.st_uid != 0:
        raise UnsafePathError(
            f"{path} is not owned by root ({_describe(st)}); remove it or chown root:root"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(
            f"{path} is writable by group or others ({_describe(st)}); chmod go-w it"
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

    Missing components are created root-owned with ``mode`` when ``create`` is true.
    Returns a descriptor the caller closes.
    """
    if not os.path.isabs(path):
        raise UnsafePathError(f"{path} is not an absolute path")
    fd = os.open("/", _DIR_FLAGS)
    current = "/"
    try:
        _check_root_dir(os.fstat(fd), current)
        for name in [part for part in os.path.normpath(path).split("/") if part]:
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
            _check_root_dir(os.fstat(fd), current)
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
    """Check that a program root will run is root-owned and not writable by others.

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
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(
            f"{path} must be owned by root and not writable by group or others "
            f"({_describe(st)}); chown root:root and chmod go-w it"
        )
    directory = os.path.dirname(real)
    while True:
        try:
            _check_root_dir(os.stat(directory), directory)
        except UnsafePathError as err:
            raise UnsafePathError(f"{path}: {err}, or install the program elsewhere") from None
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


def remove_tree_at(parent_fd: int, name: str, _depth: int = 0) -> bool:
    """Remove ``name`` below ``parent_fd`` and all it holds, walking by descriptor.

    A symlink is unlinked, never followed; a directory swapped for a symlink mid-walk
    makes the open fail instead of escaping. False if ``name`` was absent.
    """
    if _depth > _MAX_DEPTH:
        raise UnsafePathError(f"{name}: directory tree deeper than {_MAX_DEPTH} levels")
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return True
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                remove_tree_at(fd, entry.name, _depth + 1)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
    return True
