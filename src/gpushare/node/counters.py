# SPDX-License-Identifier: GPL-2.0-or-later
"""Event counters the plugin keeps in the node's state directory, for ``gpushare metrics``.

Every job_prolog and job_epilog runs in a fresh interpreter, so nothing can be kept in
memory between jobs. The callback notes what happened while it runs (``note``: a list
append, well under a microsecond) and ``count`` writes it all in one step at the end:
the callback's result, its duration in a histogram, and the notes. That step locks
``<state_dir>/counters.json`` (``flock``), reads it, adds and rewrites it in place: tens
of microseconds, during which another callback's count or a ``gpushare metrics`` read
waits. The state directory outlives slurmd restarts and
is cleared at boot (``/run``), so the values are counters since boot, as Prometheus
expects.

Labels are bounded: refusals and failures are counted by a reason from the fixed sets
below, derived from the message (never a job id or a user's text). Counting must never
fail or slow a job: any error is logged at debug level and dropped.

A prolog or epilog the C glue finishes without an interpreter (a job joining its user's
running daemon with a join ticket, or leaving it to other jobs, or an epilog with nothing
to undo) appends a line ``<prolog|epilog> <microseconds>`` to ``<state_dir>/counters.fast``
while it holds the same lock, and ``<prolog|epilog> failed <microseconds>`` for one that
failed before any Python ran (code it would load is not root's; the prolog's worker still
held the job); the next ``add`` folds those lines into the counters, as ended ``ok`` or
``failed``, and removes the file, and ``read`` counts them meanwhile. So each prolog and
epilog that gpushare takes up is counted once, whichever way it ends; a job without GPUs
or gpushare's options is counted at neither end.

This module is imported by the callbacks: it imports nothing the package docstring
keeps out of them.
"""

import fcntl
import json
import os
import time
from typing import Any, Optional

from gpushare.common.log import get_logger

LOG = get_logger("gpushare.counters")

FILE = "counters.json"
FAST_FILE = "counters.fast"  # the C glue's callbacks: "<prolog|epilog> <microseconds>"
# Root's alone (the C glue makes counters.fast so too): what the node's jobs did is for the
# admin, who reads it as root with ``gpushare metrics``.
MODE = 0o600
VERSION = 1

# Histogram bounds in seconds: a prolog takes tens of milliseconds, an MPS start more, a
# command that hangs up to the plugin's timeout=.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

CALLBACKS = ("prolog", "epilog")
RESULTS = ("ok", "refused", "failed")
REFUSAL_REASONS = ("invalid_share", "private_with_share", "private_without_gpu",
                   "share_without_gpu", "share_on_several_gpus", "share_with_whole_gpus",
                   "share_mismatch", "user_daemon", "other")
DRAIN_REASONS = ("device_check", "verify_error", "plan", "no_device", "mps_start",
                   "mps_stop", "state_dir_full", "worker_timeout", "worker_killed",
                   "internal", "other")
TIMEOUTS = ("lock", "command", "daemon_start", "daemon_quit", "worker")
EVENTS = ("mps_daemon_starts", "mps_stop_failures", "mps_reaped_references")

# What a refusal's message starts with or holds (the UserErrors of gpushare.node.job), in order.
_REFUSALS = (
    ("--gpu-mps runs a private", "private_with_share"),
    ("--gpu-mps needs whole GPUs", "private_without_gpu"),
    ("got no GPU on this node", "share_without_gpu"),
    ("a share runs on one GPU", "share_on_several_gpus"),
    ("is invalid: give a whole percent", "invalid_share"),
    ("cannot be combined with whole GPUs", "share_with_whole_gpus"),
    ("ask for different shares", "share_mismatch"),
    ("the job's user ", "user_daemon"),  # MpsUserError: what they did to their own daemon
)
# The NodeErrors of gpushare.node.job, by the start of their message.
_FAILURES = (
    ("ownership plan ", "plan"),
    ("cannot verify the job's GPUs", "verify_error"),
    ("MPS for job ", "mps_start"),
    ("no space left in state_dir=", "state_dir_full"),
    ("prolog worker timed out", "worker_timeout"),
    ("epilog worker timed out", "worker_timeout"),
    ("prolog worker killed", "worker_killed"),
    ("epilog worker killed", "worker_killed"),
)

