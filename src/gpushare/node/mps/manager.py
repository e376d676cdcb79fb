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

This module keeps the references under each daemon's lock; the rooms it uses: ``userdirs``
(the users' directories), ``daemon`` (the processes: start, stop, signal), ``blame`` (who
made a start fail), ``caps`` (a daemon's caps and a job's lease), ``migrate``.

Every external command runs with a timeout (``gpushare.common.proc``); failures raise ``MpsError``
whose message names the device and daemon and says what to do; the caller logs it once.
Recovered trouble (a daemon ignoring ``quit``) is logged as a warning on ``gpushare.mps``.

What only starting, telling or stopping a daemon needs (``control``, ``procscan``, ``proc``,
``signal``) is imported then: the epilog of a job that shared nothing finds no record and
needs none of it.
"""

import os
import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from gpushare.common.log import get_logger
from gpushare.node import counters
from gpushare.node.config import PluginConfig
from gpushare.node.mps import caps
from gpushare.node.mps.daemon import SOCKET_NAME_ROOM, SOCKET_PATH_MAX, Daemons
from gpushare.node.mps.errors import MpsError, joined
from gpushare.node.mps.lock import Lock, lock_held, locked
from gpushare.node.mps.record import (
    MODES,
    DaemonRecord,
    MpsDevice,
    MpsLease,
    RecordStore,
    daemon_key,
)
from gpushare.node.mps.userdirs import UserDirs
from gpushare.node.phases import Phases, time_left

if TYPE_CHECKING:
    from gpushare.node.mps.procscan import ProcScan

__all__ = ["SOCKET_NAME_ROOM", "SOCKET_PATH_MAX", "MpsManager"]

LOG = get_logger("gpushare.mps")

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
        self.dirs = UserDirs(self.store, config.mps_dir, config.state_dir, config.mps_space)
        self.daemons = Daemons(config, self.dirs, proc_root)
        self._migrated = False

    @property
    def scan(self) -> "ProcScan":
        """The look at this node's MPS processes through ``proc_root``."""
        return self.daemons.scan

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
        _check_request(job_id, devices, mode, share_percent)
        key = daemon_key(mode, uid, job_id, devices)
        with self._store_fd() as store_fd, self._locked(store_fd, key) as lock:
            rec = self.store.read(store_fd, key)
            # A record holding the job without a daemon is a start that did not finish
            # (its process died before its pid was known): started again below.
            if rec is not None and str(job_id) in rec.jobs and rec.daemon_pid:
                return caps.lease(rec, job_id, self.config.mem_limit)
            if rec is not None and (rec.uid != uid or rec.mode != mode):
                raise MpsError(f"MPS record {self._path(key)}.json belongs to uid "
                               f"{rec.uid} mode {rec.mode}; remove it after stopping "
                               "its daemon")
            if rec is not None and rec.daemon_pid and self.daemons.is_ours(rec.daemon_pid, rec):
                self.dirs.check_control(rec)
                self.dirs.check_room(rec)
                rec.jobs[str(job_id)] = share_percent
                self.store.write(store_fd, rec)
                if not caps_later:
                    caps.apply(self.daemons, self.store, store_fd, rec)
                return caps.lease(rec, job_id, self.config.mem_limit)
            if rec is not None:
                LOG.warning("%s is not running any more; starting it again", rec.describe())
                self.daemons.stop(rec)
                rec.devices = devices  # the same GPUs (the key says so), as NVML has them now
            else:
                rec = self.store.new(key, mode, uid, gid, devices)
            rec.jobs[str(job_id)] = share_percent
            rec.daemon_pid = None
            rec.dirs_made = False
            self.store.write(store_fd, rec)
            try:
                self.daemons.start(rec, phases or Phases())
            except BaseException:
                self._undo_start(store_fd, rec, lock, job_id)
                raise
            self.store.write(store_fd, rec)
            return caps.lease(rec, job_id, self.config.mem_limit)

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
                    caps.apply(self.daemons, self.store, store_fd, rec)
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
            self.dirs.purge_trash()
            keys = sorted(set(self.store.keys(store_fd)) | set(self.dirs.keys()))
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
                            if self.daemons.stop_strays(key):
                                stopped.append(key)
                        except MpsError as err:
                            errors.append(err)
                            continue
                        self.dirs.remove(key)
                        self.store.remove(store_fd, key)
                        # A cgroup or scope an earlier stop could not end: one more try,
                        # with a short wait (a process still stuck would hold up each
                        # prolog).
                        lock.remove = self.daemons.end_isolation(
                            key, f"MPS daemon {key} (record gone)", seconds=time_left(0.5))
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
        caps.apply(self.daemons, self.store, store_fd, rec)
        return False

    def records(self) -> list[DaemonRecord]:
        """All daemon records on this node (for inspection commands)."""
        return [entry["record"] for entry in self.snapshot(check_processes=False)
                if entry["record"] is not None]

    def snapshot(self, check_processes: bool = True) -> list[dict[str, Any]]:
        """Every daemon key of the node, read without locks (``_snapshot``), for
        ``gpushare mps``."""
        return _snapshot(self, check_processes)

    # ----------------------------------------------------------------- state

    @contextmanager
    def _store_fd(self, create: bool = True) -> Iterator[int]:
        """Root's daemon records, after moving there those an earlier release left in the
        users' directory (once per process: one listing of that directory)."""
        with self.store.dir_fd(create=create) as store_fd:
            if not self._migrated:
                self._migrated = True
                from gpushare.node.mps.migrate import migrate

                migrate(self.store, self.mps_dir, store_fd, self.lock_timeout)
            yield store_fd

    def _path(self, *parts: str) -> str:
        """A path among root's daemon records."""
        return self.store.path(*parts)

    @contextmanager
    def _locked(self, store_fd: int, key: str) -> Iterator[Lock]:
        # Inside a worker, never past its deadline (gpushare.node.phases).
        wait = time_left(self.lock_timeout)
        with locked(store_fd, key, self._path(key + ".lock"), wait) as lock:
            yield lock

    def _retire(self, store_fd: int, rec: DaemonRecord, lock: Lock) -> None:
        """Stop the daemon of a record without references, then remove its files."""
        try:
            gone = self.daemons.stop(rec)
        except MpsError as err:
            counters.note("mps_stop_failures")
            rec.stop_failed = str(err)
            self.store.write(store_fd, rec)
            raise
        self.dirs.remove(rec.key)
        self.store.remove(store_fd, rec.key)
        lock.remove = gone  # a lock file kept: the next reap ends its cgroup or scope
        LOG.info("stopped %s", rec.describe())

    def _undo_start(self, store_fd: int, rec: DaemonRecord, lock: Lock, job_id: int) -> None:
        """After a failed start: end what started, drop this job's reference, clean up."""
        rec.jobs.pop(str(job_id), None)
        try:
            gone = self.daemons.stop(rec)
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
            self.dirs.remove(rec.key)
        self.store.remove(store_fd, rec.key)
        lock.remove = gone


