# SPDX-License-Identifier: GPL-2.0-or-later
"""Who caused a failure in a prolog or epilog decides what happens (docs/admin.md, "Who
caused it").

* The job's own user (their request, their daemon, their directories): that job fails
  with a message saying what to do; the node stays in service.
* The node (the MPS program, NVML, a MIG mismatch, the state directory, its disk, any
  error gpushare did not expect): the node is drained with the cause first, and a batch
  job whose prolog failed is requeued as Slurm requeues one after a failing prolog.

Every error class the node path raises is sorted here, once; anything else is a node fault
that still names its type and message, so no drain reason reads "internal error" alone.
"""

from __future__ import annotations

import errno
import os
from typing import NamedTuple, Optional

from gpushare.common.safefs import UnsafePathError
from gpushare.node.job import NodeError, UserError
from gpushare.node.mps import MpsError, MpsUserError
from gpushare.node.state import StateError

__all__ = ["NODE", "STATE_DIR_FULL", "USER", "Fault", "classify", "state_dir_full"]

USER = "user"
NODE = "node"
# The drain reason of a full state_dir=; the C glue drains with it too where the worker
# could not even leave the tasks its word (spank/gs_worker.c).
STATE_DIR_FULL = "state_dir= full: {state_dir}"


class Fault(NamedTuple):
    """One failure, sorted: ``who`` caused it, ``brief`` is the drain reason (the cause
    first, short; "" for a user's fault), ``detail`` the full message for slurmd's log and
    the job, ``counted`` the message ``gpushare.node.counters`` files it under ("" for an
    internal error)."""

    who: str
    brief: str
    detail: str
    counted: str


def classify(callback: str, err: BaseException, state_dir: str) -> Fault:
    """Sort ``err``, raised by ``callback`` (``job_prolog``, ``job_epilog``)."""
    if isinstance(err, (UserError, MpsUserError)):
        return Fault(USER, "", str(err), str(err))
    full = state_dir_full(state_dir, err)
    if full:
        return Fault(NODE, STATE_DIR_FULL.format(state_dir=state_dir), full, full)
    if isinstance(err, (NodeError, MpsError)):
        return Fault(NODE, err.brief, str(err), str(err))
    if isinstance(err, UnsafePathError):
        return Fault(NODE, f"unsafe path in state_dir=: {err}", str(err), "")
    if isinstance(err, StateError):
        return Fault(NODE, f"state_dir= unusable: {err}", str(err), "")
    if isinstance(err, OSError):
        names = [str(name) for name in (err.filename, err.filename2) if name]
        where = f" ({' -> '.join(names)})" if names else ""
        what = err.strerror or str(err)
        return Fault(NODE, f"{callback} failed: {what}{where}",
                     f"{callback} failed: {what}{where}", "")
    cause = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return Fault(NODE, f"internal error in {callback}: {cause}",
                 f"an internal error in {callback} ({cause}; slurmd's log has the details)",
                 "")


def state_dir_full(state_dir: str, err: BaseException) -> str:
    """What to tell the admin and the job when ``err`` (or what caused it) says the state
    directory's file system is full or over quota; "" for any other error, and for a full
    file system that is not state_dir='s (a daemon's own MPS space, the users' mount)."""
    seen: Optional[BaseException] = err
    while seen is not None and not (isinstance(seen, OSError) and seen.errno in (
            errno.ENOSPC, errno.EDQUOT)):
        seen = seen.__cause__ or seen.__context__
    if not isinstance(seen, OSError) or not _on_state_fs(state_dir, seen.filename):
        return ""
    where = f" ({seen.filename})" if seen.filename else ""
    return (f"no space left in state_dir= {state_dir}{where}: {seen.strerror}; free "
            "it (`gpushare check` says what fills it; the users' MPS directories belong on "
            "a mount of their own, see docs/admin.md)")


def _on_state_fs(state_dir: str, filename: object) -> bool:
    """Whether ``filename`` (where a write found no room) is on state_dir='s file system:
    compared by device, from the nearest part of the path that exists (not followed).
    Without an absolute path to go by it is state_dir='s, as root writes nothing else."""
    if not isinstance(filename, (str, bytes)) or not os.path.isabs(filename):
        return True
    path = os.fsdecode(filename)
    try:
        state = os.stat(state_dir).st_dev
    except OSError:
        return True
    while True:
        try:
            return os.lstat(path).st_dev == state
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return True
            path = parent
