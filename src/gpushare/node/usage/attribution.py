# SPDX-License-Identifier: GPL-2.0-or-later
"""Which job a process on a GPU belongs to.

First through its cgroup, which the kernel keeps and no user can choose: Slurm puts a
job's tasks below ``.../job_<id>/`` (cgroup v1 ``/slurm/uid_<uid>/job_<id>``, v2
``.../slurmstepd.scope/job_<id>``), and from 26.05 names that directory by the job's SLUID
instead, which the job's own slurmstepd (root's, in the same directory) maps back: its
process title is ``slurmstepd: [<job id>.<step>]``. The job's directory must be root's in
the cgroup file system: one of that name that a user made (below their systemd-delegated
cgroup, which is theirs) counts for nothing.

Then, where tasks are not in job cgroups (``proctrack/linuxproc``), through the MPS daemon
the process is a client of (``CUDA_MPS_PIPE_DIRECTORY``), and last ``SLURM_JOB_ID``: both
come from the process's own environment, which its user writes. So every answer is held
against what gpushare knows of the job: the process's real uid must be the job's, and an
answer from the environment must also name a job holding the device. A user can at most
charge their own process to another of their own jobs on that device, never to someone
else's job.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

__all__ = ["Attributor", "JobInfo"]

_SLURM_CGROUP = re.compile(
    r"/(?:slurmstepd\.scope|slurm[^/]*/uid_(\d+))/job_([A-Za-z0-9]+)(?:/|$)")
_STEPD_TITLE = re.compile(rb"slurmstepd: \[([0-9]+)[.\]]")


class JobInfo:
    """What gpushare knows of a running job on this node: its owner, its devices (UUIDs,
    MIG slices and whole GPUs) and its MPS daemon's pipe directory ("" without one)."""

    __slots__ = ("devices", "job_id", "pipe_dir", "uid", "user")

    def __init__(self, job_id: int, uid: int, user: str, devices: list[dict[str, Any]],
                 pipe_dir: str = "") -> None:
        self.job_id, self.uid, self.user = job_id, uid, user
        self.devices, self.pipe_dir = devices, pipe_dir

    def holds(self, uuid: str) -> bool:
        return any(device.get("uuid") == uuid for device in self.devices)


class Attributor:
    """Answers ``job_of(pid, device uuid)`` for one sampling round (``/proc`` is read once
    per process; the SLUID map once a round, and only when a SLUID cgroup is met)."""

    def __init__(self, jobs: dict[int, JobInfo], proc_root: str = "/proc",
                 cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.jobs, self.proc_root, self.cgroup_root = jobs, proc_root, cgroup_root
        self._sluids: Optional[dict[str, int]] = None
        self.how: dict[int, str] = {}  # pid -> cgroup | mps | environ (for tests and logs)

    def _read(self, pid: int, name: str, limit: int = 1 << 16) -> bytes:
        try:
            fd = os.open(f"{self.proc_root}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return b""
        try:
            return os.read(fd, limit)
        except OSError:
            return b""
        finally:
            os.close(fd)

    def owner(self, pid: int) -> Optional[int]:
        """The real uid of a live process; None when gone or a zombie."""
        status = self._read(pid, "status")
        state = re.search(rb"^State:\s+([A-Z])", status, re.MULTILINE)
        uid = re.search(rb"^Uid:\s+(\d+)", status, re.MULTILINE)
        if not state or state.group(1) in (b"Z", b"X") or not uid:
            return None
        return int(uid.group(1))

    def cgroup_job(self, pid: int) -> Optional[int]:
        """The job whose Slurm cgroup holds ``pid``; None outside one."""
        for line in self._read(pid, "cgroup").decode(errors="replace").splitlines():
            match = self._slurm_cgroup(line)
            if not match:
                continue
            uid, name = match.group(1), match.group(2)
            if uid is not None and self.owner(pid) != int(uid):
                return None
            if name.isdigit():
                return int(name)
            return self.sluid_map().get(name)
        return None

    def _slurm_cgroup(self, line: str) -> Optional[re.Match[str]]:
        """The Slurm job cgroup in one ``/proc/<pid>/cgroup`` line, if its directory is
        root's (v2 ``0::<path>``; v1 ``<n>:<controllers>:<path>``, below the mount of its
        first controller)."""
        _hier, controllers, path = [*line.split(":", 2), "", ""][:3]
        match = _SLURM_CGROUP.search(path)
        if not match:
            return None
        mount = controllers.split(",")[0].replace("name=", "")
        job_dir = os.path.join(self.cgroup_root, mount, path[:match.end(2)].lstrip("/"))
        try:
            return match if os.lstat(job_dir).st_uid == 0 else None
        except OSError:  # gone, or not seen from here
            return None

    def sluid_map(self) -> dict[str, int]:
        """SLUID -> job id, from the root-owned slurmstepd processes in SLUID cgroups."""
        if self._sluids is None:
            self._sluids = {}
            for name in os.listdir(self.proc_root):
                if name.isdigit() and self.owner(int(name)) == 0:
                    self._learn_sluid(int(name))
        return self._sluids

    def _learn_sluid(self, pid: int) -> None:
        assert self._sluids is not None
        cgroups = self._read(pid, "cgroup").decode(errors="replace")
        match = next(filter(None, map(self._slurm_cgroup, cgroups.splitlines())), None)
        if not match or match.group(2).isdigit():
            return
        try:
            exe = os.readlink(f"{self.proc_root}/{pid}/exe")
        except OSError:
            return
        if os.path.basename(exe) != "slurmstepd":
            return
        title = _STEPD_TITLE.match(self._read(pid, "cmdline", 4096))
        if title:
            self._sluids[match.group(2)] = int(title.group(1))

    def _environ(self, pid: int) -> dict[str, str]:
        found = {}
        for item in self._read(pid, "environ", 1 << 20).split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep and key in (b"CUDA_MPS_PIPE_DIRECTORY", b"SLURM_JOB_ID"):
                found[key.decode()] = value.decode(errors="replace")
        return found

    def job_of(self, pid: int, uuid: str) -> Optional[int]:
        """The job ``pid`` (running on device ``uuid``) is charged to; None when no job of
        this node can be held to it."""
        uid = self.owner(pid)
        if uid is None:
            return None
        job_id = self.cgroup_job(pid)
        if job_id is not None:
            job = self.jobs.get(job_id)
            if job is not None and job.uid != uid:
                return None
            self.how[pid] = "cgroup"
            return job_id
        env = self._environ(pid)
        mine = [job for job in self.jobs.values() if job.uid == uid and job.holds(uuid)]
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
        served = [job for job in mine if pipe and job.pipe_dir == pipe]
        named = env.get("SLURM_JOB_ID", "")
        if len(served) == 1:
            self.how[pid] = "mps"
            return served[0].job_id
        for job in served or mine:
            if named == str(job.job_id):
                self.how[pid] = "mps" if served else "environ"
                return job.job_id
        return None
