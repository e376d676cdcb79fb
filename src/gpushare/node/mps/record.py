# SPDX-License-Identifier: GPL-2.0-or-later
"""The daemon record: what survives a slurmd restart about one MPS control daemon.

``<state_dir>/daemons/<key>.json`` (root's, 0600, replaced whole) names the daemon's devices, its
pid and the caps it was last told. The jobs referencing it are files beside it,
``<key>.jobs/<job id>`` holding the job's share in percent: the C glue's epilog drops a job
that leaves other jobs and the caps as they were by unlinking its file, without an
interpreter (``slurm_spank_job_epilog`` in ``spank/gpushare_spank.c``). Both change only
under the daemon's lock.

A record carries ``version``; ``DaemonRecord.from_json`` validates every field and reads the
records earlier releases wrote (version 1 kept the jobs in the record; fields added since
take their defaults), so a node upgraded while jobs run keeps serving and stopping their
daemons. A record of an unknown version is refused, never guessed at.
"""

import json
import os
import re
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any, Iterator, NamedTuple, Optional, Sequence

from gpushare.common import safefs
from gpushare.common.log import get_logger
from gpushare.node.mps.errors import MpsError
from gpushare.node.mps.limits import Limits

LOG = get_logger("gpushare.mps")

RECORD_VERSION = 2
# Version 1 kept the jobs in the record itself; it is read, and written back as version 2.
READ_VERSIONS = (1, 2)
JOBS_SUFFIX = ".jobs"  # <key>.jobs/<job id>: one file per job referencing the daemon
TICKETS = "tickets"  # join tickets (gpushare.node.ticket), beside the daemons: not a key
# The start tickets of an earlier release (read by nothing now): removed as found.
_OLD_START_PREFIX = "start."
MODES = ("shared", "private")
# What daemon_key() makes; compiled on first use (re caches it), not by every import.
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$"


class MpsDevice(NamedTuple):
    """One GPU or MIG slice given to a job; ``gpu_index`` and ``label`` are for messages.
    ``device_files``: what its daemon's scope may open (``/dev/nvidia<minor>``, and for a
    MIG slice its ``nvidia-caps`` files), as NVML resolved them; () where unknown (a record
    an earlier release wrote: its daemon's scope then gets no device policy)."""

    uuid: str
    gpu_index: int = 0  # NVML index of the (parent) GPU
    memory_total: int = 0
    label: str = ""
    device_files: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.label or 'GPU ' + str(self.gpu_index)} ({self.uuid})"

    def to_record(self) -> dict[str, Any]:
        data: dict[str, Any] = {"uuid": self.uuid, "index": self.gpu_index,
                                "memory_total": self.memory_total, "label": self.label}
        if self.device_files:  # absent where unknown, as an earlier release wrote it
            data["device_files"] = list(self.device_files)
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> "MpsDevice":
        files = data.get("device_files", [])
        if not isinstance(files, list) or not all(
                isinstance(f, str) and f.startswith("/") for f in files):
            raise ValueError("device_files is not a list of paths")
        return cls(uuid=str(data["uuid"]), gpu_index=int(data.get("index", 0)),
                   memory_total=int(data.get("memory_total", 0)),
                   label=str(data.get("label", "")), device_files=tuple(files))


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


