# SPDX-License-Identifier: GPL-2.0-or-later
"""A real systemd, booted as PID 1 of a node of its own on this host, for the tests of what
gpushare does where systemd runs the node (a transient scope for each user's MPS daemon).

The node is a set of namespaces (PID, mount, cgroup, UTS, IPC; the network is the host's,
so a slurmd inside reaches a slurmctld outside on localhost): a private ``/run``, the
cgroup v2 hierarchy mounted at ``/sys/fs/cgroup`` with a cgroup of this host's own as its
root, ``/proc/sys`` and ``/sys`` read-only, and ``/lib/systemd/systemd`` started with a unit
path of one directory holding one empty target, so that it runs only what the tests ask
of it (transient units, through ``systemd-run``) and none of the distribution's units
(``systemd-tmpfiles-setup.service`` alone would empty the host's ``/tmp``). A transient
service needs ``DefaultDependencies=no``: the targets it would order itself after are
not there. Stopping it kills its PID 1, and with it every process of the node; its cgroups
go after. In a root whose cgroups are hidden (``tests/release_root.py``) it mounts the
cgroup v2 hierarchy on a directory of its own for as long as it runs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from typing import Optional, Sequence

from gpushare.node.mps.isolation import cgroup2_mount

__all__ = ["SystemdNode", "unusable_reason"]

SYSTEMD = "/lib/systemd/systemd"
TARGET = "gpushare-test.target"
UNIT_DIR = "/run/gpushare-test-units"


def unusable_reason() -> Optional[str]:
    """Why no systemd node can boot here, or None."""
    if os.geteuid() != 0:
        return "booting systemd in namespaces needs root"
    for program in (SYSTEMD, "/usr/bin/systemd-run", "/usr/bin/systemctl"):
        if not os.access(program, os.X_OK):
            return f"{program} is not installed (Debian's systemd package)"
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare and nsenter (util-linux) are not installed"
    with open("/proc/filesystems", encoding="ascii") as handle:
        if "cgroup2" not in handle.read().split():
            return "this kernel has no cgroup v2"
    return None


class SystemdNode:
    """One booted systemd; ``run`` executes a command inside its namespaces."""

    def __init__(self) -> None:
        mount = cgroup2_mount()
        self._own_mount = ""
        if mount is None:  # a root whose cgroups are hidden (tests/release_root.py)
            self._own_mount = mount = tempfile.mkdtemp(prefix="gpushare-test-cgroup2-")
            subprocess.run(["mount", "-t", "cgroup2", "cgroup2", mount], check=True)
        self.cgroup = os.path.join(mount, f"gpushare-test-systemd-{uuid.uuid4().hex[:8]}")
        self.pid = 0  # PID 1 of the node, as this host numbers it
        self._launcher: Optional[subprocess.Popen[bytes]] = None

    def start(self, timeout: float = 60.0) -> SystemdNode:
        try:
            os.mkdir(self.cgroup, 0o755)
        except BaseException:
            self.stop()
            raise
        boot = (
            "set -e\n"
            # Nothing of the node writes the host's kernel settings or devices.
            "mount --bind /proc/sys /proc/sys\n"
            "mount -o remount,bind,ro /proc/sys\n"
            "mount --bind /sys /sys\n"
            "mount -o remount,bind,ro /sys\n"
            "mount -t cgroup2 cgroup2 /sys/fs/cgroup\n"
            "mount -t tmpfs -o mode=0755 tmpfs /run\n"
            f"mkdir -p {UNIT_DIR}\n"
            f"printf '[Unit]\\nDescription=gpushare tests\\n' > {UNIT_DIR}/{TARGET}\n"
            # Only the units of this directory (and transient ones) exist: none of the
            # distribution's (sysinit.target's tmpfiles would empty the host's /tmp).
            f"exec env -i container=gpushare-test SYSTEMD_UNIT_PATH={UNIT_DIR} {SYSTEMD} "
            f"--unit={TARGET} --log-target=console --log-level=warning\n")
        # The launcher enters the node's cgroup before unshare makes it the new root.
        script = (f"echo $$ > {self.cgroup}/cgroup.procs && exec unshare --pid --fork "
                  "--mount --cgroup --uts --ipc --mount-proc --propagation private "
                  f"/bin/sh -c {shlex.quote(boot)}")
        self._launcher = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            self._wait_running(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self._launcher is not None and self._launcher.poll() is not None:
                raise RuntimeError(f"systemd exited at boot: {self._stderr()}")
            if not self.pid:
                self.pid = self._find_pid1()
            if self.pid:
                result = self.run(["systemctl", "is-system-running"], check=False)
                state = result.stdout.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"systemd not running after {timeout:g} s (state {state!r}): "
                           f"{self._stderr()}")

    def _find_pid1(self) -> int:
        try:
            with open(os.path.join(self.cgroup, "init.scope", "cgroup.procs")) as handle:
                pids = [int(word) for word in handle.read().split()]
        except OSError:
            return 0
        return pids[0] if pids else 0

    def _stderr(self) -> str:
        if self._launcher is None or self._launcher.poll() is None or not self._launcher.stderr:
            return ""
        return self._launcher.stderr.read().decode(errors="replace")[-2000:]

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 60.0,
            env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as root inside the node (its PID 1's namespaces and root)."""
        result = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-C", "-u", "-i", "-r", "-w", "--",
             *argv],
            capture_output=True, text=True, timeout=timeout,
            env=env if env is not None else dict(os.environ))
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in the systemd node exited "
                               f"{result.returncode}: {result.stdout}{result.stderr}")
        return result

    def units(self, pattern: str) -> list[str]:
        """The names of the node's loaded units matching ``pattern``."""
        listed = self.run(["systemctl", "list-units", "--all", "--plain", "--no-legend",
                           "--no-pager", pattern]).stdout
        return [line.split()[0] for line in listed.splitlines() if line.strip()]

    def stop(self) -> None:
        """Kill the node's PID 1 (the kernel then kills all its processes) and remove its
        cgroups."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self._launcher is not None:
            try:
                self._launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._launcher.kill()
                self._launcher.wait()
        deadline = time.monotonic() + 30
        while os.path.isdir(self.cgroup) and time.monotonic() < deadline:
            for dirpath, _dirs, _files in sorted(os.walk(self.cgroup),
                                                 key=lambda entry: -len(entry[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
            time.sleep(0.1)
        if self._own_mount:
            subprocess.run(["umount", self._own_mount], check=False)
            with contextlib.suppress(OSError):
                os.rmdir(self._own_mount)

    def __enter__(self) -> SystemdNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

