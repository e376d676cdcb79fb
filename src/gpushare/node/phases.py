# SPDX-License-Identifier: GPL-2.0-or-later
"""Where a prolog's or epilog's time went, as one debug line per callback.

A shared job's first task waits for its prolog's worker, and the next job on the node for
the epilog's: an admin asking why a job started late, and ``bench/bench_prolog.py``, read
this line (``timing imports=3.1 verify=12.0 ... total=48.2``, milliseconds) from the
plugin's ``debug_log=``. The interpreter's start comes before it: from the C glue's
``detached`` line to its ``python=start``; ``imports`` follow that.
"""

import time
from typing import Optional

__all__ = ["Phases"]


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