class DaemonRecord:
    """One daemon as its record keeps it (a plain class: the prolog's path stays light).

    ``jobs`` maps each referencing job id (text, as in the file) to its share in percent;
    ``caps`` is what the daemon was last told (None before it was told anything);
    ``dirs_made`` says whether this start made the daemon's directory; ``stop_failed`` is
    why the daemon could not be stopped, once that happened.
    """

    __slots__ = ("caps", "daemon_pid", "devices", "dirs_made", "gid", "jobs", "key", "log_dir",
                 "mode", "pipe_dir", "started_at", "stop_failed", "uid")

    def __init__(self, key: str, mode: str, uid: int, gid: int,
                 devices: tuple[MpsDevice, ...], pipe_dir: str, log_dir: str, *,
                 daemon_pid: Optional[int] = None, started_at: Optional[float] = None,
                 jobs: Optional[dict[str, int]] = None, caps: Optional[Limits] = None,
                 dirs_made: bool = False, stop_failed: Optional[str] = None) -> None:
        self.key = key
        self.mode = mode
        self.uid = uid
        self.gid = gid
        self.devices = devices
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.daemon_pid = daemon_pid
        self.started_at = started_at
        self.jobs: dict[str, int] = {} if jobs is None else jobs
        self.caps = caps
        self.dirs_made = dirs_made
        self.stop_failed = stop_failed

    def describe(self) -> str:
        devs = ", ".join(d.describe() for d in self.devices) or "devices unknown"
        pid = self.daemon_pid
        return (f"MPS control daemon {self.key} (pid {pid if pid else 'unknown'}, "
                f"pipe dir {self.pipe_dir}) on {devs}")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION, "key": self.key, "mode": self.mode, "uid": self.uid,
            "gid": self.gid, "devices": [d.to_record() for d in self.devices],
            "pipe_dir": self.pipe_dir, "log_dir": self.log_dir, "daemon_pid": self.daemon_pid,
            "started_at": self.started_at,
            "caps": None if self.caps is None else self.caps.to_json(),
            "dirs_made": self.dirs_made, "stop_failed": self.stop_failed,
        }

    @classmethod
    def from_json(cls, data: Any, key: str,
                  jobs: Optional[dict[str, int]] = None) -> "DaemonRecord":
        """The record of daemon ``key`` from its parsed file and, from version 2 on, its
        ``jobs`` (``RecordStore`` reads them from ``<key>.jobs/``); ValueError names what is
        wrong.

        ``dirs_made`` appeared within version 1 and ``stop_failed`` is written only once a
        stop failed, so both may be absent; so may a device's ``device_files``, which
        appeared within version 2 (a release before it ignores them, so a downgrade
        still reads the record).
        """
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") not in READ_VERSIONS or data.get("key") != key:
            raise ValueError("unknown version or key")
        mode = _text(data, "mode")
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is unknown")
        devices = data["devices"]
        if not isinstance(devices, list) or not all(
                isinstance(d, dict) and isinstance(d.get("uuid"), str) for d in devices):
            raise ValueError("devices is not a list of devices")
        if data["version"] == 1:
            listed = data["jobs"]
            if not isinstance(listed, dict):
                raise ValueError("jobs is not an object")
            jobs = {str(job): _int(info, "share_percent") for job, info in listed.items()}
        started_at = data.get("started_at")
        if started_at is not None and not isinstance(started_at, (int, float)):
            raise ValueError("started_at is not a time")
        stop_failed = data.get("stop_failed")
        if stop_failed is not None and not isinstance(stop_failed, str):
            raise ValueError("stop_failed is not text")
        return cls(
            key=key, mode=mode, uid=_int(data, "uid"), gid=_int(data, "gid"),
            devices=tuple(MpsDevice.from_record(d) for d in devices),
            pipe_dir=_text(data, "pipe_dir"), log_dir=_text(data, "log_dir"),
            daemon_pid=_int(data, "daemon_pid", optional=True),
            started_at=started_at,
            jobs=dict(jobs or {}),
            caps=_caps(data.get("caps")),
            dirs_made=bool(data.get("dirs_made", False)),
            stop_failed=stop_failed,
        )


def _int(data: Any, name: str, optional: bool = False) -> Any:
    value = data.get(name) if isinstance(data, dict) else None
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} is not a whole number")
    return value


