# SPDX-License-Identifier: GPL-2.0-or-later
"""Timed external commands: exact environment, timeouts, missing programs, other users."""

from __future__ import annotations

import os
import signal
import time

import pytest

from gpushare.common import proc
from mps_standin.harness import running as _running

ENV = {"PATH": "/usr/bin:/bin"}


def test_runs_with_exactly_the_given_environment_and_input():
    result = proc.run(["/bin/sh", "-c", "env; cat"], env={"PATH": "/bin", "A": "1"},
                      input_text="hello\n", timeout=10)
    lines = result.stdout.splitlines()
    assert "A=1" in lines and "PATH=/bin" in lines and "hello" in lines
    assert not any(line.startswith("HOME=") for line in lines)
    assert result.returncode == 0


def test_nonzero_exit_is_a_result_or_with_check_an_error():
    result = proc.run(["/bin/sh", "-c", "echo oops >&2; exit 3"], env=ENV, timeout=10)
    assert (result.returncode, result.output) == (3, "oops")
    with pytest.raises(proc.CommandFailed, match=r"exit status 3: oops"):
        proc.run(["/bin/sh", "-c", "echo oops >&2; exit 3"], env=ENV, timeout=10, check=True)


def test_a_hanging_command_is_killed_with_its_process_group(tmp_path):
    pidfile = tmp_path / "pid"
    with pytest.raises(proc.CommandTimeout, match=r"no answer within 0.5 s, killed"):
        proc.run(["/bin/sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], env=ENV,
                 timeout=0.5)
    background = int(pidfile.read_text())
    for _ in range(500):
        if not _running(background):
            break
        time.sleep(0.01)
    assert not _running(background)


def test_a_daemonising_child_does_not_make_us_wait_for_it():
    result = proc.run(["/bin/sh", "-c", "setsid sleep 60 & echo $!"], env=ENV, timeout=10)
    pid = int(result.stdout.strip())
    try:
        assert os.path.exists(f"/proc/{pid}")       # still running: we did not wait on it
    finally:
        os.kill(pid, signal.SIGKILL)


def test_missing_program_is_reported():
    with pytest.raises(proc.CommandNotFound, match=r"/nonexistent/prog: not found") as err:
        proc.run(["/nonexistent/prog"], env=ENV, timeout=10)
    assert not err.value.denied


def test_not_executable_program_is_reported(tmp_path):
    path = tmp_path / "prog"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o644)
    with pytest.raises(proc.CommandNotFound, match=r"cannot be executed") as err:
        proc.run([str(path)], env=ENV, timeout=10)
    assert err.value.denied


def test_output_is_cut_at_the_limit_unless_it_is_lifted():
    argv = ["/bin/sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x"]
    assert len(proc.run(argv, env=ENV, timeout=10).stdout) == 64 * 1024
    assert len(proc.run(argv, env=ENV, timeout=10, output_limit=None).stdout) == 200000


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to change user")
def test_runs_as_another_user_without_extra_groups():
    result = proc.run(["/usr/bin/id"], env=ENV, uid=65534, gid=65534, timeout=10, check=True)
    assert result.stdout.startswith("uid=65534(")
    assert "gid=65534(" in result.stdout
    assert "groups=65534(" in result.stdout and "," not in result.stdout.split("groups=")[1]


def test_wait_for_exit_wakes_on_the_exit_of_a_process_that_is_not_our_child():
    # A grandchild: started by a shell that exits at once, so only a pidfd can watch it.
    shell = proc.run(["/bin/sh", "-c", "sleep 0.3 >/dev/null 2>&1 & echo $!"], timeout=10,
                     env={"PATH": "/usr/bin:/bin"})
    pid = int(shell.stdout.strip())
    assert proc.wait_for_exit(pid, 0.05) in (False, None)  # still sleeping
    exited = proc.wait_for_exit(pid, 10)
    if exited is None:
        pytest.skip("this kernel has no pidfds")
    assert exited is True
    assert proc.wait_for_exit(pid, 1) is True  # gone (or a zombie nobody waits for)


