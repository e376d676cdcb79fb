"""Route the core's ``logging`` into Slurm's log (through the plugin) and the debug log.

Inside slurmstepd there is no stderr worth writing to; every message must reach slurmd's
log with the job id, which the SPANK logging functions do.
"""

from __future__ import annotations

import logging
import os
import time

TYPE_CHECKING = False  # not typing's: see the package docstring
if TYPE_CHECKING:
    from typing import Callable

LEVEL_ERROR, LEVEL_INFO, LEVEL_VERBOSE, LEVEL_DEBUG, LEVEL_USER = range(5)

_SLURM_LEVELS = (
    (logging.ERROR, LEVEL_ERROR),
    (logging.WARNING, LEVEL_ERROR),
    (logging.INFO, LEVEL_INFO),
    (logging.DEBUG, LEVEL_DEBUG),
)


_current_job = 0


def set_job(job_id: int) -> None:
    """Name this job in every line logged until the next call (one callback at a time)."""
    global _current_job
    _current_job = job_id


def _job_of(record: logging.LogRecord) -> int:
    return getattr(record, "job_id", None) or _current_job


class SlurmHandler(logging.Handler):
    """Send each record to a ``(level, text)`` sink, the plugin's ``gs_log``."""

    def __init__(self, sink: Callable[[int, str], None], prefix: str = "gpushare") -> None:
        super().__init__()
        self.sink = sink
        self.prefix = prefix

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = next(lvl for threshold, lvl in _SLURM_LEVELS if record.levelno >= threshold)
            job = _job_of(record)
            head = f"{self.prefix}: job {job}: " if job else f"{self.prefix}: "
            text = head + record.getMessage()
            if record.exc_info:
                text += "\n" + self.formatter_or_default().formatException(record.exc_info)
            for line in text.splitlines():
                self.sink(level, line)
        except Exception:  # a log line must never break a callback
            self.handleError(record)

    def formatter_or_default(self) -> logging.Formatter:
        return self.formatter or logging.Formatter()


class DebugFileHandler(logging.Handler):
    """Append lines to the admin's ``debug_log=`` file, never through a symlink."""

    def __init__(self, path: str) -> None:
        super().__init__(level=logging.DEBUG)
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        job = _job_of(record)
        line = (f"{int(time.time())} pid={os.getpid()} uid={os.getuid()} py job={job} "
                f"{record.levelname.lower()} {record.getMessage()}\n")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)


def install(sink: Callable[[int, str], None], debug_log: str = "") -> logging.Logger:
    """Make the ``gpushare`` logger write to Slurm (and the debug log), once per process."""
    logger = logging.getLogger("gpushare")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    kinds = {type(h) for h in logger.handlers}
    if SlurmHandler not in kinds:
        handler = SlurmHandler(sink)
        handler.setLevel(logging.INFO)
        logger.addHandler(handler)
    if debug_log and DebugFileHandler not in kinds:
        logger.addHandler(DebugFileHandler(debug_log))
    return logger
