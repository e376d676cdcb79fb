# SPDX-License-Identifier: GPL-2.0-or-later
"""MPS control daemon lifecycle: start on first use, reference-count, stop on last release.

Why one daemon per key: a control daemon runs one server per user and serialises users, so
each user gets their own daemon (own ``CUDA_MPS_PIPE_DIRECTORY``) per GPU or MIG slice:

* ``shared`` mode, key ``u<uid>-<device uuid>``: all jobs of one user on one device share a
  daemon, so their kernels run side by side; other users on the device have their own.
* ``private`` mode, key ``job<id>``: one daemon over the job's whole GPUs (e.g. MPI ranks).

State lives in ``<state_dir>/mps`` (root-owned 0755): ``<key>.json`` (the daemon's record:
device uuids, daemon pid, referencing jobs and their shares), ``<key>.lock`` (``flock``,
taken with a timeout) and ``<key>/{pipe,log}`` (owned by the user, 0700). Records survive a
slurmd restart; ``reap_stale`` drops references of jobs that no longer exist.

Limits: a client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` can only lower the daemon's value,
so the job environment carries the job's share, and the daemon's default caps a client that
unsets it. A shared daemon serves several jobs of one user with possibly different shares;
its cap is the sum of their shares (at most 100): what the scheduler granted that user on
that device. No client can then take more than its user was granted. The cap is re-applied
(``set_default_*`` for servers to come, ``set_*`` on running servers for new clients) when
jobs come and go. The pinned device memory limit follows the same rule (``mem_limit``:
proportional to the share, a fixed size, or off).

Every external command runs with a timeout (``gpushare.common.proc``); failures raise ``MpsError``
whose message names the device and daemon and says what to do; the caller logs it once.
Recovered trouble (a daemon ignoring ``quit``) is logged as a warning on ``gpushare.mps``.
"""

import errno
import fcntl
import json
import os
import re
import signal
import time
from contextlib import contextmanager, suppress
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence

from gpushare.common import proc, safefs
from gpushare.common.log import get_logger
from gpushare.node import counters
from gpushare.node.config import PluginConfig, parse_size

__all__ = ["MpsDevice", "MpsError", "MpsLease", "MpsManager"]

LOG = get_logger("gpushare.mps")

MODES = ("shared", "private")
PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL
# Sockets in a pipe directory may have names a little longer than "control" (a daemon
# may bind under a temporary name first, as the stand-in does); this much is kept free.
SOCKET_NAME_ROOM = 4
SERVER_PROGRAM = "nvidia-cuda-mps-server"
DAEMON_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_MIB = 1 << 20
_GIB = 1 << 30
_UUID_RE = re.compile(r"^(GPU|MIG)-[A-Za-z0-9/_-]{1,120}$")
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")  # what daemon_key() makes
_RECORD_VERSION = 1


class MpsError(RuntimeError):
    """MPS could not be set up or torn down; the message says which device, why, what to do.

    ``brief`` is the cause first and identifiers last, short enough for a node's drain
    reason (``sinfo -R``); the message keeps every detail for slurmd's log.
    """

    def __init__(self, message: str, brief: str = "") -> None:
        super().__init__(message)
        self.brief = brief or message


class MpsDevice(NamedTuple):
    """One GPU or MIG slice given to a job; ``gpu_index`` and ``label`` are for messages."""

    uuid: str
    gpu_index: int = 0  # NVML index of the (parent) GPU
    memory_total: int = 0
    label: str = ""

    def describe(self) -> str:
        return f"{self.label or 'GPU ' + str(self.gpu_index)} ({self.uuid})"

    def to_record(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "index": self.gpu_index, "memory_total": self.memory_total,
                "label": self.label}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> "MpsDevice":
        return cls(uuid=str(data["uuid"]), gpu_index=int(data.get("index", 0)),
                   memory_total=int(data.get("memory_total", 0)),
                   label=str(data.get("label", "")))