def test_output_is_kept_apart_from_the_files_of_the_node():
    """stdout/stderr go to anonymous memory files: no path in /tmp that a user could read."""
    result = proc.run(["/bin/sh", "-c", "ls -l /proc/self/fd/1; echo err >&2"], timeout=10,
                      env={"PATH": "/usr/bin:/bin"})
    assert "memfd:gpushare-stdout" in result.stdout
    assert result.stderr == "err\n"


def test_without_pidfds_commands_still_finish_and_time_out(no_pidfds):
    """Kernels before 5.3 (RHEL 8's 4.18) have no pidfd_open: the wait polls instead."""
    assert proc.wait_for_exit(os.getpid(), 0.01) is None
    env = {"PATH": "/usr/bin:/bin"}
    assert proc.run(["/bin/echo", "hi"], timeout=10, env=env).stdout == "hi\n"
    started = time.monotonic()
    with pytest.raises(proc.CommandTimeout):
        proc.run(["/bin/sleep", "30"], timeout=0.3, env=env)
    assert time.monotonic() - started < 10


def test_a_program_is_found_on_the_given_path_and_gets_only_its_three_descriptors():
    leaked = os.open("/dev/null", os.O_RDONLY)  # inheritable, as a careless caller's fd
    os.set_inheritable(leaked, True)
    try:
        result = proc.run(["ls", "/proc/self/fd"], env={"PATH": "/nonexistent:/usr/bin:/bin"},
                          timeout=10)
    finally:
        os.close(leaked)
    # 0-2, and the directory ls itself opened to list them.
    assert len(result.stdout.split()) == 4 and str(leaked) not in result.stdout.split()[:3]
    with pytest.raises(proc.CommandNotFound, match="not found"):
        proc.run(["ls"], env={"PATH": "/nonexistent"}, timeout=10)


def test_a_caller_without_stdin_still_hands_the_program_its_input():
    saved = os.dup(0)
    os.close(0)  # the scratch file for stdin becomes descriptor 0 itself
    try:
        result = proc.run(["/bin/cat"], input_text="fed\n", env=ENV, timeout=10)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert result.stdout == "fed\n"


def test_the_program_starts_with_sigpipe_as_a_shell_would_start_it():
    old = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        status = proc.run(["/bin/cat", "/proc/self/status"], env=ENV, timeout=10).stdout
    finally:
        signal.signal(signal.SIGPIPE, old)
    ignored = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("SigIgn:")), 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


def test_signal_checked_signals_only_what_the_check_accepts():
    """The check is made on the process the pidfd holds; a refused pid is left alone."""
    import subprocess

    child = subprocess.Popen(["sleep", "30"])
    try:
        seen = []
        assert not proc.signal_checked(child.pid, signal.SIGTERM,
                                       lambda pid: seen.append(pid) or False)
        assert seen == [child.pid] and child.poll() is None
        assert proc.signal_checked(child.pid, signal.SIGTERM, lambda pid: True)
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_command_that_outlives_its_kill_is_left_not_waited_for(monkeypatch, tmp_path):
    """A process stuck in the kernel survives SIGKILL: run() gives up on it after
    KILLED_WAIT instead of blocking its caller's deadline (the kill is made a no-op here,
    so the child lives on as a stuck one would)."""
    monkeypatch.setattr(proc, "_kill_group", lambda child: None)
    monkeypatch.setattr(proc, "KILLED_WAIT", 0.2)
    marker = tmp_path / "pid"
    try:
        with pytest.raises(proc.CommandTimeout, match=r"no answer within 0.3 s, killed; it had "
                           r"not exited 0.2 s after SIGKILL \(stuck in the kernel\?\)"):
            proc.run(["/bin/sh", "-c", f"echo $$ > {marker}; exec sleep 30"], timeout=0.3,
                     env={"PATH": "/usr/bin:/bin"})
    finally:
        if marker.exists():
            os.kill(int(marker.read_text()), signal.SIGKILL)
