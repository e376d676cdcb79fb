# SPDX-License-Identifier: GPL-2.0-or-later
"""Per-job state records: what job_prolog decided, read by task_init, removed by job_epilog.

Records live in ``<state_dir>/jobs/<job_id>.json``, root-owned, mode 0600, written
atomically. The directories are created by root and checked on every use: an entry that is
a symlink, not owned by root, or writable by others is refused, so a user can never steer
where root reads or writes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from typing import Any, Optional

from gpushare.common import safefs

RECORD_VERSION = 1


class StateError(RuntimeError):
    """The state directory is unsafe or a record cannot be read or written."""


class JobRecord:
    """What the prolog found and decided for one job on this node.

    A plain class, not a dataclass: importing ``dataclasses`` (and ``inspect`` with it)
    would cost every prolog and epilog about 5 ms of CPU. Mutable: the prolog adds the MPS
    lease and the final task environment once the daemon is up.
    """

    FIELDS = ("job_id", "uid", "gid", "node", "mode", "share_percent", "slurm_gpus",
              "visible_devices", "devices", "mps", "env", "error", "created", "version")
    __slots__ = FIELDS
    job_id: int
    uid: int
    gid: int
    node: str
    mode: str  # "shared" (a share of one GPU) or "private" (MPS over whole GPUs)
    share_percent: int
    slurm_gpus: list[str]  # SLURM_JOB_GPUS
    visible_devices: list[str]  # CUDA_VISIBLE_DEVICES (prolog)
    devices: list[dict[str, Any]]  # resolved through NVML
    mps: Optional[dict[str, Any]]  # the MPS lease (daemon, directories)
    env: dict[str, str]  # set in every task of the job
    error: str  # a user error found in the prolog, reported by task_init
    created: float
    version: int

    def __init__(self, job_id: int, uid: int, gid: int, node: str, mode: str,
                 share_percent: int, slurm_gpus: Optional[list[str]] = None,
                 visible_devices: Optional[list[str]] = None,
                 devices: Optional[list[dict[str, Any]]] = None,
                 mps: Optional[dict[str, Any]] = None, env: Optional[dict[str, str]] = None,
                 error: str = "", created: Optional[float] = None,
                 version: int = RECORD_VERSION) -> None:
        self.job_id, self.uid, self.gid, self.node = job_id, uid, gid, node
        self.mode, self.share_percent = mode, share_percent
        self.slurm_gpus = list(slurm_gpus or ())
        self.visible_devices = list(visible_devices or ())
        self.devices = list(devices or ())
        self.mps = mps
        self.env = dict(env or {})
        self.error = error
        self.created = time.time() if created is None else created
        self.version = version

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobRecord) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"JobRecord({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    def to_env_file(self, show: str = "") -> str:
        """What the C glue applies in every task: ``KEY=VALUE``, ``#error=``, ``#show=``."""
        if self.error:
            return f"#error={_one_line(self.error)}\n"
        lines = [f"{key}={_one_line(value)}" for key, value in sorted(self.env.items())
                 if ENV_NAME.match(key)]
        if show:
            lines.append(f"#show={_one_line(show)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        if data.get("version") != RECORD_VERSION:
            raise StateError(f"unsupported record version {data.get('version')!r}")
        return cls(**{k: v for k, v in data.items() if k in cls.FIELDS})


ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def ensure_root_dir(path: str, mode: int = 0o755) -> None:
    """Create ``path`` (and parents) as root-owned directories, or verify they are safe:
    every component root-owned and not writable by others (``safefs.open_root_dir``)."""
    _root_dir(path, create=True, mode=mode)


def check_root_dir(path: str) -> None:
    """Refuse a directory that a user could have placed or can change."""
    _root_dir(path, create=False)


def _root_dir(path: str, create: bool, mode: int = 0o755) -> None:
    try:
        os.close(safefs.open_root_dir(path, create=create, mode=mode))
    except safefs.UnsafePathError as err:
        raise StateError(f"state directory {path}: {err}") from None
    except OSError as err:
        raise StateError(f"state directory {path}: {err.strerror}") from err


# The names of a job's files in the state dir, <JOBS_DIR>/<job id><suffix>: its record, its
# tasks' environment file, its lock. spank/build.py hands them to the C glue.
JOBS_DIR = "jobs"
RECORD_SUFFIX = ".json"
ENV_SUFFIX = ".env"
LOCK_SUFFIX = ".lock"
# The node's usage sampler's files, <USAGE_DIR>/<job id>.json (gpushare.node.usage.store): a
# job's epilog records its use where it finds one (gpushare.node.job, and the C glue).
USAGE_DIR = "usage"


class JobStore:
    """The ``jobs/`` directory of the state dir."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.jobs_dir = os.path.join(state_dir, JOBS_DIR)

    def path(self, job_id: int, suffix: str = RECORD_SUFFIX) -> str:
        return os.path.join(self.jobs_dir, f"{int(job_id)}{suffix}")

    def write(self, record: JobRecord, show: str = "", tasks: bool = True) -> None:
        """Write the record and, with ``tasks``, the task environment file, each atomically.

        The environment file is the prolog's last word: the job's tasks wait for it (or for
        the prolog's worker to end) and then start with what it says.
        """
        ensure_root_dir(self.state_dir)
        ensure_root_dir(self.jobs_dir, 0o700)
        self._write_atomic(self.path(record.job_id), record.to_json())
        if tasks:
            self._write_atomic(self.path(record.job_id, ENV_SUFFIX), record.to_env_file(show))

    def write_unshared(self, job_id: int) -> None:
        """The prolog's last word for a job that shares nothing: an empty environment file,
        so that its tasks can tell a finished prolog from a worker that died."""
        ensure_root_dir(self.state_dir)
        ensure_root_dir(self.jobs_dir, 0o700)
        self._write_atomic(self.path(job_id, ENV_SUFFIX), "")

    @staticmethod
    def _write_atomic(final: str, text: str) -> None:
        safefs.write_file_atomic(final, text.encode(), 0o600)

    def read(self, job_id: int) -> Optional[JobRecord]:
        """The job's record, or None when there is none."""
        if os.path.lexists(self.jobs_dir):
            check_root_dir(self.jobs_dir)
        try:
            fd = os.open(self.path(job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            if err.errno == errno.ENOENT:
                return None
            raise StateError(f"cannot open {self.path(job_id)}: {err.strerror}") from err
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid():
                raise StateError(f"{self.path(job_id)} is not owned by uid {os.geteuid()}")
            with os.fdopen(fd, "rb", closefd=False) as handle:
                data = json.loads(handle.read().decode())
        except (ValueError, TypeError) as err:
            raise StateError(f"{self.path(job_id)} is not a gpushare record: {err}") from err
        finally:
            os.close(fd)
        return JobRecord.from_dict(data)

    def exists(self, job_id: int) -> bool:
        """Whether the job has a record (not read: the directory is root's alone)."""
        return os.path.lexists(self.path(job_id))

    def remove(self, job_id: int) -> bool:
        """Remove the record; False when there was none (epilog twice, no prolog)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(job_id, ENV_SUFFIX))
        try:
            os.unlink(self.path(job_id))
        except FileNotFoundError:
            return False
        return True

    def job_ids(self) -> list[int]:
        if not os.path.isdir(self.jobs_dir):
            return []
        return sorted(int(name[:-5]) for name in os.listdir(self.jobs_dir)
                      if name.endswith(RECORD_SUFFIX) and
                      name[:-len(RECORD_SUFFIX)].isdigit())

    def leftover_ids(self) -> list[int]:
        """Jobs with a tasks' file or a lock but no record: a job that shares nothing, or
        whose prolog failed before its record, until its epilog. Listed apart, so that the
        reap of lost jobs also finds those whose epilog never ran or gave up."""
        if not os.path.isdir(self.jobs_dir):
            return []
        names = os.listdir(self.jobs_dir)
        recorded = {name[:-len(RECORD_SUFFIX)] for name in names
                    if name.endswith(RECORD_SUFFIX)}
        found = set()
        for name in names:
            stem, suffix = os.path.splitext(name)
            if suffix in (ENV_SUFFIX, LOCK_SUFFIX) and stem.isdigit() and stem not in recorded:
                found.add(int(stem))
        return sorted(found)
