# SPDX-License-Identifier: GPL-2.0-or-later
"""MPS control daemon lifecycle: start on first use, reference-count, stop on last release.

Why one daemon per key: a control daemon runs one server per user and serialises users, so
each user gets their own daemon (own ``CUDA_MPS_PIPE_DIRECTORY``) per GPU or MIG slice:

* ``shared`` mode, key ``u<uid>-<device uuid>``: all jobs of one user on one device share a
  daemon, so their kernels run side by side; other users on the device have their own.
* ``private`` mode, key ``job<id>``: one daemon over the job's whole GPUs (e.g. MPI ranks).

Root's state lives in ``<state_dir>/daemons`` (root-owned 0755): ``<key>.json`` (the
daemon's record, ``record``) with ``<key>.jobs/`` (a file per job referencing it) and
``<key>.lock`` (``lock``). The users' directories ``<state_dir>/mps/<key>/{pipe,log}``
(owned by the user, 0700) belong on a mount of their own, which a user can fill without
touching root's state. Records survive a slurmd restart; ``reap_stale`` drops references of
jobs that no longer exist. Records an earlier release kept in ``<state_dir>/mps`` are moved
to ``<state_dir>/daemons`` on first use (``_migrate``), so daemons of running jobs are kept.

Limits (``limits``): a job's environment carries its share; a daemon's caps are re-applied
(``set_default_*`` for servers to come, ``set_*`` on running servers for new clients) when
jobs come and go.

Every external command runs with a timeout (``gpushare.common.proc``); failures raise ``MpsError``
whose message names the device and daemon and says what to do; the caller logs it once.
Recovered trouble (a daemon ignoring ``quit``) is logged as a warning on ``gpushare.mps``.

What only starting, telling or stopping a daemon needs (``control``, ``procscan``, ``proc``,
``signal``) is imported then: the epilog of a job that shared nothing finds no record and
needs none of it.
"""

import errno
import os
import re
import time
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from gpushare.common import safefs
from gpushare.common.log import get_logger
from gpushare.node import counters
from gpushare.node.config import PluginConfig
from gpushare.node.mps.errors import MpsError, MpsUserError, joined
from gpushare.node.mps.limits import Limits, limits_for
from gpushare.node.mps.lock import Lock, lock_held, locked
from gpushare.node.mps.record import (
    JOBS_SUFFIX,
    KEY_PATTERN,
    MODES,
    TICKETS,
    DaemonRecord,
    MpsDevice,
    MpsLease,
    RecordStore,
    daemon_key,
)
from gpushare.node.phases import Phases, time_left

if TYPE_CHECKING:
    import signal

    from gpushare.common import proc
    from gpushare.node.mps.procscan import ProcScan

__all__ = ["MpsManager"]

LOG = get_logger("gpushare.mps")

PID_FILE = "nvidia-cuda-mps-control.pid"
# Room a daemon's start needs on the users' mount (its sockets, pid file, first log lines).
USERS_ROOM = 64 * 1024
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
# Sockets in a pipe directory may have names a little longer than "control" (a daemon
# may bind under a temporary name first, as the stand-in does); this much is kept free.
SOCKET_NAME_ROOM = 4
_UUID_PATTERN = r"^(GPU|MIG)-[A-Za-z0-9/_-]{1,120}$"  # compiled on first use


