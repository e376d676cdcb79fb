# SPDX-License-Identifier: GPL-2.0-or-later
"""The one error of the MPS package."""

from typing import Sequence


class MpsError(RuntimeError):
    """MPS could not be set up or torn down; the message says which device, why, what to do.

    ``brief`` is the cause first and identifiers last, short enough for a node's drain
    reason (``sinfo -R``); the message keeps every detail for slurmd's log.
    """

    def __init__(self, message: str, brief: str = "") -> None:
        super().__init__(message)
        self.brief = brief or message


class MpsUserError(MpsError):
    """What the job's own user did to their daemon or its directories stops MPS for their
    job (a ``control`` that is not their daemon's socket): that job fails with the
    message; the node is not at fault and stays in service."""


def joined(errors: Sequence[MpsError]) -> MpsError:
    """One error for several daemons: every message, the first one's brief."""
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return MpsError("; ".join(map(str, errors)), brief=errors[0].brief + more)
