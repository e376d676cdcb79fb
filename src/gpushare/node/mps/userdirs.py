# SPDX-License-Identifier: GPL-2.0-or-later
"""The users' MPS directories: ``<mps_dir>/<key>/{pipe,log}``, one pair per daemon.

The key directory is root's (0755); ``pipe`` and ``log`` below it are the daemon's user's
(0700): the daemon, which runs as that user, binds its sockets and writes its log there.
With ``mps_space=SIZE,INODES`` (the default) the key directory is a tmpfs of its own
(``space``), so a user who fills theirs fails only their own jobs; with ``shared`` all keys
share ``mps_dir``'s file system, whose ``.trash`` is made before any user can fill it.
Everything below a key directory is the user's to change, so root reaches it only through
descriptors opened without following links, and reads of it are bounded.

What the user did there fails only their job (``MpsUserError``); what is wrong with the
users' directory itself is the node's (``MpsError``).
"""

import errno
import os
import re
import stat
from contextlib import contextmanager
from typing import Iterator

from gpushare.common import safefs
from gpushare.common.log import get_logger
from gpushare.node.config import mps_space_limits
from gpushare.node.mps import space
from gpushare.node.mps.errors import MpsError, MpsUserError
from gpushare.node.mps.record import JOBS_SUFFIX, KEY_PATTERN, TICKETS, DaemonRecord, RecordStore

__all__ = ["USERS_ROOM", "UserDirs", "control_problem", "exists_at"]

LOG = get_logger("gpushare.mps")

# Room a daemon's start needs on the users' mount (its sockets, pid file, first log lines).
USERS_ROOM = 64 * 1024
# The modes a daemon's own directories keep unless their user changes them.
DIR_MODE = 0o700


