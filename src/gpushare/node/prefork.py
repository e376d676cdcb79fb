# SPDX-License-Identifier: GPL-2.0-or-later
"""A root process per node that holds the core imported and forks each job's worker from it.

Why: a user's first shared job on a GPU waits for its prolog's worker, and most of that
worker's time is starting Python and importing the core (tens of ms), not the work. With
``prefork=yes`` the first worker that finds no server forks one off its own interpreter,
with the core already imported (``spawn``); later workers hand their callback to it over
``<state_dir>/prefork.sock`` (spank/gs_prefork.c) and only relay its log lines and result.

What keeps this as safe as a worker of its own:
- only root reaches the server: the socket is root's, 0600, in root's state directory, and
  every peer's credentials are checked (``SO_PEERCRED``) before anything is read;
- a request runs in a fresh child with the worker's own environment, ids, options,
  deadline and umask, in a session of its own; the server itself runs no callback;
- a server whose code changed on disk never runs it: every request carries the C glue's
  print of everything below ``pythonpath=`` and of the core library, taken as it checked
  them, and a server born with another print refuses and ends (the worker then runs in
  place, and starts a server of the new code);
- the worker's supervisor knows the child's pid and kills it with the worker at the
  deadline (spank/gs_deadline.c);
- the server ends after ``IDLE_SECONDS`` without a request, or when its socket or its
  state directory is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import struct
from typing import Any, Callable, NamedTuple, Optional

PROTOCOL = b"gpushare-prefork 1"
SOCKET = "prefork.sock"
LOCK = "prefork.lock"
IDLE_SECONDS = 600.0
NAME = b"gs-prefork"  # the server's process name (ps, pgrep); its children keep it
PR_SET_NAME = 15
REQUEST_MAX = 1 << 20  # a request is a job's environment and a few fields
LOG_MAX = 16384  # a log line's bytes sent to the worker (its frames: GS_FRAME_MAX, 64 KiB)
STALE_EXIT = 3  # a child's exit status that ends the server: its code changed on disk

# Frames the child sends: a type byte, a 4-byte big-endian length, the payload.
PID, LOG, RESULT, REFUSED = b"P", b"L", b"R", b"N"

# The packages whose modules a prolog or epilog may import on its way (some lazily, on
# rare paths); the server imports them all once, so that no child pays for any.
HOT_PACKAGES = ("gpushare.common", "gpushare.gpu", "gpushare.node")


class Request(NamedTuple):
    """One callback, as the worker's C glue snapshot it."""

    callback: str
    code: str
    job_id: int
    uid: int
    gid: int
    deadline: float
    umask: int
    options: dict[str, str]
    args: list[str]
    env: dict[str, str]


class RequestError(ValueError):
    """A request that does not parse: the worker runs in place instead."""


def parse_request(data: bytes) -> Request:
    """The NUL-separated fields the C glue sends (gs_prefork.c): the protocol, the
    callback, then ``key=value`` fields (``opt.NAME``, ``arg``, ``env`` repeated), ended by
    an empty field."""
    fields = data.split(b"\0")
    if len(fields) < 3 or fields[0] != PROTOCOL or fields[-1] != b"" or fields[-2] != b"":
        raise RequestError("not a gpushare-prefork 1 request")
    callback = fields[1].decode("ascii", "replace")
    values: dict[str, str] = {}
    options: dict[str, str] = {}
    args: list[str] = []
    env: dict[str, str] = {}
    for raw in fields[2:-2]:
        key, sep, value = raw.decode("utf-8", "surrogateescape").partition("=")
        if not sep:
            raise RequestError(f"field without '=': {key[:40]!r}")
        if key == "arg":
            args.append(value)
        elif key == "env":
            name, sep, setting = value.partition("=")
            if sep and name:
                env[name] = setting
        elif key.startswith("opt."):
            options[key[4:]] = value
        else:
            values[key] = value
    try:
        return Request(callback, values.get("code", ""), int(values["job_id"]),
                       int(values["uid"]), int(values["gid"]), float(values["deadline"]),
                       int(values["umask"], 8), options, args, env)
    except (KeyError, ValueError) as err:
        raise RequestError(f"bad or missing field: {err}") from None


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def read_request(conn: socket.socket) -> bytes:
    """The whole request: it ends with two NULs, and the worker sends nothing after it."""
    data = b""
    while not data.endswith(b"\0\0"):
        chunk = conn.recv(65536)
        if not chunk:
            raise RequestError("the worker closed the connection mid-request")
        data += chunk
        if len(data) > REQUEST_MAX:
            raise RequestError("request too long")
    return data