def _check_request(job_id: int, devices: tuple[MpsDevice, ...], mode: str,
                   share_percent: int) -> None:
    """What no daemon is started for, whoever asks: the node's own inputs are wrong."""
    if mode not in MODES:
        raise MpsError(f"MPS mode {mode!r} is unknown; use shared or private")
    if not devices:
        raise MpsError(f"job {job_id} asks for MPS without any GPU")
    for dev in devices:
        if not re.match(_UUID_PATTERN, dev.uuid):
            raise MpsError(f"device uuid {dev.uuid!r} is not a GPU-… or MIG-… uuid")
    if not 1 <= share_percent <= 100:
        raise MpsError(f"MPS share {share_percent}% is outside 1..100")


def _snapshot(mgr: MpsManager, check_processes: bool) -> list[dict[str, Any]]:
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
    strays = mgr.scan.strays() if check_processes else {}
    try:
        with mgr._store_fd(create=False) as store_fd:
            for key in sorted(set(mgr.store.keys(store_fd)) | set(strays)):
                entry: dict[str, Any] = {"key": key, "record": None, "error": "",
                                         "running": None, "strays": [], "busy": False}
                rec: Optional[DaemonRecord]
                try:
                    rec = mgr.store.read(store_fd, key)
                except MpsError as err:
                    entry["error"] = str(err)
                    rec = None
                entry["record"] = rec
                if rec is None and not entry["error"]:
                    entry["strays"] = sorted(strays.get(key, []))
                    entry["busy"] = not entry["strays"] and lock_held(store_fd, key)
                if rec is not None and check_processes:
                    pid = rec.daemon_pid or 0
                    entry["running"] = bool(pid) and mgr.daemons.is_ours(pid, rec,
                                                                  daemon_only=True)
                    entry["busy"] = not entry["running"] and lock_held(store_fd, key)
                entries.append(entry)
    except FileNotFoundError:
        return [{"key": key, "record": None, "error": "", "running": None,
                 "strays": sorted(pids), "busy": False}
                for key, pids in sorted(strays.items())]
    return entries