_notes: list[str] = []
_started: Optional[float] = None


def begin() -> None:
    """A callback starts: forget earlier notes, start its clock, accept notes."""
    global _started
    del _notes[:]
    _started = time.monotonic()


def note(series: str) -> None:
    """One event of this callback (a series key, see ``series``); ignored outside one."""
    if _started is not None:
        _notes.append(series)


def series(name: str, label: str = "") -> str:
    """The key of a counter series in the file: ``name`` or ``name:label-value``."""
    return f"{name}:{label}" if label else name


def refusal_reason(message: str) -> str:
    return next((reason for text, reason in _REFUSALS if text in message), "other")


def failure_reason(callback: str, message: str) -> str:
    """The bounded reason of a failed callback (a NodeError's message, "" for a crash)."""
    if not message:
        return "internal"
    for start, reason in _FAILURES:
        if message.startswith(start):
            return reason
    if "but NVML resolved none" in message:
        return "no_device"
    # What is left: a prolog's device check (verify=strict) or an epilog's daemon stop.
    return "device_check" if callback == "job_prolog" else "mps_stop"


def refused(message: str) -> None:
    """The job's request was refused (a UserError: the job fails, the node is fine)."""
    note(series("refusals_total", refusal_reason(message)))


def failed(callback: str, message: str) -> None:
    """The callback fails (a NodeError, "" for an internal error), which drains the node:
    gpushare drains it with its own reason, or Slurm with "Prolog error"/"Epilog error".
    (A plugstack line gpushare cannot parse names no state directory: nothing is counted.)"""
    note(series("drains_total", failure_reason(callback, message)))


def timed_out(what: str) -> None:
    note(series("timeouts_total", what))


def command_error(err: Exception) -> None:
    """An external command failed; a timeout among such failures is counted."""
    if type(err).__name__ == "CommandTimeout":
        timed_out("command")


def count(callback: str, rc: int, config: Any) -> int:
    """The callback ends with ``rc``: write its result, duration and notes; returns ``rc``."""
    global _started
    if _started is None:
        return rc
    elapsed = time.monotonic() - _started
    _started = None
    state_dir = getattr(config, "state_dir", "")
    kind = callback[4:] if callback.startswith("job_") else callback
    kind = kind.split("_", 1)[0]  # job_prolog_worker_lost: its worker's prolog, failed
    if not state_dir or kind not in CALLBACKS:
        return rc
    if rc != 0 or callback.endswith("_worker_lost"):  # a worker killed: its callback failed
        result = "failed"
    elif any(key.startswith("refusals_total:") for key in _notes):
        result = "refused"
    else:
        result = "ok"
    if rc != 0 and not any(key.startswith("drains_total:") for key in _notes):
        _notes.append(series("drains_total", "other"))
    updates = [series(f"{kind}s_total", result),
               series(f"{kind}_duration_bucket", _bucket(elapsed)),
               series(f"{kind}_duration_count"), *_notes]
    try:
        add(state_dir, updates, {series(f"{kind}_duration_sum_us"): int(elapsed * 1e6)})
    except (OSError, ValueError) as err:
        LOG.debug("counters not updated: %s", err)
    return rc


def _bucket(seconds: float) -> str:
    return next((str(i) for i, bound in enumerate(BUCKETS) if seconds <= bound),
                str(len(BUCKETS)))


