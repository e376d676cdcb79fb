# SPDX-License-Identifier: GPL-2.0-or-later
"""MPS control daemons for jobs on this node (see ``manager``)."""

from gpushare.node.mps.manager import (
    SOCKET_NAME_ROOM,
    SOCKET_PATH_MAX,
    MpsDevice,
    MpsError,
    MpsLease,
    MpsManager,
    daemon_key,
    format_size,
)

__all__ = ["SOCKET_NAME_ROOM", "SOCKET_PATH_MAX", "MpsDevice", "MpsError", "MpsLease",
           "MpsManager", "daemon_key", "format_size"]