class MpsLease(NamedTuple):
    """What one job holds: a reference on one daemon and the environment its tasks get."""

    job_id: int
    key: str
    mode: str
    uid: int
    gid: int
    pipe_dir: str
    log_dir: str
    devices: tuple[MpsDevice, ...]
    share_percent: int
    daemon_pid: Optional[int]
    env: dict[str, str]

    def to_record(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "key": self.key, "mode": self.mode, "uid": self.uid,
            "gid": self.gid, "pipe_dir": self.pipe_dir, "log_dir": self.log_dir,
            "devices": [d.to_record() for d in self.devices],
            "share_percent": self.share_percent, "daemon_pid": self.daemon_pid,
            "env": dict(self.env),
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> "MpsLease":
        pid = data.get("daemon_pid")
        return cls(
            job_id=int(data["job_id"]), key=str(data["key"]), mode=str(data["mode"]),
            uid=int(data["uid"]), gid=int(data["gid"]), pipe_dir=str(data["pipe_dir"]),
            log_dir=str(data["log_dir"]),
            devices=tuple(MpsDevice.from_record(d) for d in data["devices"]),
            share_percent=int(data["share_percent"]),
            daemon_pid=None if pid is None else int(pid),
            env={str(k): str(v) for k, v in data.get("env", {}).items()},
        )


def format_size(size: int) -> str:
    """MPS size syntax: whole GiB as ``<n>G``, otherwise ``<n>M`` (rounded down, >= 1M)."""
    if size >= _GIB and size % _GIB == 0:
        return f"{size // _GIB}G"
    return f"{max(1, size // _MIB)}M"


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", text)


def daemon_key(mode: str, uid: int, job_id: int, devices: Sequence[MpsDevice]) -> str:
    """The name of the daemon a job uses: per user and device set, or per job."""
    if mode == "private":
        return f"job{job_id}"
    uuids = sorted(d.uuid for d in devices)
    if len(uuids) == 1:
        return f"u{uid}-{_sanitize(uuids[0])}"
    import hashlib  # only for multi-GPU daemons; its OpenSSL load is the slowest import here

    digest = hashlib.sha256("\n".join(uuids).encode()).hexdigest()[:16]
    return f"u{uid}-multi-{digest}"


class MpsManager:
    """Starts, shares and stops MPS control daemons for jobs on this node (runs as root)."""

    def __init__(self, config: PluginConfig, *, lock_timeout: Optional[float] = None,
                 proc_root: str = "/proc") -> None:
        self.config = config
        self.timeout = float(config.timeout)
        self.lock_timeout = lock_timeout if lock_timeout is not None else max(
            30.0, 6 * self.timeout)
        self.proc_root = proc_root
        self.mps_dir = config.mps_dir

    # ----------------------------------------------------------------- public API

    def acquire(self, job_id: int, uid: int, gid: int, devices: Sequence[MpsDevice],
                mode: str = "shared", share_percent: int = 100) -> MpsLease:
        """Take a reference on the job's daemon, starting it if needed; idempotent per job."""
        devices = tuple(devices)
        self._check_request(job_id, uid, devices, mode, share_percent)
        key = daemon_key(mode, uid, job_id, devices)
        with self._mps_dir_fd() as mps_fd, self._locked(mps_fd, key) as lock:
            rec = self._read_record(mps_fd, key)
            if rec is not None and str(job_id) in rec["jobs"]:
                return self._lease(rec, job_id)
            if rec is not None and (rec["uid"] != uid or rec["mode"] != mode):
                raise MpsError(f"MPS record {self._path(key)}.json belongs to uid "
                               f"{rec['uid']} mode {rec['mode']}; remove it after stopping "
                               "its daemon")
            if rec is not None and rec.get("daemon_pid") and self._is_ours(
                    int(rec["daemon_pid"]), rec):
                rec["jobs"][str(job_id)] = {"share_percent": share_percent}
                self._write_record(mps_fd, rec)
                self._apply_caps(mps_fd, rec)
                return self._lease(rec, job_id)
            if rec is not None:
                LOG.warning("%s is not running any more; starting it again",
                            self._describe(rec))
                self._stop_daemon(rec)
            else:
                rec = self._new_record(key, mode, uid, gid, devices)
            rec["jobs"][str(job_id)] = {"share_percent": share_percent}
            rec["daemon_pid"] = None
            rec["dirs_made"] = False
            self._write_record(mps_fd, rec)
            try:
                self._start_daemon(mps_fd, rec)
            except BaseException:
                self._undo_start(mps_fd, rec, lock, job_id)
                raise
            self._write_record(mps_fd, rec)
            return self._lease(rec, job_id)

    def release(self, job_id: int, hint: Optional[str] = None) -> list[str]:
        """Drop the job's references; stop daemons nobody uses. Idempotent.

        ``hint`` is the daemon key the job's lease names: when that record holds the job,
        only it is read, not every daemon record of the node. Returns the keys of the
        daemons stopped. Raises MpsError (after doing everything else) when a daemon cannot
        be stopped.
        """
        stopped: list[str] = []
        errors: list[MpsError] = []
        with self._mps_dir_fd() as mps_fd:
            if hint and self._holds(mps_fd, hint, job_id):
                keys = [hint]
            else:
                keys = self._keys_of_job(mps_fd, job_id)
            for key in keys:
                with self._locked(mps_fd, key) as lock:
                    rec = self._read_record(mps_fd, key)
                    if rec is None or str(job_id) not in rec["jobs"]:
                        continue
                    try:
                        if self._drop_jobs(mps_fd, rec, lock, [str(job_id)]):
                            stopped.append(key)
                    except MpsError as err:
                        errors.append(err)
        if errors:
            raise _joined(errors)
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
        with self._mps_dir_fd() as mps_fd:
            keys = self._all_keys(mps_fd)
            if strays:
                keys = sorted(set(keys) | set(self._strays()))
            for key in keys:
                # A daemon whose jobs are all alive is skipped: taking every GPU's lock
                # would queue each prolog behind every other GPU's daemon start.
                seen = self._peek(mps_fd, key)
                if seen and seen["jobs"] and all(job_alive(int(j)) for j in seen["jobs"]):
                    continue
                with self._locked(mps_fd, key) as lock:
                    rec = self._read_record(mps_fd, key)
                    if rec is None:
                        try:
                            if self._stop_strays(key):
                                stopped.append(key)
                        except MpsError as err:
                            errors.append(err)
                            continue
                        safefs.remove_tree_at(mps_fd, key)
                        lock.remove = True
                        continue
                    dead = [jid for jid in rec["jobs"] if not job_alive(int(jid))]
                    for jid in dead:
                        counters.note("mps_reaped_references")
                        LOG.info("dropping MPS reference of vanished job %s on %s", jid,
                                 self._describe(rec))
                    if rec["jobs"] and not dead:
                        continue
                    try:
                        if self._drop_jobs(mps_fd, rec, lock, dead):
                            stopped.append(key)
                    except MpsError as err:
                        errors.append(err)
        if errors:
            raise _joined(errors)
        return stopped

    def _drop_jobs(self, mps_fd: int, rec: dict[str, Any], lock: "_Lock",
                   job_ids: Sequence[str]) -> bool:
        """Remove jobs from a daemon (lock held): lower its caps to the jobs left, or stop
        it when none are left. True when it was stopped; MpsError when it cannot be."""
        for jid in job_ids:
            del rec["jobs"][jid]
        if not rec["jobs"]:
            self._retire(mps_fd, rec, lock)
            return True
        self._write_record(mps_fd, rec)
        self._apply_caps(mps_fd, rec)
        return False

    def records(self) -> list[dict[str, Any]]:
        """All daemon records on this node (for inspection commands)."""
        return [entry["record"] for entry in self.snapshot(check_processes=False)
                if entry["record"] is not None]

    def snapshot(self, check_processes: bool = True) -> list[dict[str, Any]]:
        """Every daemon key of the node, read without locks (records are replaced whole).

        Each entry: ``key``; ``record`` (None for a directory or lock without one, or
        for MPS processes found in a daemon directory that is gone); ``error`` (why the
        record is unreadable); ``running`` (the recorded daemon is alive and ours; None
        when processes were not checked); ``strays`` (pids of MPS processes in the
        directory of a key without a record); ``busy`` (the key has no record or no
        running daemon, and its lock is held: a prolog or epilog is starting or stopping
        it right now). For ``gpushare mps``.
        """
        entries: list[dict[str, Any]] = []
        strays = self._strays() if check_processes else {}
        try:
            with self._mps_dir_fd(create=False) as mps_fd:
                for key in sorted(set(self._all_keys(mps_fd)) | set(strays)):
                    entry: dict[str, Any] = {"key": key, "record": None, "error": "",
                                             "running": None, "strays": [], "busy": False}
                    try:
                        rec = self._read_record(mps_fd, key)
                    except MpsError as err:
                        entry["error"] = str(err)
                        rec = None
                    entry["record"] = rec
                    if rec is None and not entry["error"]:
                        entry["strays"] = sorted(strays.get(key, []))
                        entry["busy"] = not entry["strays"] and self._lock_held(mps_fd, key)
                    if rec is not None and check_processes:
                        pid = rec.get("daemon_pid") or 0
                        entry["running"] = bool(pid) and self._is_ours(int(pid), rec,
                                                                       daemon_only=True)
                        entry["busy"] = not entry["running"] and self._lock_held(mps_fd, key)
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
        if uid == 0:
            raise MpsError("MPS daemons never run as root; MPS sharing is not offered to "
                           "jobs of root")
        if not devices:
            raise MpsError(f"job {job_id} asks for MPS without any GPU")
        for dev in devices:
            if not _UUID_RE.match(dev.uuid):
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

    def _path(self, *parts: str) -> str:
        return os.path.join(self.mps_dir, *parts)

    @contextmanager
    def _mps_dir_fd(self, create: bool = True) -> Iterator[int]:
        try:
            fd = safefs.open_root_dir(self.mps_dir, create=create)
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS state directory refused: {err}") from None
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self, mps_fd: int, key: str) -> "Iterator[_Lock]":
        lock = _Lock(mps_fd, key + ".lock", self._path(key + ".lock"), self.lock_timeout)
        lock.acquire()
        try:
            yield lock
        finally:
            lock.release()

    def _lock_held(self, mps_fd: int, key: str) -> bool:
        """Whether someone holds ``key``'s lock now (asked without waiting or creating it)."""
        try:
            fd = os.open(key + ".lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=mps_fd)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # releases the shared lock at once
        return False

    def _read_record(self, mps_fd: int, key: str) -> Optional[dict[str, Any]]:
        try:
            data = safefs.read_small_file_at(mps_fd, key + ".json")
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS record {self._path(key)}.json refused: {err}") from None
        if data is None:
            return None
        try:
            rec = json.loads(data.decode())
            if rec.get("version") != _RECORD_VERSION or rec.get("key") != key:
                raise ValueError("unknown version or key")
            rec["jobs"] = dict(rec["jobs"])
            return rec
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise MpsError(f"MPS record {self._path(key)}.json is unreadable ({err}); stop "
                           "any daemon using that directory and remove it") from None

    def _write_record(self, mps_fd: int, rec: dict[str, Any]) -> None:
        payload = json.dumps(rec, indent=1, sort_keys=True).encode()
        safefs.write_file_atomic_at(mps_fd, rec["key"] + ".json", payload, 0o644)

    def _all_keys(self, mps_fd: int) -> list[str]:
        keys = set()
        for name in os.listdir(mps_fd):
            if name.startswith("."):
                continue
            base = name[:-5] if name.endswith((".json", ".lock")) else name
            keys.add(base)
        return sorted(keys)

    def _peek(self, mps_fd: int, key: str) -> Optional[dict[str, Any]]:
        """A daemon's record read without its lock (records are replaced atomically); None
        when it is absent or unreadable, which the locked read then deals with."""
        try:
            return self._read_record(mps_fd, key)
        except MpsError:
            return None

    def _holds(self, mps_fd: int, key: str, job_id: int) -> bool:
        """Whether daemon ``key``'s record lists the job (a look without the lock)."""
        if not _KEY_RE.match(key):
            return False
        rec = self._peek(mps_fd, key)
        return rec is not None and str(job_id) in rec["jobs"]

    def _keys_of_job(self, mps_fd: int, job_id: int) -> list[str]:
        keys = []
        for name in os.listdir(mps_fd):
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                rec = self._read_record(mps_fd, name[:-5])
            except MpsError as err:
                LOG.warning("%s", err)
                continue
            if rec is not None and str(job_id) in rec["jobs"]:
                keys.append(name[:-5])
        return keys

    def _new_record(self, key: str, mode: str, uid: int, gid: int,
                    devices: tuple[MpsDevice, ...]) -> dict[str, Any]:
        return {
            "version": _RECORD_VERSION, "key": key, "mode": mode, "uid": uid, "gid": gid,
            "devices": [d.to_record() for d in devices],
            "pipe_dir": self._path(key, "pipe"), "log_dir": self._path(key, "log"),
            "daemon_pid": None, "started_at": None, "jobs": {}, "caps": None,
        }

    # ----------------------------------------------------------------- limits

    def _devices(self, rec: dict[str, Any]) -> list[MpsDevice]:
        return [MpsDevice.from_record(d) for d in rec["devices"]]

    def _mem_limit(self, dev: MpsDevice, percent: float) -> Optional[int]:
        setting = self.config.mem_limit
        if setting == "off":
            return None
        if setting == "proportional":
            if dev.memory_total <= 0:
                return None
            return max(_MIB, int(dev.memory_total * percent / 100) // _MIB * _MIB)
        size = parse_size(setting)
        return min(size, dev.memory_total) if dev.memory_total > 0 else size

    def _caps(self, rec: dict[str, Any]) -> dict[str, Any]:
        """The daemon-wide limits for the jobs now referencing it (see module docstring)."""
        total = sum(int(j["share_percent"]) for j in rec["jobs"].values())
        percent = min(100, total)
        if rec["mode"] == "private":
            return {"percent": percent, "mem": {}}
        mem = {}
        for i, dev in enumerate(self._devices(rec)):
            size = self._mem_limit(dev, percent)
            if size is not None:
                mem[str(i)] = format_size(size)
        return {"percent": percent, "mem": mem}

    def _cap_commands(self, caps: dict[str, Any]) -> list[str]:
        cmds = [f"set_default_active_thread_percentage {caps['percent']}"]
        cmds += [f"set_default_device_pinned_mem_limit {i} {size}"
                 for i, size in sorted(caps["mem"].items())]
        return cmds

    def _apply_caps(self, mps_fd: int, rec: dict[str, Any]) -> None:
        """Give a running daemon the caps of the jobs now in ``rec`` (already written).

        The record's ``caps`` says what the daemon was last told: that is what is compared
        (a failed change is retried by the next join or leave) and what ``gpushare mps``
        shows. A failure is logged, not raised: the jobs' own limits still hold.
        """
        caps = self._caps(rec)
        if caps == rec.get("caps"):
            return
        try:
            result = self._control(rec, [*self._cap_commands(caps), "get_server_list"])
            servers = [int(w) for w in result.stdout.split() if w.isdigit()]
            per_server = []
            for pid in servers:
                per_server.append(f"set_active_thread_percentage {pid} {caps['percent']}")
                per_server += [f"set_device_pinned_mem_limit {pid} {i} {size}"
                               for i, size in sorted(caps["mem"].items())]
            if per_server:
                self._control(rec, per_server)
        except MpsError as err:
            LOG.warning("%s", err)
            return
        rec["caps"] = caps
        self._write_record(mps_fd, rec)

    def _lease(self, rec: dict[str, Any], job_id: int) -> MpsLease:
        share = int(rec["jobs"][str(job_id)]["share_percent"])
        devices = tuple(self._devices(rec))
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": rec["pipe_dir"],
            "CUDA_MPS_LOG_DIRECTORY": rec["log_dir"],
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(devices))),
        }
        if rec["mode"] == "shared" or share < 100:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share)
        if rec["mode"] == "shared":
            limits = []
            for i, dev in enumerate(devices):
                size = self._mem_limit(dev, share)
                if size is not None:
                    limits.append(f"{i}={format_size(size)}")
            if limits:
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
        pid = rec.get("daemon_pid")
        return MpsLease(
            job_id=job_id, key=rec["key"], mode=rec["mode"], uid=rec["uid"], gid=rec["gid"],
            pipe_dir=rec["pipe_dir"], log_dir=rec["log_dir"], devices=devices,
            share_percent=share, daemon_pid=None if pid is None else int(pid), env=env,
        )

    # ----------------------------------------------------------------- daemon

    def _describe(self, rec: dict[str, Any]) -> str:
        devs = ", ".join(d.describe() for d in self._devices(rec)) or "devices unknown"
        pid = rec.get("daemon_pid")
        return (f"MPS control daemon {rec['key']} (pid {pid if pid else 'unknown'}, "
                f"pipe dir {rec['pipe_dir']}) on {devs}")

    def _daemon_env(self, rec: dict[str, Any]) -> dict[str, str]:
        return {
            "PATH": DAEMON_PATH,
            "CUDA_VISIBLE_DEVICES": ",".join(d["uuid"] for d in rec["devices"]),
            "CUDA_MPS_PIPE_DIRECTORY": rec["pipe_dir"],
            "CUDA_MPS_LOG_DIRECTORY": rec["log_dir"],
        }

    def _client_env(self, rec: dict[str, Any]) -> dict[str, str]:
        return {
            "PATH": DAEMON_PATH,
            "CUDA_MPS_PIPE_DIRECTORY": rec["pipe_dir"],
            "CUDA_MPS_LOG_DIRECTORY": rec["log_dir"],
        }

    def _control(self, rec: dict[str, Any], commands: list[str]) -> proc.Result:
        """Send control commands through the daemon's pipe, as the daemon's user."""
        program = self._program()
        try:
            result = proc.run([program], input_text="\n".join(commands) + "\n",
                              env=self._client_env(rec), uid=rec["uid"], gid=rec["gid"],
                              timeout=self.timeout)
        except proc.ProcError as err:
            counters.command_error(err)
            raise MpsError(f"{self._describe(rec)}: control command {commands[0]!r} "
                           f"failed: {err}") from None
        if result.returncode != 0:
            raise MpsError(f"{self._describe(rec)}: control command {commands[0]!r} failed "
                           f"(exit {result.returncode}): {result.output or 'no output'}")
        return result

    def _start_daemon(self, mps_fd: int, rec: dict[str, Any]) -> None:
        program = self._program()
        key = rec["key"]
        what = ", ".join(MpsDevice.from_record(d).describe() for d in rec["devices"])
        short = ", ".join(MpsDevice.from_record(d).label or d["uuid"] for d in rec["devices"])
        control = os.fsencode(os.path.join(rec["pipe_dir"], "control"))
        if len(control) + SOCKET_NAME_ROOM > SOCKET_PATH_MAX:
            # The daemon could not even listen: say so now, not after the whole timeout.
            room = SOCKET_PATH_MAX - SOCKET_NAME_ROOM - (
                len(control) - len(os.fsencode(self.config.state_dir)))
            raise MpsError(f"cannot start MPS on {what}: its control socket "
                           f"{os.fsdecode(control)} would be {len(control)} bytes, too close "
                           f"to the {SOCKET_PATH_MAX} a Unix socket path may have; give "
                           f"plugstack.conf a state_dir= of at most {room} characters "
                           "(e.g. /run/gpushare or /run/gpushare/%n)",
                           brief=f"MPS start failed: state_dir= too long for MPS's control "
                           f"socket ({short})")
        self._make_dirs(mps_fd, rec)

        def failed(cause: str, detail: str) -> MpsError:
            # The daemon's directory goes with the failed start: its log's last lines
            # travel in the message instead of a path that will not exist.
            return MpsError(f"cannot start MPS on {what}: {detail}{self._log_tail(mps_fd, key)}",
                            brief=f"MPS start failed: {cause} ({short}, daemon {key})")

        try:
            result = proc.run([program, "-d"], env=self._daemon_env(rec), uid=rec["uid"],
                              gid=rec["gid"], timeout=self.timeout)
        except proc.CommandNotFound as err:
            raise MpsError(f"cannot start MPS on {what}: {err}; install the NVIDIA MPS "
                           "tools or fix plugstack mps_control=",
                           brief=f"MPS start failed: {program} missing ({short})") from None
        except proc.CommandTimeout as err:
            counters.command_error(err)
            raise failed(f"no answer within {self.timeout:g} s, killed",
                         f"{err}; check the GPU (nvidia-smi) and the daemon's log") from None
        except proc.ProcError as err:
            counters.command_error(err)
            raise failed(str(err), f"{err}; check the GPU and the daemon's log") from None
        if result.returncode != 0:
            raise failed(f"{os.path.basename(program)} -d exit {result.returncode}",
                         f"{program} -d exited with status {result.returncode}: "
                         f"{result.output or 'no output'}")
        rec["started_at"] = time.time()
        with self._user_dir_fd(mps_fd, key, "pipe") as pipe_fd:
            deadline = time.monotonic() + self.timeout
            pause = 0.002  # a daemon is usually listening within milliseconds
            while not _exists_at(pipe_fd, "control"):
                if time.monotonic() > deadline:
                    counters.timed_out("daemon_start")
                    raise failed(f"no control socket within {self.timeout:g} s",
                                 f"the daemon created no control socket in "
                                 f"{rec['pipe_dir']} within {self.timeout:g} s")
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
            rec["daemon_pid"] = self._find_daemon_pid(pipe_fd, rec)
        caps = self._caps(rec)
        self._control(rec, [*self._cap_commands(caps), "get_server_list"])
        rec["caps"] = caps
        counters.note("mps_daemon_starts")
        LOG.info("started %s for jobs %s", self._describe(rec), ",".join(rec["jobs"]))

    def _log_tail(self, mps_fd: int, key: str, lines: int = 3) -> str:
        """``; control.log ends: ...`` with the daemon log's last lines ("" without one).

        The log directory belongs to the job's user: the file is read without following
        a link, only when it is a regular file, and at most 64 KiB of it.
        """
        try:
            with self._user_dir_fd(mps_fd, key, "log") as log_fd:
                data = safefs.read_small_file_at(log_fd, "control.log", 1 << 16)
        except (OSError, safefs.UnsafePathError):
            return ""
        text = [line.strip() for line in (data or b"").decode("utf-8", "replace").splitlines()
                if line.strip()]
        return f"; control.log ends: {' | '.join(text[-lines:])}" if text else ""

    def _make_dirs(self, mps_fd: int, rec: dict[str, Any]) -> None:
        key = rec["key"]
        try:
            try:
                fd = safefs.open_dir_at(mps_fd, key, self._path(key), root_owned=True)
            except FileNotFoundError:
                pass
            else:
                os.close(fd)
                LOG.info("removing leftover MPS directory %s", self._path(key))
                safefs.remove_tree_at(mps_fd, key)
            safefs.make_owned_dir(mps_fd, key, self._path(key), 0, 0, 0o755)
            rec["dirs_made"] = True
            key_fd = safefs.open_dir_at(mps_fd, key, self._path(key), root_owned=True)
            try:
                for name in ("pipe", "log"):
                    safefs.make_owned_dir(key_fd, name, self._path(key, name), rec["uid"],
                                          rec["gid"], 0o700)
            finally:
                os.close(key_fd)
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS directory refused: {err}") from None

    @contextmanager
    def _user_dir_fd(self, mps_fd: int, key: str, name: str) -> Iterator[int]:
        """The daemon's ``pipe`` or ``log`` directory (the user's), reached through its
        root-owned key directory without following a link."""
        key_fd = safefs.open_dir_at(mps_fd, key, self._path(key), root_owned=True)
        try:
            dir_fd = safefs.open_dir_at(key_fd, name, self._path(key, name))
        finally:
            os.close(key_fd)
        try:
            yield dir_fd
        finally:
            os.close(dir_fd)

    def _find_daemon_pid(self, pipe_fd: int, rec: dict[str, Any]) -> Optional[int]:
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

    def _programs(self) -> set[str]:
        path = self.config.mps_control
        real = os.path.realpath(path)
        return {path, real, os.path.join(os.path.dirname(real), SERVER_PROGRAM),
                os.path.join(os.path.dirname(path), SERVER_PROGRAM)}

    def _read_proc(self, pid: int, name: str) -> Optional[bytes]:
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

    def _live_status(self, pid: int) -> Optional[bytes]:
        """``/proc/<pid>/status`` of a live process; None when it is gone or a zombie."""
        status = self._read_proc(pid, "status")
        state = re.search(rb"^State:\s+([A-Z])", status or b"", re.MULTILINE)
        if not state or state.group(1) in (b"Z", b"X"):
            return None
        return status

    def _alive(self, pid: int) -> bool:
        return self._live_status(pid) is not None

    def _is_ours(self, pid: int, rec: dict[str, Any], daemon_only: bool = False) -> bool:
        """True when ``pid`` is a live MPS daemon/server of this record's user and pipe dir."""
        if pid <= 1:
            return False
        # One read answers both "alive" and "whose": this runs for every process on the
        # node when a daemon stops.
        status = self._live_status(pid)
        if status is None:
            return False
        uid_line = re.search(rb"^Uid:\s+(\d+)", status, re.MULTILINE)
        if not uid_line or int(uid_line.group(1)) != rec["uid"]:
            return False
        environ = (self._read_proc(pid, "environ") or b"").split(b"\0")
        if ("CUDA_MPS_PIPE_DIRECTORY=" + rec["pipe_dir"]).encode() not in environ:
            return False
        programs = {self.config.mps_control, os.path.realpath(self.config.mps_control)}
        if not daemon_only:
            programs = self._programs()
        return self._runs_one_of(pid, programs)

    def _runs_one_of(self, pid: int, programs: set[str]) -> bool:
        try:
            exe = os.readlink(os.path.join(self.proc_root, str(pid), "exe"))
        except OSError:
            exe = ""
        argv = [a.decode(errors="replace")
                for a in (self._read_proc(pid, "cmdline") or b"").split(b"\0")[:2]]
        return exe in programs or any(a in programs for a in argv)

    def _strays(self, key: Optional[str] = None) -> dict[str, list[int]]:
        """Live MPS processes (the configured program or its server) whose pipe directory
        is one of this node's daemon directories, by key (only ``key``'s when given).

        Whether a record claims them is for the caller: for a key with a record they are
        simply its daemon and servers.
        """
        prefix = f"CUDA_MPS_PIPE_DIRECTORY={self.mps_dir}/".encode()
        programs = self._programs()
        found: dict[str, list[int]] = {}
        for name in os.listdir(self.proc_root):
            if not name.isdigit() or int(name) <= 1:
                continue
            pid = int(name)
            environ = self._read_proc(pid, "environ") or b""
            if prefix not in environ:
                continue
            var = next((v for v in environ.split(b"\0") if v.startswith(prefix)), b"")
            found_key, sep, rest = var[len(prefix):].decode(errors="replace").partition("/")
            if (rest != "pipe" or not sep or not _KEY_RE.match(found_key)
                    or (key is not None and found_key != key)):
                continue
            if self._live_status(pid) is not None and self._runs_one_of(pid, programs):
                found.setdefault(found_key, []).append(pid)
        return found

    def _stop_strays(self, key: str) -> bool:
        """End the MPS processes still running in a daemon directory without a record,
        user by user: ``quit`` through the pipe where it still answers, then signals, as
        for any daemon. True when there were some."""
        pids = self._strays(key).get(key, [])
        by_user: dict[tuple[int, int], list[int]] = {}
        for pid in pids:
            status = self._live_status(pid) or b""
            uid = re.search(rb"^Uid:\s+(\d+)", status, re.MULTILINE)
            gid = re.search(rb"^Gid:\s+(\d+)", status, re.MULTILINE)
            if not (uid and gid):
                continue  # gone meanwhile
            if int(uid.group(1)) == 0:
                # gpushare never runs MPS as root: root's own process is left to root, and
                # no control command runs as root through a user's pipe directory.
                raise MpsError(f"pid {pid} runs MPS as root in {self._path(key, 'pipe')}, "
                               "which gpushare never does; end it by hand")
            by_user.setdefault((int(uid.group(1)), int(gid.group(1))), []).append(pid)
        for (owner_uid, owner_gid), group in sorted(by_user.items()):
            rec: dict[str, Any] = {"key": key, "uid": owner_uid, "gid": owner_gid, "devices": [],
                                   "pipe_dir": self._path(key, "pipe"),
                                   "log_dir": self._path(key, "log"), "daemon_pid": None}
            rec["daemon_pid"] = next((p for p in sorted(group)
                                      if self._is_ours(p, rec, daemon_only=True)), None)
            LOG.warning("%s has no record; stopping it and its servers (pids %s)",
                        self._describe(rec), " ".join(map(str, sorted(group))))
            self._stop_daemon(rec)
        return bool(pids)

    def _leftovers(self, rec: dict[str, Any]) -> list[int]:
        """Live processes that are this daemon or its servers (by uid, pipe dir, program)."""
        pids = []
        for name in os.listdir(self.proc_root):
            if name.isdigit() and self._is_ours(int(name), rec):
                pids.append(int(name))
        return pids

    def _send_signal(self, pid: int, sig: int) -> None:
        with suppress(ProcessLookupError):
            os.kill(pid, sig)

    def _wait_gone(self, pids: Sequence[int], rec: dict[str, Any], seconds: float) -> bool:
        """Wait until none of ``pids`` (each ours when chosen) exists any more.

        A process that is exiting stops looking like ours (its environ is gone) before it
        is gone, so existence is what is waited for; signals are still sent only after
        ``_is_ours`` (a pid reused meanwhile costs a wait, never a wrong kill).
        """
        deadline = time.monotonic() + seconds
        while True:
            alive = [pid for pid in pids if self._alive(pid)]
            if not alive:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Woken by the exit itself where pidfds exist; re-checked at least every 0.1 s.
            if proc.wait_for_exit(alive[0], min(left, 0.1)) is None:
                time.sleep(min(left, 0.02))

    def _stop_daemon(self, rec: dict[str, Any]) -> None:
        """quit through the pipe, then SIGTERM/SIGKILL what is left, verified pid by pid."""
        pid = rec.get("daemon_pid")
        if pid and self._is_ours(int(pid), rec):
            try:
                self._control(rec, ["quit"])
            except MpsError as err:
                LOG.warning("%s; ending it with signals", err)
            else:
                if not self._wait_gone([int(pid)], rec, self.timeout):
                    counters.timed_out("daemon_quit")
                    LOG.warning("%s ignored quit for %g s; ending it with signals",
                                self._describe(rec), self.timeout)
        left = self._leftovers(rec)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not left:
                break
            for victim in left:
                if self._is_ours(victim, rec):
                    LOG.warning("sending %s to pid %d left by %s", sig.name, victim,
                                self._describe(rec))
                    self._send_signal(victim, sig)
            self._wait_gone(left, rec, min(self.timeout, 5.0))
            left = [p for p in left if self._is_ours(p, rec)]
        if left:
            raise MpsError(f"cannot stop {self._describe(rec)}: pids "
                           f"{' '.join(map(str, left))} survive SIGKILL; drain this node and "
                           "check the GPU",
                           brief=f"MPS stop failed: pids {' '.join(map(str, left))} survive "
                           f"SIGKILL (daemon {rec['key']})")

    def _retire(self, mps_fd: int, rec: dict[str, Any], lock: "_Lock") -> None:
        """Stop the daemon of a record without references, then remove its files."""
        try:
            self._stop_daemon(rec)
        except MpsError as err:
            counters.note("mps_stop_failures")
            rec["stop_failed"] = str(err)
            self._write_record(mps_fd, rec)
            raise
        safefs.remove_tree_at(mps_fd, rec["key"])
        safefs.remove_file_at(mps_fd, rec["key"] + ".json")
        lock.remove = True
        LOG.info("stopped %s", self._describe(rec))

    def _undo_start(self, mps_fd: int, rec: dict[str, Any], lock: "_Lock",
                    job_id: int) -> None:
        """After a failed start: end what started, drop this job's reference, clean up."""
        rec["jobs"].pop(str(job_id), None)
        try:
            self._stop_daemon(rec)
        except MpsError as err:
            counters.note("mps_stop_failures")
            LOG.error("%s", err)
            rec["stop_failed"] = str(err)
            self._write_record(mps_fd, rec)
            return
        if rec["jobs"]:
            rec["daemon_pid"] = None
            self._write_record(mps_fd, rec)
            return
        if rec.pop("dirs_made", False):
            safefs.remove_tree_at(mps_fd, rec["key"])
        safefs.remove_file_at(mps_fd, rec["key"] + ".json")
        lock.remove = True


