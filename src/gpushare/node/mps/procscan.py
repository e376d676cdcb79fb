# SPDX-License-Identifier: GPL-2.0-or-later
"""Finding MPS processes through ``/proc``: a daemon and its servers are told from anything
else by their uid, their ``CUDA_MPS_PIPE_DIRECTORY`` and the program the kernel runs for
them (``/proc/<pid>/exe``, never their argv). This is the one definition of "the daemon"."""

import os
import re
from typing import Optional

from gpushare.node.mps.record import KEY_PATTERN

SERVER_PROGRAM = "nvidia-cuda-mps-server"


class ProcScan:
    """Looks at the processes of ``proc_root`` for the MPS program ``program`` (the
    configured control daemon; its server is the program beside it), whose daemons have
    their pipe directories in ``mps_dir``."""

    def __init__(self, proc_root: str, program: str, mps_dir: str) -> None:
        self.proc_root = proc_root
        self.program = program
        self.mps_dir = mps_dir

    def programs(self) -> set[str]:
        path = self.program
        real = os.path.realpath(path)
        return {path, real, os.path.join(os.path.dirname(real), SERVER_PROGRAM),
                os.path.join(os.path.dirname(path), SERVER_PROGRAM)}

    def read(self, pid: int, name: str) -> Optional[bytes]:
        """A /proc file's bytes (at most 1 MiB), or None when the process is gone.

        Read with plain os.read: a daemon's stop reads every process's status, and a
        buffered read sized for the largest environ cost more than the kernel's work.
        """
        try:
            fd = os.open(f"{self.proc_root}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            chunks = []
            size = 0
            while size < 1 << 20:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)[:1 << 20]
        except OSError:
            return None
        finally:
            os.close(fd)

    def live_status(self, pid: int) -> Optional[bytes]:
        """``/proc/<pid>/status`` of a live process; None when it is gone or a zombie."""
        status = self.read(pid, "status")
        state = re.search(rb"^State:\s+([A-Z])", status or b"", re.MULTILINE)
        if not state or state.group(1) in (b"Z", b"X"):
            return None
        return status

    def start_time(self, pid: int) -> Optional[str]:
        """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22):
        with the pid, it names one process for good."""
        stat = self.read(pid, "stat")
        fields = stat.rsplit(b")", 1)[-1].split() if stat else []
        if len(fields) <= 19 or fields[0] in (b"Z", b"X"):
            return None  # a zombie is gone: nothing may be signalled or joined through it
        return fields[19].decode()

    def alive(self, pid: int) -> bool:
        return self.live_status(pid) is not None

    def is_ours(self, pid: int, uid: int, pipe_dir: str, daemon_only: bool = False) -> bool:
        """True when ``pid`` is a live MPS daemon/server of user ``uid`` and ``pipe_dir``."""
        if pid <= 1:
            return False
        # One read answers both "alive" and "whose": this runs for every process on the
        # node when a daemon stops.
        status = self.live_status(pid)
        if status is None:
            return False
        uid_line = re.search(rb"^Uid:\s+(\d+)", status, re.MULTILINE)
        if not uid_line or int(uid_line.group(1)) != uid:
            return False
        environ = (self.read(pid, "environ") or b"").split(b"\0")
        if ("CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir).encode() not in environ:
            return False
        programs = {self.program, os.path.realpath(self.program)}
        if not daemon_only:
            programs = self.programs()
        return self.runs_one_of(pid, programs)

    def runs_one_of(self, pid: int, programs: set[str]) -> bool:
        """Whether ``pid`` runs one of ``programs``, by what the kernel executes (its
        ``/proc`` exe): argv is the process's own to write (``exec -a``) and says nothing."""
        try:
            exe = os.readlink(os.path.join(self.proc_root, str(pid), "exe"))
        except OSError:
            return False
        return exe in programs

    def leftovers(self, uid: int, pipe_dir: str) -> list[int]:
        """Live processes that are a daemon or its servers (by uid, pipe dir, program)."""
        pids = []
        for name in os.listdir(self.proc_root):
            if name.isdigit() and self.is_ours(int(name), uid, pipe_dir):
                pids.append(int(name))
        return pids

    def strays(self, key: Optional[str] = None) -> dict[str, list[int]]:
        """Live MPS processes (the configured program or its server) whose pipe directory
        is one of this node's daemon directories, by key (only ``key``'s when given).

        Whether a record claims them is for the caller: for a key with a record they are
        simply its daemon and servers.
        """
        prefix = f"CUDA_MPS_PIPE_DIRECTORY={self.mps_dir}/".encode()
        programs = self.programs()
        found: dict[str, list[int]] = {}
        for name in os.listdir(self.proc_root):
            if not name.isdigit() or int(name) <= 1:
                continue
            pid = int(name)
            environ = self.read(pid, "environ") or b""
            if prefix not in environ:
                continue
            var = next((v for v in environ.split(b"\0") if v.startswith(prefix)), b"")
            found_key, sep, rest = var[len(prefix):].decode(errors="replace").partition("/")
            if (rest != "pipe" or not sep or not re.match(KEY_PATTERN, found_key)
                    or (key is not None and found_key != key)):
                continue
            if self.live_status(pid) is not None and self.runs_one_of(pid, programs):
                found.setdefault(found_key, []).append(pid)
        return found

    def owner(self, pid: int) -> Optional[tuple[int, int]]:
        """The real uid and gid of a live process; None when it is gone."""
        status = self.live_status(pid) or b""
        uid = re.search(rb"^Uid:\s+(\d+)", status, re.MULTILINE)
        gid = re.search(rb"^Gid:\s+(\d+)", status, re.MULTILINE)
        if not (uid and gid):
            return None
        return int(uid.group(1)), int(gid.group(1))
