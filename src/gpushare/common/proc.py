# SPDX-License-Identifier: GPL-2.0-or-later
"""Run an external command with a hard time limit, optionally as another user.

The plugin runs inside slurmd/slurmstepd: a hung or daemonising child must never hang it.
Output goes to anonymous memory files, not pipes, so a grandchild that keeps the
child's stdout open (``nvidia-cuda-mps-control -d`` does) cannot make us wait for EOF.
The child gets its own process group; on timeout the whole group is killed. The wait is a
poll on a pidfd where the kernel has them (5.3+), so the caller resumes the moment the
child exits; older kernels fall back to subprocess's sleeping wait. ``subprocess`` is
imported on the first command, not with this module: the prolog of a job whose GPUs are
only verified (no MPS) runs none.
No threads are used (the plugin forbids them).

A program that stays behind as a user's daemon (``isolate=``) starts as a job's first
process would, not as slurmd's child: ``oom_score_adj`` 0, no blocked or ignored signal,
umask 077, the node's default rlimits, a cgroup of its own; all set in the child, as root,
before it becomes the user and runs the program. Where systemd manages the node's cgroups,
the cgroup is a transient scope: the child runs ``systemd-run --scope`` as root, which asks
systemd for the scope, moves itself there, becomes the user and runs the program.
"""

import contextlib
import errno
import os
import select
import signal
import time
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional, Sequence

if TYPE_CHECKING:
    import subprocess
    from typing import Callable

__all__ = ["CommandFailed", "CommandNotFound", "CommandTimeout", "Isolation", "ProcError",
           "Result", "run", "signal_checked", "wait_for_exit"]

_OUTPUT_LIMIT = 64 * 1024
# How long a command killed at its timeout is waited for: a process stuck in the kernel (a
# hung driver call, a frozen cgroup) outlives SIGKILL, and the caller's deadline must hold.
KILLED_WAIT = 2.0


class ProcError(RuntimeError):
    """An external command could not be run to completion; the message says which and why."""


class CommandNotFound(ProcError):
    """The program does not exist or cannot be executed (``denied``: the latter)."""

    def __init__(self, message: str, denied: bool = False) -> None:
        super().__init__(message)
        self.denied = denied


class CommandTimeout(ProcError):
    """The program did not finish within its time limit and was killed."""


class CommandFailed(ProcError):
    """The program exited with a non-zero status (only raised by ``run(check=True)``)."""

    def __init__(self, message: str, result: "Result") -> None:
        super().__init__(message)
        self.result = result


class Result(NamedTuple):
    """Exit status and (truncated) output of a finished command."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout and stderr, stripped, for log lines and error messages."""
        return "\n".join(part for part in (self.stdout.strip(), self.stderr.strip()) if part)


class Isolation(NamedTuple):
    """How a program that outlives its command starts (``run(isolate=...)``).

    ``rlimits``: (resource, soft, hard) for each limit to set; ``cgroup``: a cgroup v2
    directory (root's) the child moves itself into, or "" to stay where it is;
    ``scope``: instead, a systemd scope unit to run in, in ``scope_slice``, made by
    ``systemd_run`` (a root-owned program: the child runs it as root); ``devices``: the
    only device files the scope may open (``DevicePolicy=closed``; none given: no device
    policy).
    """

    rlimits: tuple[tuple[int, int, int], ...] = ()
    cgroup: str = ""
    oom_score_adj: int = 0
    umask: int = 0o077
    scope: str = ""
    scope_slice: str = ""
    systemd_run: str = ""
    devices: tuple[str, ...] = ()

    def where(self) -> str:
        """The cgroup or scope, for messages."""
        return f"systemd scope {self.scope}" if self.scope else f"cgroup {self.cgroup}"


def _in_scope(argv: Sequence[str], isolation: Isolation, uid: int, gid: int) -> list[str]:
    """``argv`` run by systemd-run in a transient scope of its own, as ``uid``/``gid``:
    systemd moves systemd-run's own process there before it drops to the user and execs
    the program, so the program and all it forks start inside (``--collect``: a scope
    whose processes failed is not kept). With ``devices``, the scope may open those device
    files and the pseudo-devices ``DevicePolicy=closed`` keeps (null, zero, urandom, ...),
    no other GPU."""
    policy = [f"--property={prop}" for prop in (
        "DevicePolicy=closed", *(f"DeviceAllow={path} rw" for path in isolation.devices))
              ] if isolation.devices else []
    return [isolation.systemd_run, "--scope", "--quiet", "--collect",
            f"--unit={isolation.scope}", f"--slice={isolation.scope_slice}", *policy,
            f"--uid={uid}", f"--gid={gid}", "--", *argv]


