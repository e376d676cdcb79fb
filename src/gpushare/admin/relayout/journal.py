# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --apply`` as a transaction: one run at a time, and a journal of what
the run does, so that a run killed midway is finished or rolled back by the next.

Beside the state file (``relayout-state.json``), in the same root-owned directory:

- ``relayout-state.json.run.lock``: held (``flock``) for the whole run; it names its holder
  (pid, host, start, command line), so a second run says who holds it and acts on nothing;
- ``relayout-state.json.journal``: the round's plan per node and GPU and how far each got,
  written in one rename before the first drain and after every step; removed once every
  node is settled.

Format (version 1)::

    {"version": 1, "decision": "r20260101T000000Z", "started": 1767225600.0,
     "nodes": [{"node": "n1", "phase": "changing",
                "gpus": [{"gpu": 2, "old": "7x1g.10gb", "new": "2x3g.40gb",
                          "status": "started"}]}]}

A node's ``phase``: ``planned`` (maybe drained, no GPU touched), ``changing`` (a step may
have run), ``slurm`` (every step ended; Gres= and the resume are left), ``done``. A GPU's
``status``: ``planned``, ``started`` (its step ran and did not report: its layout is
unknown), ``applied``, ``kept`` (the step refused, or laid the old layout back), ``unknown``
(the step could not lay it back).

Every file is opened without following a symlink, in a directory that (for root) must be
root-owned and not writable by others, and must be a plain file of the caller's own.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from gpushare.common import safefs
from gpushare.common.versioned import versioned_json

__all__ = ["GPU_STATUSES", "JOURNAL_VERSION", "PHASES", "GpuStep", "Journal", "JournalError",
           "LockBusy", "NodeEntry", "held", "journal_path", "load_journal", "open_beside",
           "read_beside", "run_lock", "save_journal", "typed_field", "write_beside"]

JOURNAL_VERSION = 1
PHASES = ("planned", "changing", "slurm", "done")
GPU_STATUSES = ("planned", "started", "applied", "kept", "unknown")
MAX_BYTES = 1 << 20


class JournalError(ValueError):
    """The journal or lock file cannot be used; the message says what to fix."""


class LockBusy(RuntimeError):
    """Another run holds the lock; the message names it."""


@dataclass
class GpuStep:
    gpu: int
    old: str
    new: str
    status: str = "planned"


@dataclass
class NodeEntry:
    node: str
    gpus: list[GpuStep]
    phase: str = "planned"


@dataclass
class Journal:
    path: str
    decision: str
    started: float
    nodes: list[NodeEntry] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def node(self, name: str) -> NodeEntry:
        return next(entry for entry in self.nodes if entry.node == name)

    def mark(self, node: str, phase: Optional[str] = None, gpu: Optional[int] = None,
             status: Optional[str] = None) -> None:
        """Move a node (or one of its GPUs) on, and write the journal before going on."""
        with self.lock:
            entry = self.node(node)
            if phase is not None:
                entry.phase = phase
            if gpu is not None and status is not None:
                next(g for g in entry.gpus if g.gpu == gpu).status = status
            save_journal(self)

    @property
    def open_nodes(self) -> list[NodeEntry]:
        return [entry for entry in self.nodes if entry.phase != "done"]


# What a user who may not open a file beside the state file is told.
CONTROLLER = ("--apply writes beside the state file: run it as root on the controller host "
              "(or name a --state this user may write)")


def journal_path(state_path: str) -> str:
    return state_path + ".journal"


