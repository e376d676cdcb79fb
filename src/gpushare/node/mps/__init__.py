# SPDX-License-Identifier: GPL-2.0-or-later
"""MPS control daemons for the jobs of this node.

``manager`` runs their lifecycle (start on first use, reference-count, stop on last
release, reap what lost jobs left); ``record`` is the daemon record kept on disk and its
store, ``lock`` the per-daemon lock, ``procscan`` finds MPS processes through /proc,
``control`` speaks to a daemon, ``isolation`` says where and with what limits a daemon
runs, and ``limits`` computes every limit a job and a daemon get.
"""

from gpushare.node.mps.errors import MpsError, MpsUserError
from gpushare.node.mps.limits import Limits, format_size, limits_for
from gpushare.node.mps.manager import SOCKET_NAME_ROOM, SOCKET_PATH_MAX, MpsManager
from gpushare.node.mps.record import (
    RECORD_VERSION,
    DaemonRecord,
    MpsDevice,
    MpsLease,
    RecordStore,
    daemon_key,
)

__all__ = ["RECORD_VERSION", "SOCKET_NAME_ROOM", "SOCKET_PATH_MAX", "DaemonRecord", "Limits",
           "MpsDevice", "MpsError", "MpsLease", "MpsManager", "MpsUserError", "RecordStore",
           "daemon_key", "format_size", "limits_for"]
