# SPDX-License-Identifier: GPL-2.0-or-later
"""The node's MPS daemons as an administrator needs to see them (``gpushare mps``).

Each daemon record is checked against the node: is the recorded daemon alive and ours, do
the jobs it counts still have a gpushare record (their epilog has not run), did a stop
fail. Every problem says what to do. Nothing here takes a lock or changes state; reaping
is ``gpushare.node.reaper.reap_mps``, the same step a shared job's prolog takes.
"""

from __future__ import annotations

import pwd
from typing import Any, NamedTuple, Optional, Sequence

from gpushare.node.config import PluginConfig
from gpushare.node.mps import DaemonRecord, MpsManager
from gpushare.node.state import JobStore

__all__ = ["DaemonView", "exit_status", "inspect_daemons"]


class DaemonView(NamedTuple):
    """One MPS daemon key on the node, with its state in words."""

    key: str
    status: str  # running, changing, not running, stop failed, unknown, untracked, no record,
    #              unreadable
    mode: str = ""
    uid: Optional[int] = None
    user: str = ""
    devices: tuple[str, ...] = ()  # "GPU 0", "GPU 2 MIG 1g.10gb"
    device_uuids: tuple[str, ...] = ()
    jobs: tuple[tuple[str, int], ...] = ()  # (job id, share percent)
    stale_jobs: tuple[str, ...] = ()
    daemon_pid: Optional[int] = None
    started_at: Optional[float] = None
    cap_percent: Optional[int] = None
    mem_limits: tuple[tuple[str, str], ...] = ()  # (device index, size)
    pipe_dir: str = ""
    problems: tuple[str, ...] = ()
    gpu_indexes: tuple[int, ...] = ()  # NVML index of each device's (parent) GPU
    cgroup: str = ""  # where the running daemon runs (its cgroup v2 path), for its caps

    def to_dict(self) -> dict[str, Any]:
        data = self._asdict()
        data["devices"] = list(self.devices)
        data["device_uuids"] = list(self.device_uuids)
        data["jobs"] = {job: share for job, share in self.jobs}
        data["stale_jobs"] = list(self.stale_jobs)
        data["mem_limits"] = dict(self.mem_limits)
        data["problems"] = list(self.problems)
        data["gpu_indexes"] = list(self.gpu_indexes)
        return data


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _jobs(ids: Sequence[str]) -> str:
    return ("job " if len(ids) == 1 else "jobs ") + ", ".join(ids)


def _view(entry: dict[str, Any], job_ids: set[int], lost: set[int]) -> DaemonView:
    key = entry["key"]
    if entry["error"]:
        return DaemonView(key, "unreadable", problems=(entry["error"],))
    rec: DaemonRecord | None = entry["record"]
    if rec is None and entry["strays"]:
        pids = " ".join(map(str, entry["strays"]))
        return DaemonView(key, "untracked", problems=(
            f"MPS processes {pids} run in this daemon's directory, but gpushare has no "
            "record of them (its state was removed while they ran): they hold the GPU "
            "until ended; `gpushare mps --reap` stops them",))
    if rec is None and entry["busy"]:
        return DaemonView(key, "changing")  # a prolog or epilog holds its lock right now
    if rec is None:
        return DaemonView(key, "no record", problems=(
            "a directory or lock without a daemon record, left by a crash or an "
            "interrupted prolog; `gpushare mps --reap` removes it",))
    jobs = tuple(sorted(rec.jobs.items(), key=lambda item: int(item[0])))
    stale = tuple(job for job, _share in jobs if int(job) not in job_ids)
    gone = tuple(job for job, _share in jobs if int(job) in lost and job not in stale)
    pid = rec.daemon_pid
    problems = []
    if rec.stop_failed:
        status = "stop failed"
        problems.append(f"{rec.stop_failed}; once the GPU is fixed, `gpushare mps --reap` "
                        "stops it again")
    elif entry["running"] is None:
        status = "unknown"
    elif entry["running"]:
        status = "running"
    elif entry["busy"]:
        status = "changing"  # being started or stopped under its lock right now
    else:
        status = "not running"
        live = [job for job, _share in jobs if job not in stale and job not in gone]
        if live:
            problems.append(f"daemon pid {pid or 'unknown'} is gone while it serves "
                            f"{_jobs(live)}: CUDA calls there fail until the job is requeued "
                            "(`scontrol requeue <job>`, a batch job) or ends; the next job on "
                            "this device starts a new daemon")
    if stale:
        problems.append(f"the daemon still counts {_jobs(stale)}, gone without a gpushare "
                        "record (no epilog ran); `gpushare mps --reap` drops such references "
                        "now, as the node's next shared job would")
    if gone:
        problems.append(f"slurmctld no longer runs {_jobs(gone)} on this node, yet the daemon "
                        "still counts them (their epilog was lost); `gpushare mps --reap` "
                        "drops them now, as the node's next shared job would within "
                        "minutes")
    devices = rec.devices
    cgroup = ""
    if status == "running" and pid:
        from gpushare.node.mps.isolation import cgroup_of

        cgroup = cgroup_of(pid)
    return DaemonView(
        key=key, status=status, mode=rec.mode, uid=rec.uid, user=_user_name(rec.uid),
        devices=tuple(d.label or f"GPU {d.gpu_index}" for d in devices),
        device_uuids=tuple(d.uuid for d in devices),
        jobs=jobs, stale_jobs=stale + gone, daemon_pid=pid, started_at=rec.started_at,
        # What the daemon was last told (a failed change shows until the next one works).
        cap_percent=None if rec.caps is None else rec.caps.percent,
        mem_limits=() if rec.caps is None else tuple(sorted(rec.caps.mem)),
        pipe_dir=rec.pipe_dir, problems=tuple(problems),
        gpu_indexes=tuple(d.gpu_index for d in devices), cgroup=cgroup,
    )


def inspect_daemons(config: PluginConfig, check_processes: bool = True,
                    lost: set[int] | None = None) -> list[DaemonView]:
    """Every MPS daemon key under the state directory. ``check_processes`` needs root: only
    root can read another user's /proc environ, which tells a daemon from a stranger.
    ``lost``: jobs slurmctld no longer runs on this node (``gpushare.node.reaper.lost_jobs``)."""
    entries = MpsManager(config).snapshot(check_processes=check_processes)
    # Job records are listed after the daemon records are read: a prolog writes its job's
    # record before the daemon's record names the job, so a job just starting is never
    # taken for one whose epilog never ran.
    job_ids = set(JobStore(config.state_dir).job_ids())
    return [_view(entry, job_ids, lost or set()) for entry in entries]


def exit_status(views: list[DaemonView]) -> int:
    """0 when every daemon is as it should be, 1 when one needs an administrator."""
    return 1 if any(view.problems for view in views) else 0