def _dir_fd(directory: str) -> int:
    """The directory, checked root-owned all the way for root (never a user's path)."""
    if os.geteuid() == 0:
        try:
            return safefs.open_root_dir(directory, create=False)
        except safefs.UnsafePathError as err:
            raise JournalError(str(err)) from None
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_beside(path: str, flags: int, create: bool = True, advice: str = CONTROLLER) -> int:
    """``path``'s file, opened without following a symlink, in a safe directory; it must be
    a plain file of this user's with one link (JournalError otherwise; ``advice`` says what
    to do where this user may not open it)."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _dir_fd(directory)
    try:
        mode = os.O_NOFOLLOW | os.O_CLOEXEC | flags | (os.O_CREAT if create else 0)
        try:
            fd = os.open(name, mode, 0o600, dir_fd=dir_fd)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise JournalError(f"{path} is a symbolic link; remove it") from None
            if err.errno in (errno.EACCES, errno.EPERM):
                raise JournalError(f"cannot open {path}: {err.strerror}; {advice}") from None
            if err.errno == errno.EROFS:
                raise JournalError(f"cannot open {path}: {err.strerror}") from None
            raise
    finally:
        os.close(dir_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
        os.close(fd)
        raise JournalError(f"{path} is not a plain file of uid {os.geteuid()} with one link; "
                           "remove it")
    return fd


@contextlib.contextmanager
def held(path: str, busy: str, wait_s: float = 0.0, record: Optional[dict[str, object]] = None,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep, advice: str = CONTROLLER
         ) -> Iterator[None]:
    """Hold the lock file ``path`` (opened as :func:`open_beside` opens a file), waiting up
    to ``wait_s`` for its holder; LockBusy(``busy`` with the holder's record) past that. The
    holder's pid, host, start and command (and ``record``) are written into it."""
    fd = open_beside(path, os.O_RDWR, advice=advice)
    try:
        deadline = clock() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() >= deadline:
                    holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
                    raise LockBusy(busy.format(holder=holder or "its holder not yet named",
                                               path=path)) from None
                sleep(0.2)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "command": shlex.join(sys.argv)[:1000], **(record or {})})
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_lock(state_path: str) -> contextlib.AbstractContextManager[None]:
    """Hold ``<state>.run.lock`` for a whole run; LockBusy (naming the holder) when another
    run holds it."""
    return held(state_path + ".run.lock",
                "another gpushare relayout or tidal --apply runs ({holder}; lock {path}); "
                "this one changes nothing: try again once it has ended")


def _dump(journal: Journal) -> str:
    return json.dumps({"version": JOURNAL_VERSION, "decision": journal.decision,
                       "started": journal.started,
                       "nodes": [{"node": e.node, "phase": e.phase,
                                  "gpus": [{"gpu": g.gpu, "old": g.old, "new": g.new,
                                            "status": g.status} for g in e.gpus]}
                                 for e in journal.nodes]}, indent=1) + "\n"


def write_beside(path: str, text: Optional[str]) -> None:
    """Replace a journal in one rename (a reader sees the old one or the new one), in a
    directory checked as ``open_beside`` does; ``None`` removes it."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _dir_fd(directory)
    try:
        if text is None:
            safefs.remove_file_at(dir_fd, name)
            return
        safefs.write_file_atomic_at(dir_fd, name, text.encode(), 0o600, exact_mode=True)
    finally:
        os.close(dir_fd)


def read_beside(path: str) -> Optional[str]:
    """A journal's text, opened as ``open_beside`` opens it; None when there is none."""
    try:
        fd = open_beside(path, os.O_RDONLY, create=False)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise JournalError(f"{path}: larger than {MAX_BYTES} bytes")
    return data.decode("utf-8", "replace")


def typed_field(raw: dict[str, Any], key: str, kind: type, where: str) -> Any:
    """``raw[key]`` of ``kind`` (a bool is no number), else JournalError naming it."""
    value = raw.get(key)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise JournalError(f"{where}: {key} must be {kind.__name__}")
    return value


def save_journal(journal: Journal) -> None:
    """Write the journal; once every node is done, remove it."""
    write_beside(journal.path, _dump(journal) if journal.open_nodes else None)


def parse_journal(text: str, path: str) -> Journal:
    raw = versioned_json(text, path, "relayout journal", JOURNAL_VERSION, JournalError)
    started = raw.get("started")
    journal = Journal(path, typed_field(raw, "decision", str, path),
                      float(started) if isinstance(started, (int, float)) else 0.0)
    nodes = raw.get("nodes")
    if not isinstance(nodes, list):
        raise JournalError(f"{path}: nodes must be a list")
    for item in nodes:
        if not isinstance(item, dict):
            raise JournalError(f"{path}: each node must be a mapping")
        where = f"{path}: node {item.get('node')!r}"
        phase = typed_field(item, "phase", str, where)
        if phase not in PHASES:
            raise JournalError(f"{where}: phase {phase!r} is not one of {', '.join(PHASES)}")
        gpus = []
        for gpu in typed_field(item, "gpus", list, where):
            if not isinstance(gpu, dict):
                raise JournalError(f"{where}: each GPU must be a mapping")
            status = typed_field(gpu, "status", str, where)
            if status not in GPU_STATUSES:
                raise JournalError(f"{where}: GPU status {status!r} is not one of "
                                   + ", ".join(GPU_STATUSES))
            gpus.append(GpuStep(typed_field(gpu, "gpu", int, where),
                                typed_field(gpu, "old", str, where),
                                typed_field(gpu, "new", str, where), status))
        journal.nodes.append(NodeEntry(typed_field(item, "node", str, where), gpus, phase))
    return journal


def load_journal(state_path: str) -> Optional[Journal]:
    """The journal an earlier run left, or None."""
    path = journal_path(state_path)
    text = read_beside(path)
    return None if text is None else parse_journal(text, path)
