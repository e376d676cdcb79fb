# SPDX-License-Identifier: GPL-2.0-or-later
"""A daemon's caps and a job's lease: what each job and each daemon is limited to.

A job's environment carries its own share (``limits``); a daemon's caps are re-applied
(``set_default_*`` for servers to come, ``set_*`` on running servers for new clients) when
jobs come and go.
"""

from typing import TYPE_CHECKING, Sequence

from gpushare.common.log import get_logger
from gpushare.node.mps.errors import MpsError
from gpushare.node.mps.limits import Limits, limits_for
from gpushare.node.mps.record import DaemonRecord, MpsLease, RecordStore

if TYPE_CHECKING:
    from gpushare.node.mps.daemon import Daemons

__all__ = ["apply", "lease", "limits"]

LOG = get_logger("gpushare.mps")


def limits(rec: DaemonRecord, shares: Sequence[int], mem_limit: str) -> Limits:
    """The limits of ``shares`` on ``rec``'s devices (one share: a job's; all: the daemon's)."""
    return limits_for(rec.mode, shares, [d.memory_total for d in rec.devices], mem_limit)


def apply(daemons: "Daemons", store: RecordStore, store_fd: int, rec: DaemonRecord) -> None:
    """Give a running daemon the caps of the jobs now in ``rec`` (already written).

    The record's ``caps`` says what the daemon was last told: that is what is compared
    (a failed change is retried by the next join or leave) and what ``gpushare mps``
    shows. A failure is logged, not raised: the jobs' own limits still hold.
    """
    caps = limits(rec, list(rec.jobs.values()), daemons.config.mem_limit)
    if caps == rec.caps:
        return
    from gpushare.node.mps import control  # only when the daemon is told something

    try:
        result = daemons.control(rec, [*control.default_cap_commands(caps), "get_server_list"])
        per_server = control.server_cap_commands(control.server_list(result), caps)
        if per_server:
            daemons.control(rec, per_server)
    except MpsError as err:
        LOG.warning("%s", err)
        return
    rec.caps = caps
    store.write(store_fd, rec)


def lease(rec: DaemonRecord, job_id: int, mem_limit: str) -> MpsLease:
    """What job ``job_id`` gets of daemon ``rec``: its share and its tasks' environment."""
    share = rec.jobs[str(job_id)]
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": rec.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": rec.log_dir,
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(rec.devices))),
    }
    env.update(limits(rec, [share], mem_limit).env(rec.mode))
    return MpsLease(
        job_id=job_id, key=rec.key, mode=rec.mode, uid=rec.uid, gid=rec.gid,
        pipe_dir=rec.pipe_dir, log_dir=rec.log_dir, devices=rec.devices,
        share_percent=share, daemon_pid=rec.daemon_pid, env=env,
    )
