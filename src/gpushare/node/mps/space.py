# SPDX-License-Identifier: GPL-2.0-or-later
"""Each MPS daemon's own space: a small tmpfs root mounts on the daemon's key directory
``<mps_dir>/<key>`` before it makes the user's ``pipe`` and ``log`` in it (plugstack
``mps_space=SIZE,INODES``).

Why: the daemon's user can write there, and a file system users share is one any of them
can fill for all. A tmpfs per key has its own size and inode limits, so a user who fills
theirs fails only their own jobs; and whatever they left there goes with one unmount.

Root mounts only on a key directory it just made (root's, reached without following a
link), through ``/proc/self/fd``; it unmounts only a root-owned key directory that is the
root of a tmpfs mounted on exactly that path (``/proc/self/mountinfo``), never a path a
user could have placed. The calls are mount(2) and umount2(2) themselves: no program, no
PATH.
"""

import ctypes
import os
import stat
from typing import NamedTuple, Optional

__all__ = ["FSNAME", "KeySpace", "is_key_mount", "mount_key", "unmount_key", "usage"]

FSNAME = "gpushare-mps"  # the source column of the daemons' mounts in /proc/mounts
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MNT_DETACH, _UMOUNT_NOFOLLOW = 0x2, 0x8
_STACKED_MAX = 8  # mounts one key directory may hold (left by crashes): each goes
_LIBC: Optional[ctypes.CDLL] = None


class KeySpace(NamedTuple):
    """What one daemon's tmpfs holds and may hold (``gpushare check``)."""

    used_bytes: int
    size_bytes: int
    used_inodes: int
    inodes: int

    def full(self) -> bool:
        """No room left for a socket or a log line."""
        return self.used_inodes >= self.inodes or self.size_bytes - self.used_bytes < 4096


def _libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _raise(call: str, path: str) -> None:
    code = ctypes.get_errno()
    raise OSError(code, f"{call}: {os.strerror(code)}", path)


def mount_key(key_fd: int, path: str, size: int, inodes: int) -> None:
    """Mount a fresh tmpfs of ``size`` bytes and ``inodes`` inodes, root's 0755, on the
    key directory open as ``key_fd`` (``path`` names it in messages)."""
    options = f"size={size},nr_inodes={inodes},mode=0755,uid=0,gid=0"
    target = f"/proc/self/fd/{key_fd}".encode()
    if _libc().mount(FSNAME.encode(), target, b"tmpfs",
                     ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC),
                     options.encode()) != 0:
        _raise("mount tmpfs", path)


def is_key_mount(users_fd: int, key: str, path: str) -> bool:
    """Whether ``key`` below the users' directory is a root-owned directory that is the root
    of a tmpfs mounted on ``path`` itself (what ``mount_key`` made, or an earlier run)."""
    try:
        info = os.lstat(key, dir_fd=users_fd)
    except FileNotFoundError:
        return False
    if (not stat.S_ISDIR(info.st_mode) or info.st_uid != 0
            or info.st_dev == os.fstat(users_fd).st_dev):
        return False
    return _tmpfs_mounted(path, info.st_dev)


def _tmpfs_mounted(path: str, dev: int) -> bool:
    """Whether /proc/self/mountinfo has a tmpfs of device ``dev`` mounted on ``path``."""
    want = f"{os.major(dev)}:{os.minor(dev)}".encode()
    target = os.fsencode(path)
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle:
            fields = line.split()
            try:
                fstype = fields[fields.index(b"-", 6) + 1]
            except (ValueError, IndexError):
                continue
            if fields[2] == want and fstype == b"tmpfs" and _unescape(fields[4]) == target:
                return True
    return False


def _unescape(field: bytes) -> bytes:
    """A mountinfo path: space, tab, newline and backslash come as octal escapes."""
    if b"\\" not in field:
        return field
    out = bytearray()
    i = 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out += field[i:i + 1]
            i += 1
    return bytes(out)


def unmount_key(users_fd: int, key: str, path: str) -> int:
    """Detach every tmpfs of a daemon stacked on its key directory; how many. Anything else
    there (no mount, another file system, not root's) is left alone: 0."""
    count = 0
    while count < _STACKED_MAX and is_key_mount(users_fd, key, path):
        if _libc().umount2(os.fsencode(path), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
            _raise("umount", path)
        count += 1
    return count


def usage(users_fd: int, key: str, path: str) -> Optional[KeySpace]:
    """What daemon ``key``'s tmpfs holds; None when it has none."""
    if not is_key_mount(users_fd, key, path):
        return None
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=users_fd)
    try:
        room = os.fstatvfs(fd)
    finally:
        os.close(fd)
    return KeySpace((room.f_blocks - room.f_bfree) * room.f_frsize,
                    room.f_blocks * room.f_frsize, room.f_files - room.f_ffree, room.f_files)