class UserDirs:
    """The pipe and log directories of every daemon of the node, below ``mps_dir``."""

    def __init__(self, store: RecordStore, mps_dir: str, state_dir: str,
                 mps_space: str = "shared") -> None:
        self.store = store
        self.mps_dir = mps_dir
        self.state_dir = state_dir
        self.mps_space = mps_space
        # Each key's tmpfs (bytes, inodes); None: all share mps_dir's file system.
        self.limits = mps_space_limits(mps_space)

    def path(self, *parts: str) -> str:
        """A path among the users' pipe and log directories."""
        return os.path.join(self.mps_dir, *parts)

    def keys(self) -> list[str]:
        """The daemon directories in the users' directory (a record may be gone)."""
        try:
            with self.store.users_fd(create=False) as users_fd:
                return [name for name in os.listdir(users_fd)
                        if not name.startswith(".") and re.match(KEY_PATTERN, name)
                        and not name.endswith((".json", ".lock", JOBS_SUFFIX))
                        and name != TICKETS]
        except FileNotFoundError:
            return []

    def make(self, rec: DaemonRecord) -> None:
        """A fresh key directory with the user's empty ``pipe`` and ``log`` (whatever an
        earlier daemon of the key left there goes first)."""
        key = rec.key
        try:
            with self.store.users_fd() as users_fd:
                if self.limits is None:
                    safefs.ensure_trash_at(users_fd)
                    self._check_space(users_fd, rec)
                if exists_at(users_fd, key):
                    # Only root's own leftover goes; anything planted there is refused.
                    os.close(safefs.open_dir_at(users_fd, key, self.path(key),
                                                root_owned=True))
                    LOG.info("removing leftover MPS directory %s", self.path(key))
                    self._remove_at(users_fd, key)
                safefs.make_owned_dir(users_fd, key, self.path(key), 0, 0, 0o755)
                rec.dirs_made = True
                if self.limits is not None:
                    self._mount(users_fd, rec)
                key_fd = safefs.open_dir_at(users_fd, key, self.path(key), root_owned=True)
                try:
                    for name in ("pipe", "log"):
                        safefs.make_owned_dir(key_fd, name, self.path(key, name),
                                              rec.uid, rec.gid, DIR_MODE)
                finally:
                    os.close(key_fd)
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS directory refused: {err}") from None
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT) and self.own_mount():
                raise self._full(rec, err.strerror or str(err)) from None
            if err.errno in (errno.ENOSPC, errno.EDQUOT) and not os.path.isabs(
                    str(err.filename or "")):
                # Charged by the file system it came from (faults.state_dir_full).
                raise OSError(err.errno, err.strerror, self.path(key)) from err
            raise

    def _mount(self, users_fd: int, rec: DaemonRecord) -> None:
        """The key's own tmpfs on its fresh, root-owned directory. A node that cannot
        mount one is the node's fault, with what to set instead."""
        assert self.limits is not None
        path = self.path(rec.key)
        key_fd = safefs.open_dir_at(users_fd, rec.key, path, root_owned=True)
        try:
            space.mount_key(key_fd, path, *self.limits)
        except OSError as err:
            raise MpsError(
                f"cannot start MPS for {rec.describe()}: cannot mount its own tmpfs on "
                f"{path} ({err.strerror}); root needs mount(2) there (CAP_SYS_ADMIN), or "
                "set plugstack mps_space=shared and mount one tmpfs on "
                f"{self.mps_dir} (docs/admin.md, \"Space\")",
                brief=f"MPS space: cannot mount a tmpfs on {path}") from None
        finally:
            os.close(key_fd)
        if not space.is_key_mount(users_fd, rec.key, path):
            raise MpsError(f"cannot start MPS for {rec.describe()}: {path} is no tmpfs of "
                           "its own after mounting one", brief=f"MPS space: no tmpfs on {path}")

    def remove(self, key: str) -> None:
        """Take daemon ``key``'s pipe and log directories away (at once, whatever the user
        left there). What cannot go now is logged and left for the next reap: a leftover
        never fails a job or drains the node."""
        try:
            with self.store.users_fd(create=False) as users_fd:
                self._remove_at(users_fd, key)
        except FileNotFoundError:
            pass
        except OSError as err:
            LOG.warning("cannot remove MPS directory %s: %s; the next reap (a prolog, or "
                        "`gpushare mps --reap`) tries again", self.path(key), err)

    def _remove_at(self, users_fd: int, key: str) -> None:
        """Unmount the key's tmpfs (one call, whatever it holds) and remove the empty
        directory; a key without one (``mps_space=shared``, an earlier setting) is
        discarded as a tree (``safefs.remove_tree_at``)."""
        path = self.path(key)
        if space.unmount_key(users_fd, key, path):
            try:
                os.rmdir(key, dir_fd=users_fd)
                return
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        safefs.remove_tree_at(users_fd, key, keep_trash=self.limits is None)

    def purge_trash(self) -> None:
        """Go on removing daemon directories discarded before (``safefs.discard_tree_at``)
        within a bounded budget; what is left waits for the next prolog. Never fails one."""
        try:
            with self.store.users_fd(create=False) as users_fd:
                safefs.purge_trash_at(users_fd, keep_trash=self.limits is None)
        except (OSError, MpsError) as err:
            if not isinstance(err, FileNotFoundError):
                LOG.warning("cannot purge %s: %s", self.path(safefs.TRASH), err)

    def own_mount(self) -> bool:
        """Whether the users' directory is a file system of its own, apart from root's."""
        try:
            return os.stat(self.mps_dir).st_dev != os.stat(self.state_dir).st_dev
        except OSError:
            return False

    def _check_space(self, users_fd: int, rec: DaemonRecord) -> None:
        """A daemon needs room in the users' mount for its sockets and log: where the users
        filled it, say so before starting one that would fail for want of it."""
        if not self.own_mount():
            return  # full there means state_dir= full: a node fault, found by the writes
        try:
            space = os.fstatvfs(users_fd)
        except OSError:
            return
        if (space.f_files and space.f_favail == 0) or (
                space.f_blocks and space.f_bavail * space.f_frsize < USERS_ROOM):
            raise self._full(rec, "no space or inodes left")

    def check_room(self, rec: DaemonRecord) -> None:
        """A job joining a daemon whose own space its user filled would find no room for
        its server's sockets: it fails now, saying whose space it is and what to do."""
        if self.limits is None:
            return
        try:
            with self.store.users_fd(create=False) as users_fd:
                key_fd = safefs.open_dir_at(users_fd, rec.key, self.path(rec.key),
                                            root_owned=True)
                try:
                    if os.fstat(key_fd).st_dev == os.fstat(users_fd).st_dev:
                        return  # no space of its own (made under mps_space=shared)
                    room = os.fstatvfs(key_fd)
                finally:
                    os.close(key_fd)
        except (OSError, MpsError):
            return  # the start or the control check says what is wrong
        if not ((room.f_files and room.f_favail == 0) or (
                room.f_blocks and room.f_bavail * room.f_frsize < USERS_ROOM)):
            return
        raise MpsUserError(
            f"{rec.describe()}: its own MPS space {self.path(rec.key)} (uid {rec.uid}'s, "
            f"plugstack mps_space={self.mps_space}) is full: the jobs of uid {rec.uid} "
            "filled $CUDA_MPS_LOG_DIRECTORY or $CUDA_MPS_PIPE_DIRECTORY. Remove what they "
            "wrote there, or end them: the space is renewed when the daemon's last job ends",
            brief=f"MPS space of daemon {rec.key} full (uid {rec.uid})")

    def _full(self, rec: DaemonRecord, why: str) -> MpsUserError:
        """Users filled their mount: the job fails, the node stays in service (a user did
        it, and the next daemon stop frees room)."""
        return MpsUserError(
            f"cannot start MPS for {rec.describe()}: the users' MPS directories {self.mps_dir} "
            f"are full ({why}); the jobs writing there fill it. Submit again later; the "
            "node's admin finds who with `gpushare check` and `du -s "
            f"{self.mps_dir}/*`",
            brief=f"MPS directories full: {self.mps_dir}")

    @contextmanager
    def dir_fd(self, key: str, name: str) -> Iterator[int]:
        """The daemon's ``pipe`` or ``log`` directory (the user's), reached through its
        root-owned key directory without following a link."""
        with self.store.users_fd(create=False) as users_fd:
            key_fd = safefs.open_dir_at(users_fd, key, self.path(key), root_owned=True)
        try:
            dir_fd = safefs.open_dir_at(key_fd, name, self.path(key, name))
        finally:
            os.close(key_fd)
        try:
            yield dir_fd
        finally:
            os.close(dir_fd)

    def log_tail(self, key: str, lines: int = 3) -> str:
        """``; control.log ends: ...`` with the daemon log's last lines ("" without one).

        The log directory belongs to the job's user: the file is read without following
        a link, only when it is a regular file, and at most 64 KiB of it.
        """
        try:
            with self.dir_fd(key, "log") as log_fd:
                data = safefs.read_small_file_at(log_fd, "control.log", 1 << 16)
        except (OSError, safefs.UnsafePathError, MpsError):
            return ""
        text = [line.strip() for line in (data or b"").decode("utf-8", "replace").splitlines()
                if line.strip()]
        return f"; control.log ends: {' | '.join(text[-lines:])}" if text else ""

    def changed(self, rec: DaemonRecord) -> str:
        """What the daemon's user changed about its ``pipe`` or ``log`` directory since
        root made them ("" when both are as made): another owner or mode, another kind of
        file, or the directory gone. Read with ``lstat`` through the key directory."""
        try:
            with self.store.users_fd(create=False) as users_fd:
                key_fd = safefs.open_dir_at(users_fd, rec.key, self.path(rec.key),
                                            root_owned=True)
        except (OSError, safefs.UnsafePathError) as err:
            return f"its directory {self.path(rec.key)} cannot be opened ({err})"
        try:
            for name in ("pipe", "log"):
                try:
                    info = os.lstat(name, dir_fd=key_fd)
                except OSError:
                    return f"{self.path(rec.key, name)} is gone"
                if not stat.S_ISDIR(info.st_mode):
                    return f"{self.path(rec.key, name)} is no directory any more"
                if info.st_uid != rec.uid:
                    return f"{self.path(rec.key, name)} belongs to uid {info.st_uid}"
                if stat.S_IMODE(info.st_mode) != DIR_MODE:
                    return (f"{self.path(rec.key, name)} has mode "
                            f"{stat.S_IMODE(info.st_mode):04o}, not {DIR_MODE:04o}")
        finally:
            os.close(key_fd)
        return ""

    def check_control(self, rec: DaemonRecord) -> None:
        """``check_control_at`` through the daemon's pipe directory. What the user can
        change below the users' directory fails their job; an unsafe users' directory itself
        is the node's fault (its MpsError goes on)."""
        try:
            with self.dir_fd(rec.key, "pipe") as pipe_fd:
                check_control_at(pipe_fd, rec)
        except (OSError, safefs.UnsafePathError) as err:
            raise MpsUserError(f"{rec.describe()}: its pipe directory {rec.pipe_dir} cannot "
                               f"be used ({err}); the job's user changed it",
                               brief=f"MPS pipe directory of daemon {rec.key} changed by its "
                               "user") from None

    def root_pipe_dir(self, key: str) -> bool:
        """Whether daemon ``key``'s pipe directory is root's alone (root's daemon's)."""
        try:
            info = os.lstat(self.path(key, "pipe"))
        except OSError:
            return False
        return (info.st_uid == 0 and not info.st_mode & 0o077 and stat.S_ISDIR(info.st_mode))