class MpsManager:
    """Starts, shares and stops MPS control daemons for jobs on this node (runs as root)."""

    def __init__(self, config: PluginConfig, *, lock_timeout: Optional[float] = None,
                 proc_root: str = "/proc") -> None:
        self.config = config
        self.timeout = float(config.timeout)
        self.lock_timeout = lock_timeout if lock_timeout is not None else max(
            30.0, 6 * self.timeout)
        self.proc_root = proc_root
        self.mps_dir = config.mps_dir  # the users' pipe and log directories
        self.store = RecordStore(config.daemons_dir, config.mps_dir)
        self._scan: Optional[ProcScan] = None
        self._migrated = False

    @property
    def scan(self) -> "ProcScan":
        """The look at this node's MPS processes through ``proc_root``."""
        if self._scan is None:
            from gpushare.node.mps.procscan import ProcScan

            self._scan = ProcScan(self.proc_root, self.config.mps_control, self.mps_dir)
        return self._scan

    # ----------------------------------------------------------------- public API

    def acquire(self, job_id: int, uid: int, gid: int, devices: Sequence[MpsDevice],
                mode: str = "shared", share_percent: int = 100,
                phases: Optional[Phases] = None, caps_later: bool = False) -> MpsLease:
        """Take a reference on the job's daemon, starting it if needed; idempotent per job.
        ``phases`` is told how long the daemon's start and caps took.

        With ``caps_later``, joining a running daemon leaves its caps to ``update_caps``,
        which the caller runs once the job's tasks may start: a join only adds a share, so
        until then the daemon holds the job to the old, stricter caps. A daemon this call
        starts gets its caps before the call returns either way (it begins uncapped)."""
        devices = tuple(devices)
        self._check_request(job_id, uid, devices, mode, share_percent)
        key = daemon_key(mode, uid, job_id, devices)
        with self._store_fd() as store_fd, self._locked(store_fd, key) as lock:
            rec = self.store.read(store_fd, key)
            # A record holding the job without a daemon is a start that did not finish
            # (its process died before its pid was known): started again below.
            if rec is not None and str(job_id) in rec.jobs and rec.daemon_pid:
                return self._lease(rec, job_id)
            if rec is not None and (rec.uid != uid or rec.mode != mode):
                raise MpsError(f"MPS record {self._path(key)}.json belongs to uid "
                               f"{rec.uid} mode {rec.mode}; remove it after stopping "
                               "its daemon")
            if rec is not None and rec.daemon_pid and self._is_ours(rec.daemon_pid, rec):
                self._check_control(rec)
                rec.jobs[str(job_id)] = share_percent
                self.store.write(store_fd, rec)
                if not caps_later:
                    self._apply_caps(store_fd, rec)
                return self._lease(rec, job_id)
            if rec is not None:
                LOG.warning("%s is not running any more; starting it again", rec.describe())
                self._stop_daemon(rec)
            else:
                rec = self.store.new(key, mode, uid, gid, devices)
            rec.jobs[str(job_id)] = share_percent
            rec.daemon_pid = None
            rec.dirs_made = False
            self.store.write(store_fd, rec)
            try:
                self._start_daemon(store_fd, rec, phases or Phases())
            except BaseException:
                self._undo_start(store_fd, rec, lock, job_id)
                raise
            self.store.write(store_fd, rec)
            return self._lease(rec, job_id)

    def update_caps(self, key: str) -> None:
        """Give daemon ``key`` the caps of the jobs it now serves (after ``caps_later``).
        A failure is logged: the jobs' own limits hold, and the next join or leave retries.
        Nothing here may fail the job, whose tasks may already run."""
        try:
            with self._store_fd() as store_fd, self._locked(store_fd, key) as lock:
                rec = self.store.read(store_fd, key)
                if rec is None:
                    lock.remove = True  # gone meanwhile: leave no lock file behind
                elif rec.daemon_pid:
                    self._apply_caps(store_fd, rec)
        except Exception as err:  # the lock, the record or the directory: logged only
            LOG.warning("cannot update the caps of MPS daemon %s: %s", key, err)

    def write_ticket(self, key: str, share: int, ticket_name: str,
                     render: Callable[[str, str], bytes]) -> bool:
        """Write the join ticket ``ticket_name`` (``gpushare.node.ticket``) for daemon
        ``key``, under its lock, when the daemon runs shared with caps of at least
        ``share``; ``render(daemon, record_stamp)`` makes its text. False (logged) when there
        is none to write; nothing here may fail the job, whose tasks may already run."""
        from gpushare.node import ticket

        try:
            with self._store_fd() as store_fd, self._locked(store_fd, key):
                rec = self.store.read(store_fd, key)
                started = (self.scan.start_time(rec.daemon_pid)
                           if rec is not None and rec.daemon_pid else None)
                if (rec is None or rec.mode != "shared" or started is None or
                        rec.caps is None or rec.caps.percent < share or rec.stop_failed):
                    return False
                record_stamp = ticket.stamp(os.stat(key + ".json", dir_fd=store_fd,
                                                    follow_symlinks=False))
                self.store.write_ticket(store_fd, ticket_name,
                                        render(f"{rec.daemon_pid} {started}", record_stamp))
                return True
        except Exception as err:  # a ticket only saves the next join its worker: logged
            LOG.warning("no join ticket for MPS daemon %s: %s", key, err)
            return False

    def release(self, job_id: int, hint: Optional[str] = None) -> list[str]:
        """Drop the job's references; stop daemons nobody uses. Idempotent.

        ``hint`` is the daemon key the job's lease names: when that record holds the job,
        only it is read, not every daemon record of the node. Returns the keys of the
        daemons stopped. Raises MpsError (after doing everything else) when a daemon cannot
        be stopped.
        """
        stopped: list[str] = []
        errors: list[MpsError] = []
        with self._store_fd() as store_fd:
            if hint and self.store.holds(store_fd, hint, job_id):
                keys = [hint]
            else:
                keys = self.store.keys_of_job(store_fd, job_id)
            for key in keys:
                with self._locked(store_fd, key) as lock:
                    rec = self.store.read(store_fd, key)
                    if rec is None or str(job_id) not in rec.jobs:
                        continue
                    self._drop_collecting(store_fd, rec, lock, [str(job_id)], stopped, errors)
        if errors:
            raise joined(errors)
        return stopped

    def reap_stale(self, job_alive: Callable[[int], bool], strays: bool = False) -> list[str]:
        """Drop references of jobs that no longer exist; stop daemons left without any.

        Also removes daemon directories and lock files that have no record, after ending
        any MPS process still running in them. ``strays`` also looks through /proc for
        MPS processes in a daemon directory of this node that has no record any more (its
        state was removed while they ran); a prolog leaves that to ``gpushare mps
        --reap``. Returns the keys of the daemons stopped; raises MpsError for daemons
        that cannot be stopped.
        """
        stopped: list[str] = []
        errors: list[MpsError] = []
        with self._store_fd() as store_fd:
            self._purge_trash()
            keys = sorted(set(self.store.keys(store_fd)) | set(self._user_keys()))
            if strays:
                keys = sorted(set(keys) | set(self.scan.strays()))
            for key in keys:
                # A daemon whose jobs are all alive is skipped: taking every GPU's lock
                # would queue each prolog behind every other GPU's daemon start.
                seen = self.store.peek(store_fd, key)
                if seen and seen.jobs and all(job_alive(int(j)) for j in seen.jobs):
                    continue
                with self._locked(store_fd, key) as lock:
                    rec = self.store.read(store_fd, key)
                    if rec is None:
                        try:
                            if self._stop_strays(key):
                                stopped.append(key)
                        except MpsError as err:
                            errors.append(err)
                            continue
                        self._remove_dirs(key)
                        self.store.remove(store_fd, key)
                        lock.remove = True
                        continue
                    dead = [jid for jid in rec.jobs if not job_alive(int(jid))]
                    for jid in dead:
                        counters.note("mps_reaped_references")
                        LOG.info("dropping MPS reference of vanished job %s on %s", jid,
                                 rec.describe())
                    if rec.jobs and not dead:
                        continue
                    self._drop_collecting(store_fd, rec, lock, dead, stopped, errors)
        if errors:
            raise joined(errors)
        return stopped

    def _purge_trash(self) -> None:
        """Go on removing daemon directories discarded before (``safefs.discard_tree_at``)
        within a bounded budget; what is left waits for the next prolog. Never fails one."""
        try:
            with self.store.users_fd(create=False) as users_fd:
                safefs.purge_trash_at(users_fd)
        except (OSError, MpsError) as err:
            if not isinstance(err, FileNotFoundError):
                LOG.warning("cannot purge %s: %s", os.path.join(self.mps_dir, safefs.TRASH),
                            err)

    def _user_keys(self) -> list[str]:
        """The daemon directories in the users' directory (a record may be gone)."""
        try:
            with self.store.users_fd(create=False) as users_fd:
                return [name for name in os.listdir(users_fd)
                        if not name.startswith(".") and re.match(KEY_PATTERN, name)
                        and not name.endswith((".json", ".lock", JOBS_SUFFIX))
                        and name != TICKETS]
        except FileNotFoundError:
            return []

    def _drop_collecting(self, store_fd: int, rec: DaemonRecord, lock: Lock,
                         job_ids: Sequence[str], stopped: list[str],
                         errors: list[MpsError]) -> None:
        """``_drop_jobs`` for one daemon of several: its key goes to ``stopped`` when it was
        stopped, its MpsError to ``errors``, so the other daemons are still done."""
        try:
            if self._drop_jobs(store_fd, rec, lock, job_ids):
                stopped.append(rec.key)
        except MpsError as err:
            errors.append(err)

    def _drop_jobs(self, store_fd: int, rec: DaemonRecord, lock: Lock,
                   job_ids: Sequence[str]) -> bool:
        """Remove jobs from a daemon (lock held): lower its caps to the jobs left, or stop
        it when none are left. True when it was stopped; MpsError when it cannot be."""
        for jid in job_ids:
            del rec.jobs[jid]
        if not rec.jobs:
            self._retire(store_fd, rec, lock)
            return True
        self.store.write(store_fd, rec)
        self._apply_caps(store_fd, rec)
        return False

    def records(self) -> list[DaemonRecord]:
        """All daemon records on this node (for inspection commands)."""
        return [entry["record"] for entry in self.snapshot(check_processes=False)
                if entry["record"] is not None]

    def snapshot(self, check_processes: bool = True) -> list[dict[str, Any]]:
        """Every daemon key of the node, read without locks (records are replaced whole).

        Each entry: ``key``; ``record`` (a ``DaemonRecord``; None for a directory or lock
        without one, or for MPS processes found in a daemon directory that is gone);
        ``error`` (why the record is unreadable); ``running`` (the recorded daemon is alive
        and ours; None when processes were not checked); ``strays`` (pids of MPS processes
        in the directory of a key without a record); ``busy`` (the key has no record or no
        running daemon, and its lock is held: a prolog or epilog is starting or stopping
        it right now). For ``gpushare mps``.
        """
        entries: list[dict[str, Any]] = []
        strays = self.scan.strays() if check_processes else {}
        try:
            with self._store_fd(create=False) as store_fd:
                for key in sorted(set(self.store.keys(store_fd)) | set(strays)):
                    entry: dict[str, Any] = {"key": key, "record": None, "error": "",
                                             "running": None, "strays": [], "busy": False}
                    rec: Optional[DaemonRecord]
                    try:
                        rec = self.store.read(store_fd, key)
                    except MpsError as err:
                        entry["error"] = str(err)
                        rec = None
                    entry["record"] = rec
                    if rec is None and not entry["error"]:
                        entry["strays"] = sorted(strays.get(key, []))
                        entry["busy"] = not entry["strays"] and lock_held(store_fd, key)
                    if rec is not None and check_processes:
                        pid = rec.daemon_pid or 0
                        entry["running"] = bool(pid) and self._is_ours(pid, rec,
                                                                       daemon_only=True)
                        entry["busy"] = not entry["running"] and lock_held(store_fd, key)
                    entries.append(entry)
        except FileNotFoundError:
            return [{"key": key, "record": None, "error": "", "running": None,
                     "strays": sorted(pids), "busy": False}
                    for key, pids in sorted(strays.items())]
        return entries

    # ----------------------------------------------------------------- checks

    def _check_request(self, job_id: int, uid: int, devices: tuple[MpsDevice, ...],
                       mode: str, share_percent: int) -> None:
        if mode not in MODES:
            raise MpsError(f"MPS mode {mode!r} is unknown; use shared or private")
        if not devices:
            raise MpsError(f"job {job_id} asks for MPS without any GPU")
        for dev in devices:
            if not re.match(_UUID_PATTERN, dev.uuid):
                raise MpsError(f"device uuid {dev.uuid!r} is not a GPU-… or MIG-… uuid")
        if not 1 <= share_percent <= 100:
            raise MpsError(f"MPS share {share_percent}% is outside 1..100")

    def _program(self) -> str:
        """The configured daemon program, checked to be safe for root to hand to users."""
        path = self.config.mps_control
        try:
            safefs.check_root_owned_file(path)
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS control program refused: {err} (plugstack mps_control=)"
                           ) from None
        return path

    # ----------------------------------------------------------------- state

    @contextmanager
    def _store_fd(self, create: bool = True) -> Iterator[int]:
        """Root's daemon records, after moving there those an earlier release left in the
        users' directory (once per process: one listing of that directory)."""
        with self.store.dir_fd(create=create) as store_fd:
            if not self._migrated:
                self._migrated = True
                self._migrate(store_fd)
            yield store_fd

    def _migrate(self, store_fd: int) -> None:
        """Move each record, job reference and lock an earlier release kept in
        ``<state_dir>/mps`` into root's records, under the daemon's lock in both places
        (an earlier release's process may still hold the old one). Join tickets left there
        are dropped: the next join writes one where the plugin now looks."""
        old = RecordStore(self.mps_dir, self.mps_dir)
        try:
            with self.store.users_fd(create=False) as users_fd:
                names = os.listdir(users_fd)
                keys = sorted({name[:-5] for name in names
                               if name.endswith((".json", ".lock"))
                               and re.match(KEY_PATTERN, name[:-5])})
                for key in keys:
                    wait = time_left(self.lock_timeout)
                    with locked(store_fd, key, self._path(key + ".lock"), wait), \
                            locked(users_fd, key, old.path(key + ".lock"), wait) as old_lock:
                        rec = old.read(users_fd, key)
                        if rec is not None and self.store.read(store_fd, key) is None:
                            self.store.write(store_fd, rec)
                            LOG.info("moved the record of %s to %s", rec.describe(),
                                     self.store.daemons_dir)
                        old.remove(users_fd, key)
                        old_lock.remove = True
                if TICKETS in names:
                    safefs.remove_tree_at(users_fd, TICKETS)
        except FileNotFoundError:
            pass

    def _path(self, *parts: str) -> str:
        """A path among root's daemon records."""
        return self.store.path(*parts)

    def _user_path(self, *parts: str) -> str:
        """A path among the users' pipe and log directories."""
        return os.path.join(self.mps_dir, *parts)

    @contextmanager
    def _locked(self, store_fd: int, key: str) -> Iterator[Lock]:
        # Inside a worker, never past its deadline (gpushare.node.phases).
        wait = time_left(self.lock_timeout)
        with locked(store_fd, key, self._path(key + ".lock"), wait) as lock:
            yield lock

    # ----------------------------------------------------------------- limits

    def _limits(self, rec: DaemonRecord, shares: Sequence[int]) -> Limits:
        return limits_for(rec.mode, shares, [d.memory_total for d in rec.devices],
                          self.config.mem_limit)

    def _apply_caps(self, store_fd: int, rec: DaemonRecord) -> None:
        """Give a running daemon the caps of the jobs now in ``rec`` (already written).

        The record's ``caps`` says what the daemon was last told: that is what is compared
        (a failed change is retried by the next join or leave) and what ``gpushare mps``
        shows. A failure is logged, not raised: the jobs' own limits still hold.
        """
        caps = self._limits(rec, list(rec.jobs.values()))
        if caps == rec.caps:
            return
        from gpushare.node.mps import control  # only when the daemon is told something

        try:
            result = self._control(rec, [*control.default_cap_commands(caps),
                                         "get_server_list"])
            per_server = control.server_cap_commands(control.server_list(result), caps)
            if per_server:
                self._control(rec, per_server)
        except MpsError as err:
            LOG.warning("%s", err)
            return
        rec.caps = caps
        self.store.write(store_fd, rec)

    def _lease(self, rec: DaemonRecord, job_id: int) -> MpsLease:
        share = rec.jobs[str(job_id)]
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": rec.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": rec.log_dir,
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(rec.devices))),
        }
        env.update(self._limits(rec, [share]).env(rec.mode))
        return MpsLease(
            job_id=job_id, key=rec.key, mode=rec.mode, uid=rec.uid, gid=rec.gid,
            pipe_dir=rec.pipe_dir, log_dir=rec.log_dir, devices=rec.devices,
            share_percent=share, daemon_pid=rec.daemon_pid, env=env,
        )

    # ----------------------------------------------------------------- daemon

    def _control(self, rec: DaemonRecord, commands: list[str]) -> "proc.Result":
        from gpushare.node.mps import control

        return control.send(self._program(), rec, commands, time_left(self.timeout))

    def _start_daemon(self, store_fd: int, rec: DaemonRecord, phases: Phases) -> None:
        from gpushare.common import proc
        from gpushare.node.mps import control

        program = self._program()
        key = rec.key
        what = ", ".join(d.describe() for d in rec.devices)
        short = ", ".join(d.label or d.uuid for d in rec.devices)
        control_socket = os.fsencode(os.path.join(rec.pipe_dir, "control"))
        if len(control_socket) + SOCKET_NAME_ROOM > SOCKET_PATH_MAX:
            # The daemon could not even listen: say so now, not after the whole timeout.
            room = SOCKET_PATH_MAX - SOCKET_NAME_ROOM - (
                len(control_socket) - len(os.fsencode(self.config.state_dir)))
            raise MpsError(f"cannot start MPS on {what}: its control socket "
                           f"{os.fsdecode(control_socket)} would be {len(control_socket)} "
                           f"bytes, too close to the {SOCKET_PATH_MAX} a Unix socket path may "
                           f"have; give plugstack.conf a state_dir= of at most {room} "
                           "characters (e.g. /run/gpushare or /run/gpushare/%n)",
                           brief=f"MPS start failed: state_dir= too long for MPS's control "
                           f"socket ({short})")
        self._make_dirs(rec)
        phases.done("mps")

        def failed(cause: str, detail: str) -> MpsError:
            # The daemon's directory goes with the failed start: its log's last lines
            # travel in the message instead of a path that will not exist.
            return MpsError(f"cannot start MPS on {what}: {detail}{self._log_tail(key)}",
                            brief=f"MPS start failed: {cause} ({short}, daemon {key})")

        from gpushare.node.mps import isolation

        try:
            isolate = isolation.isolation(self.config.mps_cgroup, key, self.proc_root)
        except OSError as err:
            raise MpsError(f"cannot start MPS on {what}: no cgroup for its daemon under "
                           f"mps_cgroup={self.config.mps_cgroup}: {err}; fix plugstack "
                           "mps_cgroup= (or set it to none)",
                           brief=f"MPS start failed: no cgroup for the daemon ({short})"
                           ) from None
        limit = time_left(self.timeout)  # the worker's deadline holds
        try:
            result = proc.run([program, "-d"], env=control.daemon_env(rec), uid=rec.uid,
                              gid=rec.gid, timeout=limit, isolate=isolate)
        except proc.CommandNotFound as err:
            raise MpsError(f"cannot start MPS on {what}: {err}; install the NVIDIA MPS "
                           "tools or fix plugstack mps_control=",
                           brief=f"MPS start failed: {program} missing ({short})") from None
        except proc.CommandTimeout as err:
            counters.command_error(err)
            raise failed(f"no answer within {limit:g} s, killed",
                         f"{err}; check the GPU (nvidia-smi) and the daemon's log") from None
        except proc.ProcError as err:
            counters.command_error(err)
            raise failed(str(err), f"{err}; check the GPU and the daemon's log") from None
        if result.returncode != 0 and isolate.scope and isolation.scope_refused(result.output):
            raise failed("no systemd scope for the daemon",
                         f"systemd made no scope for its daemon in {isolate.scope_slice}: "
                         f"{result.output}; see `systemctl status {isolate.scope_slice}`, or "
                         "set plugstack mps_cgroup= to a cgroup v2 directory or none")
        if result.returncode != 0:
            raise failed(f"{os.path.basename(program)} -d exit {result.returncode}",
                         f"{program} -d exited with status {result.returncode}: "
                         f"{result.output or 'no output'}")
        rec.started_at = time.time()
        phases.done("daemon-start")
        with self._user_dir_fd(key, "pipe") as pipe_fd:
            limit = time_left(self.timeout)
            deadline = time.monotonic() + limit
            pause = 0.0005  # a daemon is usually listening within a millisecond or two
            while not _exists_at(pipe_fd, "control"):
                if time.monotonic() > deadline:
                    counters.timed_out("daemon_start")
                    raise failed(f"no control socket within {limit:g} s",
                                 f"the daemon created no control socket in "
                                 f"{rec.pipe_dir} within {limit:g} s")
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
            self._check_control_at(pipe_fd, rec)
            rec.daemon_pid = self._find_daemon_pid(pipe_fd, rec)
        phases.done("daemon-socket")
        caps = self._limits(rec, list(rec.jobs.values()))
        self._control(rec, [*control.default_cap_commands(caps), "get_server_list"])
        rec.caps = caps
        phases.done("caps")
        counters.note("mps_daemon_starts")
        LOG.info("started %s for jobs %s", rec.describe(), ",".join(rec.jobs))

    def _log_tail(self, key: str, lines: int = 3) -> str:
        """``; control.log ends: ...`` with the daemon log's last lines ("" without one).

        The log directory belongs to the job's user: the file is read without following
        a link, only when it is a regular file, and at most 64 KiB of it.
        """
        try:
            with self._user_dir_fd(key, "log") as log_fd:
                data = safefs.read_small_file_at(log_fd, "control.log", 1 << 16)
        except (OSError, safefs.UnsafePathError, MpsError):
            return ""
        text = [line.strip() for line in (data or b"").decode("utf-8", "replace").splitlines()
                if line.strip()]
        return f"; control.log ends: {' | '.join(text[-lines:])}" if text else ""

    def _remove_dirs(self, key: str) -> None:
        """Take daemon ``key``'s pipe and log directories away (at once, whatever the user
        left there: ``safefs.remove_tree_at`` discards what it cannot remove in budget)."""
        try:
            with self.store.users_fd(create=False) as users_fd:
                safefs.remove_tree_at(users_fd, key)
        except FileNotFoundError:
            pass

    def _make_dirs(self, rec: DaemonRecord) -> None:
        key = rec.key
        try:
            with self.store.users_fd() as users_fd:
                self._check_users_space(users_fd, rec)
                try:
                    fd = safefs.open_dir_at(users_fd, key, self._user_path(key),
                                            root_owned=True)
                except FileNotFoundError:
                    pass
                else:
                    os.close(fd)
                    LOG.info("removing leftover MPS directory %s", self._user_path(key))
                    safefs.remove_tree_at(users_fd, key)
                safefs.make_owned_dir(users_fd, key, self._user_path(key), 0, 0, 0o755)
                rec.dirs_made = True
                key_fd = safefs.open_dir_at(users_fd, key, self._user_path(key),
                                            root_owned=True)
                try:
                    for name in ("pipe", "log"):
                        safefs.make_owned_dir(key_fd, name, self._user_path(key, name),
                                              rec.uid, rec.gid, 0o700)
                finally:
                    os.close(key_fd)
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS directory refused: {err}") from None
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT) and self._users_own_mount():
                raise self._users_full(rec, err.strerror or str(err)) from None
            raise

    def _check_users_space(self, users_fd: int, rec: DaemonRecord) -> None:
        """A daemon needs room in the users' mount for its sockets and log: where the users
        filled it, say so before starting one that would fail for want of it."""
        if not self._users_own_mount():
            return  # full there means state_dir= full: a node fault, found by the writes
        try:
            space = os.fstatvfs(users_fd)
        except OSError:
            return
        if (space.f_files and space.f_favail == 0) or (
                space.f_blocks and space.f_bavail * space.f_frsize < USERS_ROOM):
            raise self._users_full(rec, "no space or inodes left")

    def _users_full(self, rec: DaemonRecord, why: str) -> "MpsUserError":
        """Users filled their mount: the job fails, the node stays in service (a user did
        it, and the next daemon stop frees room)."""
        return MpsUserError(
            f"cannot start MPS for {rec.describe()}: the users' MPS directories {self.mps_dir} "
            f"are full ({why}); the jobs writing there fill it. Submit again later; the "
            "node's admin finds who with `gpushare check` and `du -s "
            f"{self.mps_dir}/*`",
            brief=f"MPS directories full: {self.mps_dir}")

    def _users_own_mount(self) -> bool:
        """Whether the users' directory is a file system of its own, apart from root's."""
        try:
            return os.stat(self.mps_dir).st_dev != os.stat(self.config.state_dir).st_dev
        except OSError:
            return False

    @contextmanager
    def _user_dir_fd(self, key: str, name: str) -> Iterator[int]:
        """The daemon's ``pipe`` or ``log`` directory (the user's), reached through its
        root-owned key directory without following a link."""
        with self.store.users_fd(create=False) as users_fd:
            key_fd = safefs.open_dir_at(users_fd, key, self._user_path(key), root_owned=True)
        try:
            dir_fd = safefs.open_dir_at(key_fd, name, self._user_path(key, name))
        finally:
            os.close(key_fd)
        try:
            yield dir_fd
        finally:
            os.close(dir_fd)

    def _check_control(self, rec: DaemonRecord) -> None:
        """``_check_control_at`` through the daemon's pipe directory. What the user can
        change below the users' directory fails their job; an unsafe users' directory itself
        is the node's fault (its MpsError goes on)."""
        try:
            with self._user_dir_fd(rec.key, "pipe") as pipe_fd:
                self._check_control_at(pipe_fd, rec)
        except (OSError, safefs.UnsafePathError) as err:
            raise MpsUserError(f"{rec.describe()}: its pipe directory {rec.pipe_dir} cannot "
                               f"be used ({err}); the job's user changed it",
                               brief=f"MPS pipe directory of daemon {rec.key} changed by its "
                               "user") from None

    def _check_control_at(self, pipe_fd: int, rec: DaemonRecord) -> None:
        """Root talks to a daemon only through ``control`` when it is a socket of the
        daemon's user, in a pipe directory of theirs: anything else there was put by that
        user (a daemon only binds sockets), and stops MPS for their job alone."""
        problem = control_problem(pipe_fd, rec.uid)
        if problem:
            raise MpsUserError(
                f"{rec.describe()}: {os.path.join(rec.pipe_dir, 'control')} {problem}, not "
                "the daemon's socket; the job's user put it there. Stop what runs in "
                f"{rec.pipe_dir} and submit again",
                brief=f"MPS control of daemon {rec.key} {problem}")

    def _find_daemon_pid(self, pipe_fd: int, rec: DaemonRecord) -> Optional[int]:
        """The daemon's pid from its pid file, trusted only once /proc confirms it."""
        try:
            data = safefs.read_small_file_at(pipe_fd, PID_FILE, 64)
        except (OSError, safefs.UnsafePathError):
            data = None
        if data and data.strip().isdigit() and self._is_ours(int(data.strip()), rec,
                                                             daemon_only=True):
            return int(data.strip())
        found = [pid for pid in self._leftovers(rec) if self._is_ours(pid, rec, True)]
        return min(found) if found else None

    # ----------------------------------------------------------------- processes

    def _is_ours(self, pid: int, rec: DaemonRecord, daemon_only: bool = False) -> bool:
        """True when ``pid`` is a live MPS daemon/server of this record's user and pipe dir."""
        return self.scan.is_ours(pid, rec.uid, rec.pipe_dir, daemon_only)

    def _leftovers(self, rec: DaemonRecord) -> list[int]:
        """Live processes that are this daemon or its servers (by uid, pipe dir, program)."""
        return self.scan.leftovers(rec.uid, rec.pipe_dir)

    def _stop_strays(self, key: str) -> bool:
        """End the MPS processes still running in a daemon directory without a record,
        user by user: ``quit`` through the pipe where it still answers, then signals, as
        for any daemon. True when there were some."""
        pids = self.scan.strays(key).get(key, [])
        by_user: dict[tuple[int, int], list[int]] = {}
        for pid in pids:
            owner = self.scan.owner(pid)
            if owner is None:
                continue  # gone meanwhile
            if owner[0] == 0 and not self._root_pipe_dir(key):
                # root's daemon has a pipe directory of root's: no control command runs as
                # root through a directory a user holds.
                raise MpsError(f"pid {pid} runs MPS as root in {self._user_path(key, 'pipe')}, "
                               "a directory not root's; end it by hand")
            by_user.setdefault(owner, []).append(pid)
        for (owner_uid, owner_gid), group in sorted(by_user.items()):
            rec = DaemonRecord(key, "", owner_uid, owner_gid, (),
                               self._user_path(key, "pipe"), self._user_path(key, "log"))
            rec.daemon_pid = next((p for p in sorted(group)
                                   if self._is_ours(p, rec, daemon_only=True)), None)
            LOG.warning("%s has no record; stopping it and its servers (pids %s)",
                        rec.describe(), " ".join(map(str, sorted(group))))
            self._stop_daemon(rec)
        return bool(pids)

    def _root_pipe_dir(self, key: str) -> bool:
        """Whether daemon ``key``'s pipe directory is root's alone (root's daemon's)."""
        try:
            info = os.lstat(self._user_path(key, "pipe"))
        except OSError:
            return False
        return info.st_uid == 0 and not info.st_mode & 0o077 and os.path.isdir(
            self._user_path(key, "pipe")) and not os.path.islink(self._user_path(key, "pipe"))

    def _signal_if_ours(self, pid: int, rec: DaemonRecord, sig: "signal.Signals") -> None:
        """Send ``sig`` to ``pid`` when it is ``rec``'s daemon or server, through a pidfd
        taken before the check: the process checked is the process signalled, even if
        it exits and its pid is reused in between. Without pidfds (kernels before 5.3),
        the check is made again right before ``kill``."""
        import signal

        try:
            pidfd: Optional[int] = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        except (AttributeError, OSError):
            pidfd = None
        try:
            if not self._is_ours(pid, rec):
                return
            LOG.warning("sending %s to pid %d left by %s", sig.name, pid, rec.describe())
            with suppress(ProcessLookupError):
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, sig)
                elif self._is_ours(pid, rec):
                    os.kill(pid, sig)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _control_usable(self, rec: DaemonRecord) -> bool:
        """Whether ``quit`` may go through the daemon's ``control`` (logged when not: the
        daemon is then ended with signals)."""
        try:
            self._check_control(rec)
        except (OSError, MpsError) as err:
            LOG.warning("%s; ending it with signals", err)
            return False
        return True

    def _wait_gone(self, pids: Sequence[int], seconds: float) -> bool:
        """Wait until none of ``pids`` (each ours when chosen) exists any more.

        A process that is exiting stops looking like ours (its environ is gone) before it
        is gone, so existence is what is waited for; signals are still sent only after
        ``_is_ours`` (a pid reused meanwhile costs a wait, never a wrong kill).
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

    def _stop_daemon(self, rec: DaemonRecord) -> None:
        """quit through the pipe, then SIGTERM/SIGKILL what is left, verified pid by pid."""
        import signal

        pid = rec.daemon_pid
        if pid and self._is_ours(pid, rec) and self._control_usable(rec):
            try:
                self._control(rec, ["quit"])
            except MpsError as err:
                LOG.warning("%s; ending it with signals", err)
            else:
                limit = time_left(self.timeout)
                if not self._wait_gone([pid], limit):
                    counters.timed_out("daemon_quit")
                    LOG.warning("%s ignored quit for %g s; ending it with signals",
                                rec.describe(), limit)
        left = self._leftovers(rec)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not left:
                break
            for victim in left:
                self._signal_if_ours(victim, rec, sig)
            self._wait_gone(left, time_left(min(self.timeout, 5.0)))
            left = [p for p in left if self._is_ours(p, rec)]
        if not left:
            from gpushare.node.mps import isolation

            isolation.remove_cgroup(self.config.mps_cgroup, rec.key)
        if left:
            raise MpsError(f"cannot stop {rec.describe()}: pids "
                           f"{' '.join(map(str, left))} survive SIGKILL; drain this node and "
                           "check the GPU",
                           brief=f"MPS stop failed: pids {' '.join(map(str, left))} survive "
                           f"SIGKILL (daemon {rec.key})")

    def _retire(self, store_fd: int, rec: DaemonRecord, lock: Lock) -> None:
        """Stop the daemon of a record without references, then remove its files."""
        try:
            self._stop_daemon(rec)
        except MpsError as err:
            counters.note("mps_stop_failures")
            rec.stop_failed = str(err)
            self.store.write(store_fd, rec)
            raise
        self._remove_dirs(rec.key)
        self.store.remove(store_fd, rec.key)
        lock.remove = True
        LOG.info("stopped %s", rec.describe())

    def _undo_start(self, store_fd: int, rec: DaemonRecord, lock: Lock, job_id: int) -> None:
        """After a failed start: end what started, drop this job's reference, clean up."""
        rec.jobs.pop(str(job_id), None)
        try:
            self._stop_daemon(rec)
        except MpsError as err:
            counters.note("mps_stop_failures")
            LOG.error("%s", err)
            rec.stop_failed = str(err)
            self.store.write(store_fd, rec)
            return
        if rec.jobs:
            rec.daemon_pid = None
            self.store.write(store_fd, rec)
            return
        if rec.dirs_made:
            self._remove_dirs(rec.key)
        self.store.remove(store_fd, rec.key)
        lock.remove = True


def control_problem(pipe_fd: int, uid: int) -> str:
    """What is wrong with ``control`` in a daemon's pipe directory for a daemon of ``uid``
    ("" when it is a socket of that user): read with ``lstat``, never followed."""
    import stat

    try:
        info = os.lstat("control", dir_fd=pipe_fd)
    except FileNotFoundError:
        return "is missing"
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISSOCK(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else (
            "a directory" if stat.S_ISDIR(info.st_mode) else "a regular file"
            if stat.S_ISREG(info.st_mode) else "not a socket")
        return f"is {kind}" if kind.startswith("a ") else kind
    if info.st_uid != uid:
        return f"is a socket of uid {info.st_uid}"
    return ""


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True