def _write_proc_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# The kernel's rt_sigaction, by machine: glibc keeps signals 32 and 33 for its threads and
# its sigaction (so the signal module) refuses them, yet a parent that glibc's posix_spawn
# started (GNU make, for one) has them ignored, and ignored survives exec.
_RT_SIGACTION = {"x86_64": 13, "aarch64": 134, "ppc64le": 173, "s390x": 174}
_GLIBC_RESERVED_SIGNALS = (32, 33)


def _reserved_signals_reset() -> "Callable[[], None]":
    """What sets glibc's reserved signals back to their default in a child about to exec
    (prepared in the parent; a machine this does not know keeps what it inherited)."""
    import ctypes

    # os.uname, not platform.machine: the platform module costs a worker 1.4 ms to import.
    number = _RT_SIGACTION.get(os.uname().machine)
    if number is None:
        return lambda: None
    libc = ctypes.CDLL(None, use_errno=True)
    default = ctypes.create_string_buffer(32)  # SIG_DFL, no flags, an empty mask

    def reset() -> None:
        for sig in _GLIBC_RESERVED_SIGNALS:
            libc.syscall(ctypes.c_long(number), ctypes.c_long(sig), default, None,
                         ctypes.c_size_t(8))
    return reset


def _isolating_child(isolation: Isolation, uid: int, gid: int) -> "Callable[[], None]":
    """The child's last steps before exec: as root, then it becomes ``uid``/``gid`` itself
    (subprocess's own ``user=`` switch comes before ``preexec_fn``, too late: a user may
    neither write its ``oom_score_adj`` nor leave its cgroup)."""
    import resource as resource_module

    reset_reserved = _reserved_signals_reset()

    def child() -> None:
        _write_proc_file("/proc/self/oom_score_adj", f"{isolation.oom_score_adj}\n")
        if isolation.cgroup:
            try:
                _write_proc_file(os.path.join(isolation.cgroup, "cgroup.procs"), "0\n")
            except FileNotFoundError:  # an emptied cgroup removed meanwhile: made again
                with contextlib.suppress(FileExistsError):
                    os.mkdir(isolation.cgroup, 0o755)
                _write_proc_file(os.path.join(isolation.cgroup, "cgroup.procs"), "0\n")
        for resource, soft, hard in isolation.rlimits:
            try:
                resource_module.setrlimit(resource, (soft, hard))
            except (ValueError, OSError):  # above what this process may raise to
                ceiling = resource_module.getrlimit(resource)[1]
                if ceiling != resource_module.RLIM_INFINITY:
                    soft = ceiling if soft == resource_module.RLIM_INFINITY else min(
                        soft, ceiling)
                resource_module.setrlimit(resource, (soft, ceiling))
        for sig in signal.valid_signals():
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, signal.SIG_DFL)
        reset_reserved()
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.setgroups([])
        if isolation.scope:  # systemd-run, as root, becomes the user after the scope
            return
        os.setgid(gid)
        os.setuid(uid)
    return child


