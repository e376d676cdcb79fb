# SPDX-License-Identifier: GPL-2.0-or-later
"""Install the stand-in where root may run it, create test users, set faults, clean up.

Shared by the unit tests, the Slurm tests and ``bench/bench_mps.py``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import select
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Optional

import procfs

HERE = os.path.dirname(os.path.abspath(__file__))
# One program, as NVIDIA's: the client and servers (front.c) and the daemon (daemon.c and
# the files daemon.h names).
SOURCES = tuple(os.path.join(HERE, name) for name in (
    "front.c", "daemon.c", "daemon_text.c", "daemon_state.c", "daemon_servers.c",
    "daemon_commands.c"))
CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")
PROGRAM_NAME = "nvidia-cuda-mps-control"
TEST_USERS = ("gpushare-u1", "gpushare-u2")
FAULTS = ("die_start", "hang_start", "slow_start", "die_after_start", "ignore_quit",
          "ignore_term", "hang_client", "no_pid_file")


@functools.cache
def _built_front() -> bytes:
    """The program compiled once per process and kept in memory (every install writes a
    copy), so no build directory is left in the temp directory."""
    with tempfile.TemporaryDirectory(prefix="gpushare-standin-build-") as tmp:
        out = os.path.join(tmp, PROGRAM_NAME)
        built = subprocess.run(["cc", *CFLAGS, "-o", out, *SOURCES],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"cannot build the MPS stand-in: {built.stderr}")
        with open(out, "rb") as handle:
            return handle.read()


def install_standin(bindir: str) -> str:
    """Put the stand-in into ``bindir`` as nvidia-cuda-mps-control; its path.

    The program is 0755 and owned by whoever runs this (root for the plugin, which
    refuses a program others could replace).
    """
    program = os.path.join(bindir, PROGRAM_NAME)
    with open(program, "wb") as handle:
        handle.write(_built_front())
    os.chmod(program, 0o755)
    return program


def unusable_reason() -> Optional[str]:
    """Why the stand-in cannot be run for other users here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (runs daemons as test users)"
    if shutil.which("cc") is None:
        return "needs a C compiler (cc) for the stand-in"
    if shutil.which("useradd") is None and any(not _user_exists(n) for n in TEST_USERS):
        return "needs useradd to create the test users"
    return None


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def ensure_users(names: tuple[str, ...] = TEST_USERS) -> list[pwd.struct_passwd]:
    """Create system users without home or login shell if missing (idempotent)."""
    for name in names:
        if not _user_exists(name):
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--user-group",
                 "--shell", "/usr/sbin/nologin", name],
                check=True, capture_output=True,
            )
    return [pwd.getpwnam(name) for name in names]


def traversable_tmpdir(prefix: str = "gpushare-test-") -> str:
    """A root-owned 0755 directory under /tmp that every user can traverse."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(path, 0o755)
    return path


class StandinInstall:
    """A root-owned copy of the stand-in (as the plugin requires) with its faults file."""

    def __init__(self, base: str) -> None:
        self.bindir = os.path.join(base, "bin")
        os.mkdir(self.bindir, 0o755)
        os.chmod(self.bindir, 0o755)
        self.program = install_standin(self.bindir)
        self.fault_file = os.path.join(self.bindir, "faults")

    def set_faults(self, *names: str) -> None:
        for name in names:
            if name not in FAULTS:
                raise ValueError(f"unknown stand-in fault {name}; known: {', '.join(FAULTS)}")
        with open(self.fault_file, "w") as handle:
            handle.write("\n".join(names) + "\n")
        os.chmod(self.fault_file, 0o644)

    def clear_faults(self) -> None:
        if os.path.exists(self.fault_file):
            os.unlink(self.fault_file)

    def processes(self) -> list[int]:
        """Pids of live processes running this copy of the stand-in."""
        return standin_processes(self.program)

    def kill_all(self) -> list[int]:
        """SIGKILL every process of this copy until none is left (test cleanup); returns
        every pid it killed.

        Looked for again once those are gone: one killed while it forked (``-d`` forks
        twice) can leave a child the scan before could not see, which would outlive the
        test that started it.
        """
        killed: list[int] = []
        deadline = time.monotonic() + 30
        while True:
            pids = self.processes()
            if not pids:
                return killed
            if time.monotonic() > deadline:
                raise RuntimeError(f"stand-in processes survive SIGKILL: {pids}")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
            for pid in pids:
                _wait_exited(pid, deadline)


def _wait_exited(pid: int, deadline: float) -> None:
    """Wait until ``pid`` (not a child of ours) has exited or ``deadline`` passes: woken
    by the exit through a pidfd; without pidfds (kernels before 5.3), looked at every
    10 ms."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.poll(max(0, int((deadline - time.monotonic()) * 1000)))
    finally:
        os.close(pidfd)


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is neither a zombie nor dead (``X``): what the tests mean
    by a process that is still there."""
    return not procfs.ended(pid)


def standin_processes(program: str) -> list[int]:
    """Pids of live (not zombie) processes running ``program``: daemons, servers, clients."""
    wanted = program.encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z" and wanted in argv[:2]:
            pids.append(int(name))
    return pids


class StandinBed:
    """A traversable temp dir holding the stand-in and a state dir, with the plugin's
    config for them (``cgroup``: its mps_cgroup=)."""

    def __init__(self, cgroup: str = "none") -> None:
        from gpushare.node.config import PluginConfig

        self.base = traversable_tmpdir()
        self.standin = StandinInstall(self.base)
        self.config = PluginConfig(state_dir=os.path.join(self.base, "state"),
                                   mps_control=self.standin.program, timeout=2.0,
                                   mps_cgroup=cgroup)

    def manager(self):  # -> gpushare.node.mps.MpsManager
        from gpushare.node.mps import MpsManager

        return MpsManager(self.config, lock_timeout=60)

    def close(self) -> None:
        leftovers = self.standin.kill_all()
        shutil.rmtree(self.base)
        assert leftovers == [], f"stand-in processes left running: {leftovers}"
