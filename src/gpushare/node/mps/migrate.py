# SPDX-License-Identifier: GPL-2.0-or-later
"""Records an earlier release kept in ``<state_dir>/mps`` (the users' directory), moved to
root's ``<state_dir>/daemons`` on first use, so the daemons of running jobs are kept."""

import os
import re

from gpushare.common import safefs
from gpushare.common.log import get_logger
from gpushare.node.mps.lock import locked
from gpushare.node.mps.record import KEY_PATTERN, TICKETS, RecordStore
from gpushare.node.phases import time_left

__all__ = ["migrate"]

LOG = get_logger("gpushare.mps")


def migrate(store: RecordStore, mps_dir: str, store_fd: int, lock_timeout: float) -> None:
    """Move each record, job reference and lock an earlier release kept in ``mps_dir`` into
    root's records, under the daemon's lock in both places (an earlier release's process
    may still hold the old one). Join tickets left there are dropped: the next join writes
    one where the plugin now looks."""
    old = RecordStore(mps_dir, mps_dir)
    try:
        with store.users_fd(create=False) as users_fd:
            names = os.listdir(users_fd)
            keys = sorted({name[:-5] for name in names
                           if name.endswith((".json", ".lock"))
                           and re.match(KEY_PATTERN, name[:-5])})
            for key in keys:
                wait = time_left(lock_timeout)
                with locked(store_fd, key, store.path(key + ".lock"), wait), \
                        locked(users_fd, key, old.path(key + ".lock"), wait) as old_lock:
                    rec = old.read(users_fd, key)
                    if rec is not None and store.read(store_fd, key) is None:
                        store.write(store_fd, rec)
                        LOG.info("moved the record of %s to %s", rec.describe(),
                                 store.daemons_dir)
                    old.remove(users_fd, key)
                    old_lock.remove = True
            if TICKETS in names:
                safefs.remove_tree_at(users_fd, TICKETS)
    except FileNotFoundError:
        pass