class _ChildHost:
    """What a worker's struct gs_host lends the core, for a child of the server: its log
    lines go back to the worker, which logs them as its own."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn = conn
        self.deadline = deadline

    def log(self, level: int, text: bytes) -> None:
        if len(text) > LOG_MAX:  # the worker reads frames of at most 64 KiB
            text = text[:LOG_MAX] + b" [cut]"
        with contextlib.suppress(OSError):  # the worker is gone: its supervisor kills this
            self.conn.sendall(frame(LOG, bytes([level & 0xFF]) + text))


def _run_child(conn: socket.socket, code: str, run: Callable[[Request, Any], int],
               retire: Callable[[], None] = lambda: None) -> int:
    """In the forked child: read the request, refuse it when the code changed (``retire``
    ends the server first, so that the worker, running in place, can start one of the new
    code), else run it; the exit status (STALE_EXIT tells the server to end)."""
    conn.settimeout(10.0)
    try:
        request = parse_request(read_request(conn))
    except (OSError, RequestError) as err:
        _send(conn, REFUSED, f"bad request: {err}")
        return 1
    if request.code != code:
        retire()
        _send(conn, REFUSED, "the code on disk changed since the server started")
        return STALE_EXIT
    conn.settimeout(None)
    os.setsid()
    os.umask(request.umask)
    os.environ.clear()
    os.environ.update(request.env)
    _send(conn, PID, f"{os.getpid()}")
    try:
        rc = run(request, _ChildHost(conn, request.deadline))
    except BaseException:  # run logs its own failures; this is the last guard
        rc = -1
    _send(conn, RESULT, str(int(rc)))
    return 0


def _send(conn: socket.socket, kind: bytes, text: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(frame(kind, text.encode("utf-8", "replace")))


def peer_is_root(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == 0


class Server:
    """The accept loop; each request runs in a child (``run``) forked from here."""

    def __init__(self, state_dir: str, code: str, run: Callable[[Request, Any], int],
                 idle: float = IDLE_SECONDS) -> None:
        self.state_dir = state_dir
        self.code = code
        self.run = run
        self.idle = idle
        self.path = os.path.join(state_dir, SOCKET)
        self.listener: Optional[socket.socket] = None
        self.children: set[int] = set()
        self.stale = False
        self.pid = os.getpid()

    def bind(self) -> bool:
        """Take the node's server lock and the socket; False when another server holds
        them (that one serves)."""
        if not self.lock():
            return False
        self.listen()
        return True

    def lock(self) -> bool:
        """The node's server lock, held for the server's life: False when another server
        holds it (it serves, or is about to)."""
        import fcntl

        lock = os.open(os.path.join(self.state_dir, LOCK),
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            return False
        self.lock_fd = lock
        return True

    def listen(self) -> None:
        """The socket, root's alone, in place of any a server before left."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        listener.listen(64)
        self.inode = os.stat(self.path).st_ino
        self.listener = listener

    def still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def serve(self) -> None:
        """Until idle, stale, or the socket is gone."""
        import time

        assert self.listener is not None
        self.pid = os.getpid()  # the process whose children retire() may end
        last = time.monotonic()
        while not self.stale:
            ready, _, _ = select.select([self.listener], [], [], 1.0)
            self.reap()
            if ready:
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    continue
                last = time.monotonic()
                self.fork_child(conn)
            elif not self.children and time.monotonic() - last > self.idle:
                break
            if not self.still_ours():
                break
        self.close()

    def fork_child(self, conn: socket.socket) -> None:
        with conn:
            if not peer_is_root(conn):
                return
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    assert self.listener is not None
                    self.listener.close()
                    os.close(self.lock_fd)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    status = _run_child(conn, self.code, self.run, self.retire)
                finally:
                    os._exit(status)
            self.children.add(pid)

    def retire(self) -> None:
        """From a child: end the server now (its socket first; SIGKILL lets go of its lock
        at once). Its other children run on."""
        if self.still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if os.getppid() == self.pid:  # still the server, never whoever adopted this child
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)

    def reap(self) -> None:
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                self.children.discard(pid)
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == STALE_EXIT:
                    self.stale = True

    def close(self) -> None:
        """The socket goes first (no worker connects to a server that ends), then the lock."""
        if self.still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if self.listener is not None:
            self.listener.close()
        os.close(self.lock_fd)


def detach() -> bool:
    """Fork twice (the caller goes on at once); True in the grandchild, which is out of
    the caller's session, process group and sight, with only its standard streams open."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return False
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        os.closerange(3, _fd_limit())  # the job's locks and Slurm's files stay the worker's
        os.chdir("/")
        return True
    except BaseException:
        os._exit(1)


def _fd_limit() -> int:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return min(soft if soft > 0 else 65536, 1 << 20)


def in_a_job_cgroup(cgroups: str) -> bool:
    """Whether a line of /proc/self/cgroup puts this process inside a Slurm job's cgroup
    (``.../job_<id>/...``, v1 or v2). A server there would share that job's limits and be
    killed, with the jobs its children are setting up, when that job ends: it does not
    serve, and every worker runs in place."""
    return any(re.search(r"/job_\d+(/|$)", line.partition(":")[2].partition(":")[2])
               for line in cgroups.splitlines())


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def name_process(name: bytes) -> None:
    """The name ps, top and pgrep show (a fork of slurmd's prolog would show "slurmd")."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def preimport(packages: tuple[str, ...]) -> None:
    """Every module of ``packages``; one that fails is left to the child that needs it,
    which imports it again and reports why."""
    import importlib
    import pkgutil

    for package in packages:
        try:
            paths = importlib.import_module(package).__path__
        except Exception:
            continue
        for module in pkgutil.walk_packages(paths, package + "."):
            with contextlib.suppress(Exception):
                importlib.import_module(module.name)


def spawn(state_dir: str, code: str, run: Callable[[Request, Any], int]) -> None:
    """Called by a worker with the core imported: fork a server off its interpreter and go
    on. The server never returns."""
    if not detach():
        return
    status = 0
    try:
        if in_a_job_cgroup(_read("/proc/self/cgroup")):
            return  # finally: _exit
        name_process(NAME)
        server = Server(state_dir, code, run)
        # The lock first: the workers that come while this one imports run in place, and
        # the servers they start end at once.
        if server.lock():
            preimport(HOT_PACKAGES)
            server.listen()
            server.serve()
    except BaseException:
        status = 1
    finally:
        os._exit(status)
