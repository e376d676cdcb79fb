# SPDX-License-Identifier: GPL-2.0-or-later
"""A daemon's processes: starting one as its user, telling it commands, stopping it and
its servers, finding them through /proc, and signalling only what is verified to be them.

A start that fails is charged to its cause (``blame``): the user's job fails when the
user's own processes or directories made it fail, and the node drains only when root's
probe shows the program or the GPUs cannot start a daemon at all.

Every wait here takes the time left of the worker's one deadline (``phases.time_left``)
when that is shorter than ``timeout=``, so the real cause is reported, never the C glue's
kill.
"""

import math
import os
import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from gpushare.common import proc, safefs
from gpushare.common.log import get_logger
from gpushare.node import counters
from gpushare.node.config import PluginConfig
from gpushare.node.mps.errors import MpsError
from gpushare.node.mps.record import DaemonRecord
from gpushare.node.mps.userdirs import UserDirs, check_control_at, exists_at
from gpushare.node.phases import Phases, time_left

if TYPE_CHECKING:
    import signal

    from gpushare.node.mps.procscan import ProcScan

__all__ = ["PID_FILE", "SOCKET_NAME_ROOM", "SOCKET_PATH_MAX", "Daemons"]

LOG = get_logger("gpushare.mps")

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
# Sockets in a pipe directory may have names a little longer than "control" (a daemon
# may bind under a temporary name first, as the stand-in does); this much is kept free.
SOCKET_NAME_ROOM = 4