def _scratch_file(name: str, data: bytes = b"") -> int:
    """An anonymous file (no path anyone could open or replace) holding ``data``, at offset 0."""
    fd = os.memfd_create(f"gpushare-{name}", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_back(fd: int, limit: Optional[int]) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, left = [], limit
    while left is None or left > 0:
        chunk = os.read(fd, 1 << 20 if left is None else left)
        if not chunk:
            break
        chunks.append(chunk)
        if left is not None:
            left -= len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def signal_checked(pid: int, sig: int, check: "Callable[[int], bool]") -> bool:
    """Send ``sig`` to ``pid`` only when ``check(pid)`` holds, through a pidfd taken before
    the check: the process checked is the process signalled, even if it exits and its pid
    is reused in between. Without pidfds (kernels before 5.3) the check is made again right
    before ``kill``. Whether the check held (the signal may still find the process gone)."""
    try:
        pidfd: Optional[int] = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        pidfd = None
    try:
        if not check(pid):
            return False
        with contextlib.suppress(ProcessLookupError):
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            elif check(pid):
                os.kill(pid, sig)
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def wait_for_exit(pid: int, timeout: float) -> Optional[bool]:
    """Sleep until process ``pid`` exits (True) or ``timeout`` s pass (False), through a
    pidfd; None where the kernel has no pidfds (the caller then polls)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # Python < 3.9 or kernel < 5.3
        return None
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while not poller.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            if time.monotonic() >= deadline:
                return False
        return True
    finally:
        os.close(pidfd)


def _wait(proc: "subprocess.Popen", timeout: float) -> int:
    """The child's exit status; subprocess.TimeoutExpired after ``timeout`` seconds."""
    import subprocess

    exited = wait_for_exit(proc.pid, timeout)
    if exited is None:
        return proc.wait(timeout=timeout)  # sleeps and polls
    if not exited:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return proc.wait()


def _kill_group(proc: "subprocess.Popen") -> None:
    """Kill the child's process group (created by us through start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError as err:
        if err.errno != errno.ESRCH:
            raise
    with contextlib.suppress(OSError):
        proc.kill()


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str],
    input_text: str = "",
    uid: Optional[int] = None,
    gid: Optional[int] = None,
    check: bool = False,
    output_limit: Optional[int] = _OUTPUT_LIMIT,
    isolate: Optional[Isolation] = None,
) -> Result:
    """Run ``argv`` with exactly ``env``, as ``uid``/``gid`` when given, within ``timeout`` s.

    Each of stdout and stderr is kept up to ``output_limit`` bytes (None: all of it).
    ``isolate`` (with ``uid``) starts it as a job's process starts (see the module).
    Raises CommandNotFound, CommandTimeout, or (with ``check``) CommandFailed.
    """
    import subprocess

    name = argv[0]
    fds: list[int] = []
    try:
        for stream, data in (("stdin", input_text.encode()), ("stdout", b""), ("stderr", b"")):
            fds.append(_scratch_file(stream, data))
    except OSError as err:
        for fd in fds:
            os.close(fd)
        raise ProcError(f"{name}: cannot set up its input and output ({err})") from None
    try:
        stdin, stdout, stderr = fds
        kwargs: dict = {}
        if isolate is not None and uid is not None:
            kwargs.update(umask=isolate.umask, preexec_fn=_isolating_child(
                isolate, uid, gid if gid is not None else uid))
            if isolate.scope:
                if not os.access(name, os.X_OK):  # systemd-run would only say exit 1
                    raise CommandNotFound(f"{name}: not found or not executable")
                argv = _in_scope(argv, isolate, uid, gid if gid is not None else uid)
        elif uid is not None:
            kwargs.update(user=uid, group=gid if gid is not None else uid, extra_groups=[])
        try:
            proc = subprocess.Popen(
                list(argv), stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env),
                cwd="/", close_fds=True, start_new_session=True, **kwargs,
            )
        except (FileNotFoundError, NotADirectoryError) as err:
            raise CommandNotFound(f"{name}: not found ({err.strerror})") from None
        except PermissionError as err:
            raise CommandNotFound(f"{name}: cannot be executed ({err.strerror})",
                                  denied=True) from None
        except OSError as err:
            raise ProcError(f"{name}: cannot be started ({err})") from None
        except subprocess.SubprocessError:  # raised in the isolating child, before exec
            raise ProcError(f"{name}: cannot be started: its oom_score_adj, "
                            f"{isolate.where() if isolate else 'cgroup'}, rlimits or signals "
                            "could not be set") from None
        try:
            returncode = _wait(proc, max(0.0, timeout))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            stuck = ""
            try:
                _wait(proc, KILLED_WAIT)
            except subprocess.TimeoutExpired:  # left for subprocess to reap once it dies
                stuck = (f"; it had not exited {KILLED_WAIT:g} s after SIGKILL (stuck in "
                         "the kernel?)")
            raise CommandTimeout(
                f"{' '.join(argv)}: no answer within {timeout:g} s, killed{stuck}"
            ) from None
        # A daemonising child may leave its group behind; nothing of it is ours to wait for.
        result = Result(tuple(argv), returncode, _read_back(stdout, output_limit),
                        _read_back(stderr, output_limit))
    finally:
        for fd in fds:
            os.close(fd)
    if check and result.returncode != 0:
        detail = result.output or "no output"
        raise CommandFailed(
            f"{' '.join(argv)}: exit status {result.returncode}: {detail}", result
        )
    return result
