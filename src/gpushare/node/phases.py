# SPDX-License-Identifier: GPL-2.0-or-later
"""Where a prolog's or epilog's time went, as one debug line per callback.

A shared job's first task waits for its prolog's worker, and the next job on the node for
the epilog's: an admin asking why a job started late, and ``bench/bench_prolog.py``, read
this line (``timing imports=3.1 verify=12.0 ... total=48.2``, milliseconds) from the
plugin's ``debug_log=``. The interpreter's start comes before it: from the C glue's
``detached`` line to its ``python=start``; ``imports`` follow that.

A worker also has one deadline, at which the C glue kills it (spank/gs_deadline.c):
``start`` sets it, ``time_left`` bounds the worker's own waits inside it, and ``doing``
writes what the worker does now into the job's lock file, from which the C glue names
what a killed worker was waiting for.
"""

import contextlib
import os
import stat
import time
from typing import Optional

__all__ = ["BOARD_SIZE", "Phases", "doing", "start", "time_left"]

# What ``doing`` writes: one line, padded with blanks to this many bytes, at offset 0 (the
# C glue's GS_BOARD_SIZE; it reads no more).
BOARD_SIZE = 160
_deadline: Optional[float] = None
_board: Optional[int] = None


def start(seconds: float, board: str = "") -> None:
    """This worker is killed ``seconds`` from now; ``board``: the job's lock file, where
    ``doing`` writes (already created by the C glue, root's; "" for none)."""
    global _deadline, _board
    _deadline = time.monotonic() + seconds
    if _board is not None:
        os.close(_board)
        _board = None
    if board:
        try:
            fd = os.open(board, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return  # only a message is lost
        seen = os.fstat(fd)
        if seen.st_nlink != 1 or not stat.S_ISREG(seen.st_mode) or seen.st_uid != os.geteuid():
            os.close(fd)
            return
        _board = fd


def time_left(bound: float) -> float:
    """``bound`` seconds, or less when this worker's deadline comes sooner (never below 0)."""
    if _deadline is None:
        return bound
    return max(0.0, min(bound, _deadline - time.monotonic()))


def doing(text: str) -> None:
    """Say what this worker does now: a killed worker's drain reason names it."""
    if _board is None:
        return
    data = text.encode("utf-8", "replace")[:BOARD_SIZE].ljust(BOARD_SIZE)
    with contextlib.suppress(OSError):  # only a message is lost
        os.pwrite(_board, data, 0)


class Phases:
    """Monotonic checkpoints: ``done(name)`` charges the time since the last one to
    ``name`` (summed when a name repeats)."""

    def __init__(self, imports: Optional[float] = None) -> None:
        self._start = self._last = time.monotonic()
        self.spent: dict[str, float] = {} if imports is None else {"imports": imports}

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.spent[name] = self.spent.get(name, 0.0) + now - self._last
        self._last = now

    def line(self) -> str:
        """``name=ms`` for each phase in the order first seen, then ``total`` (since this
        object was made, imports not included)."""
        parts = [f"{name}={1000 * seconds:.1f}" for name, seconds in self.spent.items()]
        parts.append(f"total={1000 * (time.monotonic() - self._start):.1f}")
        return "timing " + " ".join(parts)
