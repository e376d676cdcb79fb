# SPDX-License-Identifier: GPL-2.0-or-later
"""Jobs whose epilog never came: found (their records against what slurmctld still runs on
the node) and undone (their MPS references dropped, their records removed), by the next
prolog or at once by ``gpushare mps --reap``."""

import contextlib
import os
import time
from typing import TYPE_CHECKING, Callable, Optional

from gpushare.common.log import get_logger
from gpushare.node.config import PluginConfig
from gpushare.node.mps import MpsManager
from gpushare.node.phases import time_left
from gpushare.node.state import LOCK_SUFFIX, JobStore

if TYPE_CHECKING:
    from typing import Collection, Iterable

__all__ = ["SLURM_CHECKED", "SLURM_CHECK_INTERVAL", "SLURM_CHECK_TIMEOUT", "alive", "forget",
           "lost_jobs", "reap_mps"]

log = get_logger("gpushare.job")

# How often a prolog asks slurmctld which jobs still run on its node (one squeue). A lost
# epilog is rare; its job's share is given back within this time, or at once by
# `gpushare mps --reap`.
SLURM_CHECK_INTERVAL = 300.0
SLURM_CHECK_TIMEOUT = 2.0  # seconds squeue may take before the prolog goes on without it
SLURM_CHECKED = "slurm-checked"  # its mtime: when this node last asked


def lost_jobs(config: PluginConfig, store: JobStore, node: str, exclude: "Iterable[int]" = (),
              force: bool = False, squeue: Optional[str] = None) -> set[int]:
    """Jobs with a gpushare record on this node that slurmctld no longer runs here: their
    epilog will never come (slurmd was killed between the job's end and its epilog), or
    could not undo them (a plugstack line or state directory it refused). A job with only
    its tasks' file or lock (``JobStore.leftover_ids``: its prolog failed before its
    record, or it shares nothing) counts too: nothing else would ever remove them.

    The records are listed before slurmctld is asked, so a job starting meanwhile is never
    taken for a lost one. Nothing is lost when slurmctld cannot answer. Without ``force``
    slurmctld is asked at most once per SLURM_CHECK_INTERVAL per node.
    """
    recorded = (set(store.job_ids()) | set(store.leftover_ids())) - set(exclude)
    if not recorded:
        # No other job here, so none is lost: as good as slurmctld's answer, and the date
        # the tickets this prolog leaves need (gpushare.node.ticket).
        _check_due(config.state_dir)
        return set()
    if not (force or _check_due(config.state_dir)):
        return set()
    from gpushare.node import slurm_jobs  # only when asking: most prologs do not

    # Bounded well below timeout=: a prolog must not wait long on a slow slurmctld for an
    # answer that only tidies up; the next interval asks again.
    running = slurm_jobs.jobs_on_node(node, time_left(min(config.timeout, SLURM_CHECK_TIMEOUT)),
                                      squeue or slurm_jobs.SQUEUE)
    if running is None:
        log.warning("cannot ask slurmctld which jobs run on %s (squeue failed): jobs whose "
                    "epilog was lost stay counted until it answers", node)
        return set()
    lost = recorded - running
    for job_id in sorted(lost):
        log.info("job %d has a gpushare record on %s but slurmctld no longer runs it here "
                 "(its epilog was lost): reaping it", job_id, node)
    return lost


def _check_due(state_dir: str) -> bool:
    """True (and the time noted) when this node last asked slurmctld long enough ago."""
    path = os.path.join(state_dir, SLURM_CHECKED)
    try:
        if time.time() - os.lstat(path).st_mtime < SLURM_CHECK_INTERVAL:
            return False
    except FileNotFoundError:
        pass
    # The state directory is root's (JobStore checked it); O_NOFOLLOW refuses a link.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        # No state directory yet (no shared job since boot, or `gpushare mps` given
        # another node's): nothing recorded, so nothing to note the time for.
        return True
    try:
        os.utime(fd)
    finally:
        os.close(fd)
    return True


def alive(store: JobStore, lost: "Collection[int]" = ()) -> Callable[[int], bool]:
    """Whether a job still runs here: its record outlives its epilog, unless slurmctld says
    the job is gone (``lost``). Only the record's presence is asked: each prolog asks it
    for every job on the node."""
    return lambda job_id: job_id not in lost and store.exists(job_id)


def forget(store: JobStore, lost: "Iterable[int]") -> None:
    """Remove what a lost job's epilog would have: its record and its prolog's lock file."""
    for job_id in lost:
        store.remove(job_id)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(store.path(job_id, LOCK_SUFFIX))


def reap_mps(config: PluginConfig, node: str) -> tuple[list[str], set[int]]:
    """Do now what the node's next shared job's prolog does first: drop MPS references of
    jobs without a record or that slurmctld no longer runs on ``node``, and stop the
    daemons left without jobs (``gpushare mps --reap``); also stop MPS processes whose
    daemon directory has lost its record.

    Returns the keys of the daemons stopped and the lost jobs forgotten; MpsError names
    any daemon that cannot be stopped.
    """
    if not os.path.isdir(config.state_dir):
        return [], set()  # no job has shared a GPU here since boot: nothing to reap
    store = JobStore(config.state_dir)
    lost = lost_jobs(config, store, node, force=True)
    stopped = MpsManager(config).reap_stale(alive(store, lost), strays=True)
    forget(store, lost)
    return stopped, lost