class Daemons:
    """The MPS processes of this node's daemons (runs as root)."""

    def __init__(self, config: PluginConfig, dirs: UserDirs, proc_root: str = "/proc") -> None:
        self.config = config
        self.timeout = float(config.timeout)
        self.dirs = dirs
        self.proc_root = proc_root
        self._scan: Optional[ProcScan] = None

    @property
    def scan(self) -> "ProcScan":
        """The look at this node's MPS processes through ``proc_root``."""
        if self._scan is None:
            from gpushare.node.mps.procscan import ProcScan

            self._scan = ProcScan(self.proc_root, self.config.mps_control, self.dirs.mps_dir)
        return self._scan

    def program(self) -> str:
        """The configured daemon program, checked to be safe for root to hand to users."""
        path = self.config.mps_control
        try:
            safefs.check_root_owned_file(path)
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS control program refused: {err} (plugstack mps_control=)"
                           ) from None
        return path

    def control(self, rec: DaemonRecord, commands: list[str]) -> "proc.Result":
        """Send ``commands`` to the daemon as its user, within the time left."""
        from gpushare.node.mps import control

        return control.send(self.program(), rec, commands, time_left(self.timeout))

    # ----------------------------------------------------------------- start

    def start(self, rec: DaemonRecord, phases: Phases) -> None:
        """Start ``rec``'s daemon as its user in fresh directories, wait for its control
        socket and give it its caps. MpsUserError when its user made the start fail,
        MpsError when the node did."""
        from gpushare.common import proc
        from gpushare.node.mps import blame, control, isolation

        program = self.program()
        key = rec.key
        what = ", ".join(d.describe() for d in rec.devices)
        short = ", ".join(d.label or d.uuid for d in rec.devices)
        _check_socket_room(self.config.state_dir, rec, what, short)
        self.dirs.make(rec)
        phases.done("mps")
        # Half of what is left stays for root's probe, should this start fail.
        budget = min(time_left(self.timeout), time_left(math.inf) / 2)

        def failed(cause: str, detail: str) -> MpsError:
            # The daemon's directory goes with the failed start: its log's last lines
            # travel in the message instead of a path that will not exist.
            return blame.charge(self, rec, what, short, cause,
                                f"{detail}{self.dirs.log_tail(key)}")

        try:
            isolate = isolation.isolation(self.config.mps_cgroup, key, self.proc_root,
                                          rec.devices)
        except OSError as err:
            raise MpsError(f"cannot start MPS on {what}: no cgroup for its daemon under "
                           f"mps_cgroup={self.config.mps_cgroup}: {err}; fix plugstack "
                           "mps_cgroup= (or set it to none)",
                           brief=f"MPS start failed: no cgroup for the daemon ({short})"
                           ) from None
        try:
            result = proc.run([program, "-d"], env=control.daemon_env(rec), uid=rec.uid,
                              gid=rec.gid, timeout=budget, isolate=isolate)
        except proc.CommandNotFound as err:
            raise MpsError(f"cannot start MPS on {what}: {err}; install the NVIDIA MPS "
                           "tools or fix plugstack mps_control=",
                           brief=f"MPS start failed: {program} missing ({short})") from None
        except proc.CommandTimeout as err:
            counters.command_error(err)
            raise failed(f"no answer within {budget:g} s, killed",
                         f"{err}; check the GPU (nvidia-smi) and the daemon's log") from None
        except proc.ProcError as err:
            counters.command_error(err)
            raise failed(str(err), f"{err}; check the GPU and the daemon's log") from None
        if result.returncode != 0 and isolate.scope and isolation.scope_refused(result.output):
            raise MpsError(f"cannot start MPS on {what}: systemd made no scope for its daemon "
                           f"in {isolate.scope_slice}: {result.output}; see `systemctl status "
                           f"{isolate.scope_slice}`, or set plugstack mps_cgroup= to a cgroup "
                           "v2 directory or none",
                           brief=f"MPS start failed: no systemd scope for the daemon ({short}, "
                           f"daemon {key})")
        if result.returncode != 0:
            raise failed(f"{os.path.basename(program)} -d exit {result.returncode}",
                         f"{program} -d exited with status {result.returncode}: "
                         f"{result.output or 'no output'}")
        rec.started_at = time.time()
        phases.done("daemon-start")
        self._wait_listening(rec, budget, failed)
        phases.done("daemon-socket")
        from gpushare.node.mps.caps import limits

        caps = limits(rec, list(rec.jobs.values()), self.config.mem_limit)
        try:
            self.control(rec, [*control.default_cap_commands(caps), "get_server_list"])
        except MpsError as err:
            raise failed("its first control command failed", str(err)) from None
        rec.caps = caps
        phases.done("caps")
        counters.note("mps_daemon_starts")
        LOG.info("started %s for jobs %s", rec.describe(), ",".join(rec.jobs))

    def _wait_listening(self, rec: DaemonRecord, budget: float,
                        failed: Callable[[str, str], MpsError]) -> None:
        """Wait for the daemon's control socket, then take its pid."""
        with self.dirs.dir_fd(rec.key, "pipe") as pipe_fd:
            deadline = time.monotonic() + budget
            pause = 0.0005  # a daemon is usually listening within a millisecond or two
            while not exists_at(pipe_fd, "control"):
                if time.monotonic() > deadline:
                    counters.timed_out("daemon_start")
                    raise failed(f"no control socket within {budget:g} s",
                                 f"the daemon created no control socket in "
                                 f"{rec.pipe_dir} within {budget:g} s")
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
            check_control_at(pipe_fd, rec)
            rec.daemon_pid = self._find_pid(pipe_fd, rec)

    def _find_pid(self, pipe_fd: int, rec: DaemonRecord) -> Optional[int]:
        """The daemon's pid from its pid file, trusted only once /proc confirms it."""
        try:
            data = safefs.read_small_file_at(pipe_fd, PID_FILE, 64)
        except (OSError, safefs.UnsafePathError):
            data = None
        if data and data.strip().isdigit() and self.is_ours(int(data.strip()), rec,
                                                            daemon_only=True):
            return int(data.strip())
        # Through /proc: the launcher's double fork may leave its middle process alive for a
        # moment beside the daemon (same program, user and pipe dir); it is gone in
        # milliseconds, so the scan is taken again until one is left, for at most a second.
        deadline = time.monotonic() + 1.0
        while True:
            found = [pid for pid in self.leftovers(rec) if self.is_ours(pid, rec, True)]
            if len(found) <= 1 or time.monotonic() > deadline:
                return min(found) if found else None
            time.sleep(0.005)

    # ----------------------------------------------------------------- processes

    def is_ours(self, pid: int, rec: DaemonRecord, daemon_only: bool = False) -> bool:
        """True when ``pid`` is a live MPS daemon/server of this record's user and pipe dir."""
        return self.scan.is_ours(pid, rec.uid, rec.pipe_dir, daemon_only)

    def leftovers(self, rec: DaemonRecord) -> list[int]:
        """Live processes that are this daemon or its servers (by uid, pipe dir, program)."""
        return self.scan.leftovers(rec.uid, rec.pipe_dir)

    def stop_strays(self, key: str) -> bool:
        """End the MPS processes still running in a daemon directory without a record,
        user by user: ``quit`` through the pipe where it still answers, then signals, as
        for any daemon. True when there were some."""
        pids = self.scan.strays(key).get(key, [])
        by_user: dict[tuple[int, int], list[int]] = {}
        for pid in pids:
            owner = self.scan.owner(pid)
            if owner is None:
                continue  # gone meanwhile
            if owner[0] == 0 and not self.dirs.root_pipe_dir(key):
                # root's daemon has a pipe directory of root's: no control command runs as
                # root through a directory a user holds.
                raise MpsError(f"pid {pid} runs MPS as root in {self.dirs.path(key, 'pipe')}, "
                               "a directory not root's; end it by hand")
            by_user.setdefault(owner, []).append(pid)
        for (owner_uid, owner_gid), group in sorted(by_user.items()):
            rec = DaemonRecord(key, "", owner_uid, owner_gid, (),
                               self.dirs.path(key, "pipe"), self.dirs.path(key, "log"))
            rec.daemon_pid = next((p for p in sorted(group)
                                   if self.is_ours(p, rec, daemon_only=True)), None)
            LOG.warning("%s has no record; stopping it and its servers (pids %s)",
                        rec.describe(), " ".join(map(str, sorted(group))))
            self.stop(rec)
        return bool(pids)

    def signal_if_ours(self, pid: int, rec: DaemonRecord, sig: "signal.Signals") -> None:
        """Send ``sig`` to ``pid`` when it is ``rec``'s daemon or server, through a pidfd
        taken before the check: the process checked is the process signalled, even if
        it exits and its pid is reused in between. Without pidfds (kernels before 5.3),
        the check is made again right before ``kill``."""
        def ours(candidate: int) -> bool:
            if not self.is_ours(candidate, rec):
                return False
            LOG.warning("sending %s to pid %d left by %s", sig.name, candidate, rec.describe())
            return True

        proc.signal_checked(pid, sig, ours)

    def _control_usable(self, rec: DaemonRecord) -> bool:
        """Whether ``quit`` may go through the daemon's ``control`` (logged when not: the
        daemon is then ended with signals)."""
        try:
            self.dirs.check_control(rec)
        except (OSError, MpsError) as err:
            LOG.warning("%s; ending it with signals", err)
            return False
        return True

    def wait_gone(self, pids: Sequence[int], seconds: float) -> bool:
        """Wait until none of ``pids`` (each ours when chosen) exists any more.

        A process that is exiting stops looking like ours (its environ is gone) before it
        is gone, so existence is what is waited for; signals are still sent only after
        ``is_ours`` (a pid reused meanwhile costs a wait, never a wrong kill).
        """
        from gpushare.common import proc

        deadline = time.monotonic() + seconds
        while True:
            alive = [pid for pid in pids if self.scan.alive(pid)]
            if not alive:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Woken by the exit itself where pidfds exist; re-checked at least every 0.1 s.
            if proc.wait_for_exit(alive[0], min(left, 0.1)) is None:
                time.sleep(min(left, 0.02))

    def end_isolation(self, key: str, what: str, seconds: Optional[float] = None) -> bool:
        """Every process left in daemon ``key``'s cgroup or scope ends, whatever it runs (a
        user's child forked from a daemon they took over is no MPS program), and the cgroup
        goes, retried for ``seconds`` (default: as long as a SIGKILL gets). False (logged,
        naming ``what``) when some of it stays: the caller keeps the key's lock file, so
        the next reap tries again."""
        from gpushare.node.mps import teardown

        if seconds is None:
            seconds = max(time_left(min(self.timeout, 5.0)), 0.5)
        try:
            stays = teardown.end(self.config.mps_cgroup, key, seconds)
        except Exception as err:  # never fail a stop on it: logged, and retried
            stays = f"{type(err).__name__}: {err}"
        if stays:
            LOG.error("the cgroup or scope of %s stays: %s; the next reap of this node "
                      "(a shared job's prolog, or gpushare mps --reap) tries again", what,
                      stays)
        return not stays

    def stop(self, rec: DaemonRecord) -> bool:
        """quit through the pipe, then SIGTERM/SIGKILL what is left, verified pid by pid;
        then every process left in the daemon's cgroup or scope ends with it. True when
        the cgroup or scope is gone too (else ``end_isolation`` logged why)."""
        import signal

        pid = rec.daemon_pid
        if pid and self.is_ours(pid, rec) and self._control_usable(rec):
            try:
                self.control(rec, ["quit"])
            except MpsError as err:
                LOG.warning("%s; ending it with signals", err)
            else:
                if not self.wait_gone([pid], time_left(self.timeout)):
                    counters.timed_out("daemon_quit")
                    LOG.warning("%s ignored quit for %g s; ending it with signals",
                                rec.describe(), self.timeout)
        left = self.leftovers(rec)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not left:
                break
            for victim in left:
                self.signal_if_ours(victim, rec, sig)
            # SIGKILL always gets a moment, even past the deadline: the C glue's kill
            # comes later than that.
            self.wait_gone(left, max(time_left(min(self.timeout, 5.0)), 0.5))
            left = [p for p in left if self.is_ours(p, rec)]
        gone = self.end_isolation(rec.key, rec.describe())
        if left:
            raise MpsError(f"cannot stop {rec.describe()}: pids "
                           f"{' '.join(map(str, left))} survive SIGKILL; drain this node and "
                           "check the GPU",
                           brief=f"MPS stop failed: pids {' '.join(map(str, left))} survive "
                           f"SIGKILL (daemon {rec.key})")
        return gone


def _check_socket_room(state_dir: str, rec: DaemonRecord, what: str, short: str) -> None:
    """The daemon could not even listen on too long a path: say so now, not after the
    whole timeout."""
    control_socket = os.fsencode(os.path.join(rec.pipe_dir, "control"))
    if len(control_socket) + SOCKET_NAME_ROOM <= SOCKET_PATH_MAX:
        return
    room = SOCKET_PATH_MAX - SOCKET_NAME_ROOM - (
        len(control_socket) - len(os.fsencode(state_dir)))
    raise MpsError(f"cannot start MPS on {what}: its control socket "
                   f"{os.fsdecode(control_socket)} would be {len(control_socket)} "
                   f"bytes, too close to the {SOCKET_PATH_MAX} a Unix socket path may "
                   f"have; give plugstack.conf a state_dir= of at most {room} "
                   "characters (e.g. /run/gpushare or /run/gpushare/%n)",
                   brief=f"MPS start failed: state_dir= too long for MPS's control "
                   f"socket ({short})")