def _joined(errors: Sequence[MpsError]) -> MpsError:
    """One error for several daemons: every message, the first one's brief."""
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return MpsError("; ".join(map(str, errors)), brief=errors[0].brief + more)


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


class _Lock:
    """An ``flock`` on ``<key>.lock`` taken with a deadline, never waiting forever.

    The file may be unlinked by the holder when the key goes away; a waiter that then gets
    the lock on the unlinked file notices (inode changed) and starts over.
    """

    def __init__(self, dir_fd: int, name: str, path: str, timeout: float) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.path = path
        self.timeout = timeout
        self.fd: Optional[int] = None
        self.remove = False

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        # Short, capped pauses: jobs starting together on one GPU queue here behind a
        # daemon start, and a long backoff would leave the lock free while they sleep.
        delay = 0.001
        while True:
            fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=self.dir_fd)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as err:
                        if err.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                    if time.monotonic() > deadline:
                        counters.timed_out("lock")
                        raise MpsError(f"MPS lock {self.path} still held after "
                                       f"{self.timeout:g} s; another prolog or epilog is "
                                       "stuck — find it with: fuser " + self.path)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.01)
                try:
                    current = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    current = None
                if current is not None and current.st_ino == os.fstat(fd).st_ino:
                    self.fd = fd
                    return
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        if self.remove:
            safefs.remove_file_at(self.dir_fd, self.name)
        os.close(self.fd)
        self.fd = None
