# SPDX-License-Identifier: GPL-2.0-or-later
"""The per-daemon lock: ``flock`` on ``<key>.lock`` beside the record, with a deadline."""

import errno
import fcntl
import os
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from gpushare.common import safefs
from gpushare.node import counters
from gpushare.node.mps.errors import MpsError


class Lock:
    """An ``flock`` on ``<key>.lock`` taken with a deadline, never waiting forever.

    The file may be unlinked by the holder when the key goes away (``remove``); a waiter
    that then gets the lock on the unlinked file notices (inode changed) and starts over.
    """

    def __init__(self, dir_fd: int, name: str, path: str, timeout: float) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.path = path
        self.timeout = timeout
        self.fd: Optional[int] = None
        self.remove = False

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        # Short, capped pauses: jobs starting together on one GPU queue here behind a
        # daemon start, and a long backoff would leave the lock free while they sleep.
        delay = 0.001
        while True:
            fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=self.dir_fd)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as err:
                        if err.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                    if time.monotonic() > deadline:
                        counters.timed_out("lock")
                        raise MpsError(f"MPS lock {self.path} still held after "
                                       f"{self.timeout:g} s; another prolog or epilog is "
                                       "stuck — find it with: fuser " + self.path)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.01)
                try:
                    current = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    current = None
                if current is not None and current.st_ino == os.fstat(fd).st_ino:
                    self.fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        if self.remove:
            safefs.remove_file_at(self.dir_fd, self.name)
        os.close(self.fd)
        self.fd = None


@contextmanager
def locked(dir_fd: int, key: str, path: str, timeout: float) -> Iterator[Lock]:
    """Hold ``key``'s lock in ``dir_fd`` (``path`` names it in messages)."""
    lock = Lock(dir_fd, key + ".lock", path, timeout)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


def lock_held(dir_fd: int, key: str) -> bool:
    """Whether someone holds ``key``'s lock now (asked without waiting or creating it)."""
    try:
        fd = os.open(key + ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # releases the shared lock at once
    return False