def check_control_at(pipe_fd: int, rec: DaemonRecord) -> None:
    """Root talks to a daemon only through ``control`` when it is a socket of the daemon's
    user, in a pipe directory of theirs: anything else there was put by that user (a daemon
    only binds sockets), and stops MPS for their job alone."""
    problem = control_problem(pipe_fd, rec.uid)
    if problem:
        raise MpsUserError(
            f"{rec.describe()}: {os.path.join(rec.pipe_dir, 'control')} {problem}, not "
            "the daemon's socket; the job's user put it there. Stop what runs in "
            f"{rec.pipe_dir} and submit again",
            brief=f"MPS control of daemon {rec.key} {problem}")


def control_problem(pipe_fd: int, uid: int) -> str:
    """What is wrong with ``control`` in a daemon's pipe directory for a daemon of ``uid``
    ("" when it is a socket of that user): read with ``lstat``, never followed."""
    try:
        info = os.lstat("control", dir_fd=pipe_fd)
    except FileNotFoundError:
        return "is missing"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISSOCK(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else (
            "a directory" if stat.S_ISDIR(info.st_mode) else "a regular file"
            if stat.S_ISREG(info.st_mode) else "not a socket")
        return f"is {kind}" if kind.startswith("a ") else kind
    if info.st_uid != uid:
        return f"is a socket of uid {info.st_uid}"
    return ""


def exists_at(dir_fd: int, name: str) -> bool:
    """Whether ``name`` is in ``dir_fd`` (any kind of file, not followed)."""
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True