def add(state_dir: str, keys: list[str], amounts: Optional[dict[str, int]] = None) -> None:
    """Add one per key (and ``amounts``) to the node's counters, under the file's lock,
    with the C glue's epilogs noted since the last time."""
    from gpushare.common import safefs  # the callbacks have it loaded already (gpushare.node.mps)

    dir_fd = safefs.open_root_dir(state_dir)
    try:
        fd = os.open(FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, MODE,
                     dir_fd=dir_fd)
        try:
            if os.fstat(fd).st_mode & 0o077:  # written 0644 by an earlier release
                os.fchmod(fd, MODE)
            fcntl.flock(fd, fcntl.LOCK_EX)
            values = _parse(_read_all(fd))
            fast = _fold_fast(values, dir_fd)
            for key in keys:
                values[key] = values.get(key, 0) + 1
            for key, amount in (amounts or {}).items():
                values[key] = values.get(key, 0) + amount
            data = json.dumps({"version": VERSION, "counters": values},
                              sort_keys=True).encode()
            # Rewritten in place, no rename or fsync (each costs more than all the rest on
            # a journaling file system): counts only grow, so the text never gets shorter
            # and a reader holding the shared lock sees the old text or the new, never a mix.
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            if fast:
                safefs.remove_file_at(dir_fd, FAST_FILE)
        finally:
            os.close(fd)  # releases the lock
    finally:
        os.close(dir_fd)


def _fold_fast(values: dict[str, int], dir_fd: int) -> bool:
    """Add the C glue's callbacks (``counters.fast``, lock held) to ``values``; True when
    there were any, so the caller removes the file once the sum is written."""
    from gpushare.common import safefs

    try:
        data = safefs.read_small_file_at(dir_fd, FAST_FILE, 16 << 20)
    except (OSError, safefs.UnsafePathError) as err:
        LOG.debug("%s not read: %s", FAST_FILE, err)
        return False
    if not data:
        return False
    for line in data.decode("ascii", "replace").splitlines():
        kind, _, text = line.partition(" ")
        result = "ok"
        if text.startswith("failed "):  # failed in C before any Python could count it
            result, text = "failed", text[len("failed "):]
        if kind not in CALLBACKS or not text.isdigit():
            continue
        micros = int(text)
        updates = [(series(f"{kind}s_total", result), 1),
                   (series(f"{kind}_duration_bucket", _bucket(micros / 1e6)), 1),
                   (series(f"{kind}_duration_count"), 1),
                   (series(f"{kind}_duration_sum_us"), micros)]
        if result == "failed":  # Slurm drains the node for it, or its worker fails the job
            updates.append((series("drains_total", "other"), 1))
        for key, amount in updates:
            values[key] = values.get(key, 0) + amount
    return True


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 16, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _parse(data: Optional[bytes]) -> dict[str, int]:
    """The counters of a file's bytes; a file of another version starts them over."""
    if not data:
        return {}
    try:
        loaded = json.loads(data.decode())
    except ValueError:
        LOG.warning("%s is not JSON; its counters start over", FILE)
        return {}
    if not isinstance(loaded, dict) or loaded.get("version") != VERSION:
        return {}
    values = loaded.get("counters")
    if not isinstance(values, dict):
        return {}
    return {str(k): int(v) for k, v in values.items() if isinstance(v, int)}


def read(state_dir: str) -> dict[str, int]:
    """The node's counters ({} before the first callback), read under a shared lock that
    is held for one read of a few kilobytes."""
    from gpushare.common import safefs

    try:
        dir_fd = safefs.open_root_dir(state_dir, create=False)
    except FileNotFoundError:
        return {}
    try:
        try:
            fd = os.open(FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return {}
        try:
            if os.fstat(fd).st_uid != 0:
                raise OSError(f"{os.path.join(state_dir, FILE)} is not owned by root; "
                              "remove it")
            fcntl.flock(fd, fcntl.LOCK_SH)
            values = _parse(_read_all(fd))
            _fold_fast(values, dir_fd)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    return values