def _text(data: dict[str, Any], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{name} is not text")
    return value


def _caps(data: Any) -> Optional[Limits]:
    if data is None:
        return None
    mem = data.get("mem") if isinstance(data, dict) else None
    if not isinstance(mem, dict) or not all(
            isinstance(i, str) and i.isdigit() and isinstance(size, str)
            for i, size in mem.items()):
        raise ValueError("caps is not a thread percentage and memory limits")
    return Limits(_int(data, "percent"), tuple(sorted(mem.items(), key=lambda m: int(m[0]))))


@contextmanager
def state_dir_fd(path: str, create: bool = True) -> Iterator[int]:
    """A root-owned directory of the daemons' state, every component checked
    (``safefs.open_root_dir``): MpsError when one is unsafe."""
    try:
        fd = safefs.open_root_dir(path, create=create)
    except safefs.UnsafePathError as err:
        raise MpsError(f"MPS state directory refused: {err}") from None
    try:
        yield fd
    finally:
        os.close(fd)


class RecordStore:
    """The daemon records of one node, in ``daemons_dir`` (root-owned 0755), one file per
    key; the daemons' pipe and log directories are in ``users_dir``, a file system the
    users can fill, which root's records therefore never share.

    A record is replaced whole, so it can be read without the daemon's lock; changing one
    needs the lock (``gpushare.node.mps.lock``).
    """

    def __init__(self, daemons_dir: str, users_dir: str) -> None:
        self.daemons_dir = daemons_dir
        self.users_dir = users_dir

    def path(self, *parts: str) -> str:
        return os.path.join(self.daemons_dir, *parts)

    def dir_fd(self, create: bool = True) -> "AbstractContextManager[int]":
        """Root's daemon records (``state_dir_fd``)."""
        return state_dir_fd(self.daemons_dir, create)

    def users_fd(self, create: bool = True) -> "AbstractContextManager[int]":
        """The users' directory (root's, 0755; each daemon's key directory in it root's)."""
        return state_dir_fd(self.users_dir, create)

    def new(self, key: str, mode: str, uid: int, gid: int,
            devices: tuple[MpsDevice, ...]) -> DaemonRecord:
        return DaemonRecord(key, mode, uid, gid, devices,
                            os.path.join(self.users_dir, key, "pipe"),
                            os.path.join(self.users_dir, key, "log"))

    def read(self, mps_fd: int, key: str) -> Optional[DaemonRecord]:
        try:
            data = safefs.read_small_file_at(mps_fd, key + ".json")
            if data is None:
                return None
            parsed = json.loads(data.decode())
            jobs = (self.read_jobs(mps_fd, key)
                    if isinstance(parsed, dict) and parsed.get("version") != 1 else None)
            return DaemonRecord.from_json(parsed, key, jobs)
        except safefs.UnsafePathError as err:
            raise MpsError(f"MPS record {self.path(key)} refused: {err}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise MpsError(f"MPS record {self.path(key)}.json is unreadable ({err}); stop "
                           "any daemon using that directory and remove it") from None

    @contextmanager
    def _subdir(self, mps_fd: int, name: str, create: bool = False) -> Iterator[Optional[int]]:
        """A root-owned directory of the store (``<key>.jobs``, ``tickets``), made with
        ``create``; None when it is absent."""
        if create:
            with suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=mps_fd)
        try:
            fd = safefs.open_dir_at(mps_fd, name, self.path(name), root_owned=True)
        except FileNotFoundError:
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def read_jobs(self, mps_fd: int, key: str) -> dict[str, int]:
        """The jobs referencing daemon ``key``, each with its share: ``<key>.jobs/``.
        UnsafePathError for an entry root did not make; ValueError for a share that is not
        a whole number."""
        with self._subdir(mps_fd, key + JOBS_SUFFIX) as jobs_fd:
            if jobs_fd is None:
                return {}
            jobs = {}
            for name in os.listdir(jobs_fd):
                if not name.isdigit():
                    continue  # a temporary file of a write in progress
                text = safefs.read_small_file_at(jobs_fd, name, limit=64)
                if text is not None:  # gone since the listing: an epilog dropped it
                    jobs[name] = int(text.decode().strip())
            return jobs

    def write(self, mps_fd: int, rec: DaemonRecord) -> None:
        """Write the record and make ``<key>.jobs/`` list exactly ``rec.jobs`` (lock held).
        The jobs go first: a reader without the lock never sees a record whose jobs are
        missing."""
        self._write_jobs(mps_fd, rec)
        # 0600: a record names the user's GPUs, jobs and daemon pid. Replaced whole, so a
        # record an earlier release wrote 0644 gets this mode at its next write.
        safefs.write_file_atomic_at(mps_fd, rec.key + ".json", self.payload(rec).encode(),
                                    0o600)

    @staticmethod
    def payload(rec: DaemonRecord) -> str:
        """The text of ``rec``'s file."""
        return json.dumps(rec.to_json(), indent=1, sort_keys=True)

    def _write_jobs(self, mps_fd: int, rec: DaemonRecord) -> None:
        with self._subdir(mps_fd, rec.key + JOBS_SUFFIX, create=True) as jobs_fd:
            assert jobs_fd is not None  # made just now
            present = set(os.listdir(jobs_fd))
            for job, share in rec.jobs.items():
                if job not in present:  # a job's share never changes while it runs
                    safefs.write_file_atomic_at(jobs_fd, job, f"{share}\n".encode(), 0o600)
            for job in present - set(rec.jobs):
                safefs.remove_file_at(jobs_fd, job)

    def write_ticket(self, mps_fd: int, name: str, text: bytes) -> None:
        """Replace the join ticket ``name`` (``gpushare.node.ticket``; lock held)."""
        with self._subdir(mps_fd, TICKETS, create=True) as tickets_fd:
            assert tickets_fd is not None  # made just now
            safefs.write_file_atomic_at(tickets_fd, name, text, 0o600)

    def remove(self, mps_fd: int, key: str) -> None:
        """Remove daemon ``key``'s record, its jobs and its join tickets (lock held)."""
        safefs.remove_tree_at(mps_fd, key + JOBS_SUFFIX)
        safefs.remove_file_at(mps_fd, key + ".json")
        self._remove_tickets(mps_fd, key)

    def _remove_tickets(self, mps_fd: int, key: str) -> None:
        """The daemon's join tickets go with it (they could not be used any more: its record
        is gone), and their directory once it is empty."""
        with self._subdir(mps_fd, TICKETS) as tickets_fd:
            if tickets_fd is None:
                return
            names = f"\nkey {key}\n".encode()
            for name in os.listdir(tickets_fd):
                with suppress(OSError, safefs.UnsafePathError):
                    if name.startswith(_OLD_START_PREFIX):
                        safefs.remove_file_at(tickets_fd, name)
                        continue
                    head = safefs.read_small_file_at(tickets_fd, name, 4096)
                    if head is not None and names in head:
                        safefs.remove_file_at(tickets_fd, name)
        with suppress(OSError):  # not empty: another daemon's tickets stay
            os.rmdir(TICKETS, dir_fd=mps_fd)

    def keys(self, mps_fd: int) -> list[str]:
        """Every key with a record, a lock or a directory."""
        keys = set()
        for name in os.listdir(mps_fd):
            if name.startswith(".") or name == TICKETS:
                continue
            if name.endswith(JOBS_SUFFIX):
                base = name[:-len(JOBS_SUFFIX)]
            else:
                base = name[:-5] if name.endswith((".json", ".lock")) else name
            keys.add(base)
        return sorted(keys)

    def peek(self, mps_fd: int, key: str) -> Optional[DaemonRecord]:
        """A daemon's record read without its lock (records are replaced atomically); None
        when it is absent or unreadable, which the locked read then deals with."""
        try:
            return self.read(mps_fd, key)
        except MpsError:
            return None

    def holds(self, mps_fd: int, key: str, job_id: int) -> bool:
        """Whether daemon ``key``'s record lists the job (a look without the lock)."""
        if not re.match(KEY_PATTERN, key):
            return False
        rec = self.peek(mps_fd, key)
        return rec is not None and str(job_id) in rec.jobs

    def keys_of_job(self, mps_fd: int, job_id: int) -> list[str]:
        keys = []
        for name in os.listdir(mps_fd):
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                rec = self.read(mps_fd, name[:-5])
            except MpsError as err:
                LOG.warning("%s", err)
                continue
            if rec is not None and str(job_id) in rec.jobs:
                keys.append(name[:-5])
        return keys
