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

__all__ = ["CommandFailed", "CommandNotFound", "CommandTimeout", "ProcError", "Result", "run",
           "wait_for_exit"]

_OUTPUT_LIMIT = 64 * 1024


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
) -> Result:
    """Run ``argv`` with exactly ``env``, as ``uid``/``gid`` when given, within ``timeout`` s.

    Each of stdout and stderr is kept up to ``output_limit`` bytes (None: all of it).
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
        if uid is not None:
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
        try:
            returncode = _wait(proc, max(0.0, timeout))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            raise CommandTimeout(
                f"{' '.join(argv)}: no answer within {timeout:g} s, killed"
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
