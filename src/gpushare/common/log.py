# SPDX-License-Identifier: GPL-2.0-or-later
"""Logging for the code the plugins run: into Slurm's log (through the plugin) and the debug log.

Inside slurmstepd and slurmctld there is no stderr worth writing to; every message must
reach the daemon's log with the job id, which the SPANK and job_submit logging functions
do. Every prolog and epilog starts a fresh interpreter, and importing the standard
``logging`` package (with ``traceback``, ``threading``, ``string`` and ``weakref``) costs
about 4 ms of CPU each time, a tenth of what gpushare adds to a job. So the core logs
through these small named loggers, with ``logging``'s call shape: once a plugin has
installed its sink, a message goes straight to Slurm and to the admin's ``debug_log=``;
anywhere else (the CLI, tests) it is handed to ``logging`` under the same name, imported
on first use, so standard handlers and pytest's caplog see it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import Callable, Optional

Sink = Callable[[int, str], None]

# Levels of the plugins' gs_log (spank/gs_host.h).
LEVEL_ERROR, LEVEL_INFO, LEVEL_VERBOSE, LEVEL_DEBUG, LEVEL_USER = range(5)

# The standard logging's level numbers, so records handed to it keep their level.
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
_NAMES = {DEBUG: "debug", INFO: "info", WARNING: "warning", ERROR: "error"}
# Slurm has no warning level: its own warning() logs at info with "warning: " before the
# text, so an admin's grep for "error:" finds errors only.
_TO_SLURM = {INFO: LEVEL_INFO, WARNING: LEVEL_INFO, ERROR: LEVEL_ERROR}

# debug_log= lines name users' jobs, GPUs and pids: root's, readable by its group (root, or
# adm after an admin's chgrp) and by no one else; a file left 0644 by an earlier release is
# narrowed at the next line (spank/gs_log.c does the same).
DEBUG_LOG_MODE = 0o640

_sink: Optional[Sink] = None
_debug_log = ""
_current_job = 0


class Logger:
    """A named logger: ``debug``/``info``/``warning``/``error``/``exception`` with %-args."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, msg: str, *args: object) -> None:
        _emit(self.name, DEBUG, msg, args)

    def info(self, msg: str, *args: object) -> None:
        _emit(self.name, INFO, msg, args)

    def warning(self, msg: str, *args: object) -> None:
        _emit(self.name, WARNING, msg, args)

    def error(self, msg: str, *args: object) -> None:
        _emit(self.name, ERROR, msg, args)

    def exception(self, msg: str, *args: object) -> None:
        """An error with the traceback of the exception being handled."""
        _emit(self.name, ERROR, msg, args, with_traceback=True)


def get_logger(name: str) -> Logger:
    return Logger(name)


def install(sink: Sink, debug_log: str = "") -> None:
    """Send every message of this process to ``sink`` (INFO and up) and ``debug_log``."""
    global _sink, _debug_log
    _sink = sink
    if debug_log:
        _debug_log = debug_log


def uninstall() -> None:
    """Back to handing messages to ``logging`` (tests)."""
    global _sink, _debug_log
    _sink, _debug_log = None, ""


def set_job(job_id: int) -> None:
    """Name this job in every line logged until the next call (one callback at a time)."""
    global _current_job
    _current_job = job_id


def _emit(name: str, level: int, msg: str, args: tuple[object, ...],
          with_traceback: bool = False) -> None:
    if _sink is None:
        import logging

        logging.getLogger(name).log(level, msg, *args, exc_info=with_traceback)
        return
    try:
        text = msg % args if args else msg
        if with_traceback:
            import traceback

            text += "\n" + traceback.format_exc().rstrip()
    except Exception:  # a log line must never break a callback
        text = f"{msg!r} % {args!r} (a log call whose arguments do not fit)"
    job = _current_job
    if level >= INFO:
        head = f"gpushare: job {job}: " if job else "gpushare: "
        if level == WARNING:
            head = "warning: " + head
        for line in text.splitlines():
            with contextlib.suppress(Exception):  # nor may a sink that fails
                _sink(_TO_SLURM[level], head + line)
    if _debug_log:
        _append_debug_log(f"{time.time():.6f} pid={os.getpid()} uid={os.getuid()} py "
                          f"job={job} {_NAMES[level]} {text}\n")


def _append_debug_log(line: str) -> None:
    """Append to the admin's ``debug_log=`` file, never through a symlink and never blocking
    (a FIFO there must not hang a prolog): only a regular file is written to (the C glue
    says in slurmd's log when it refuses one)."""
    try:
        fd = os.open(_debug_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, DEBUG_LOG_MODE)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if st.st_mode & ~DEBUG_LOG_MODE & 0o7777 and st.st_uid == 0:  # 0644 of old
                os.fchmod(fd, st.st_mode & DEBUG_LOG_MODE)
            os.write(fd, line.encode("utf-8", "replace"))
    except OSError:
        pass
    finally:
        os.close(fd)
