# SPDX-License-Identifier: GPL-2.0-or-later
"""The nvidia-cuda-mps-control stand-in behaves like the real command line and pipe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from mps_standin.harness import PROGRAM_NAME, StandinInstall

pytestmark = pytest.mark.skipif(shutil.which("cc") is None,
                                reason="the stand-in is built with a C compiler (cc)")


@pytest.fixture
def standin(tmp_path):
    install = StandinInstall(str(tmp_path))
    env = {
        "PATH": "/usr/bin:/bin",
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
        "CUDA_VISIBLE_DEVICES": "GPU-aaa,MIG-bbb",
    }
    install.env = env
    yield install
    assert install.kill_all() == []


def run(standin, *args, stdin="", extra_env=None):
    env = dict(standin.env, **(extra_env or {}))
    return subprocess.run([standin.program, *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=30)


def wait_for(path):
    for _ in range(1000):
        if os.path.exists(path):
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


def _cmdline(pid: int) -> bytes:
    """/proc/<pid>/cmdline, read again for up to 5 s while it is empty (a process in the
    middle of its execve)."""
    deadline = time.monotonic() + 5
    while True:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            text = handle.read()
        if text or time.monotonic() > deadline:
            return text
        time.sleep(0.01)


def state(standin):
    with open(os.path.join(standin.env["CUDA_MPS_LOG_DIRECTORY"], "standin-state.json")) as f:
        return json.load(f)


def test_daemon_layout_commands_and_quit(standin):
    pipe = standin.env["CUDA_MPS_PIPE_DIRECTORY"]
    assert run(standin, "-d").returncode == 0
    wait_for(os.path.join(pipe, "control"))
    assert {"control", "control_lock", "log", "nvidia-cuda-mps-control.pid"} <= set(
        os.listdir(pipe))
    daemon_pid = state(standin)["pid"]
    with open(os.path.join(pipe, "nvidia-cuda-mps-control.pid")) as handle:
        assert int(handle.read()) == daemon_pid

    second = run(standin, "-d")
    assert (second.returncode, second.stderr) == (
        1, "An instance of this daemon is already running\n")

    out = run(standin, stdin="get_server_list\n"
                             "set_default_active_thread_percentage 25\n"
                             "get_default_active_thread_percentage\n"
                             "set_default_device_pinned_mem_limit 1 10G\n"
                             "get_default_device_pinned_mem_limit 1\n"
                             "lsdevice\n")
    assert out.returncode == 0
    assert out.stdout.splitlines() == ["25.0", "25.0", "10G", "0 GPU-aaa", "1 MIG-bbb"]

    server = run(standin, stdin=f"start_server -uid {os.getuid()}\n").stdout.strip()
    assert run(standin, stdin="get_server_list\n").stdout.split() == [server]
    out = run(standin, stdin=f"get_active_thread_percentage {server}\n"
                             f"set_active_thread_percentage {server} 10\n"
                             f"get_device_pinned_mem_limit {server} 1\n"
                             f"get_client_list {server}\n")
    assert out.stdout.splitlines() == ["25.0", "10.0", "10G"]

    bad = run(standin, stdin="set_default_device_pinned_mem_limit 2 10G\nfrobnicate\n")
    assert bad.returncode == 1
    assert bad.stdout.splitlines() == ["Invalid arguments 2 10G", "Unknown command: frobnicate"]

    assert run(standin, stdin="quit\n").returncode == 0
    for _ in range(1000):
        if state(standin)["stopped_at"]:
            break
        time.sleep(0.01)
    # The daemon records its stop, then exits: it must be gone soon after (bounded wait).
    deadline = time.monotonic() + 10
    while standin.processes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert standin.processes() == []
    final = state(standin)
    assert final["stopped_at"] is not None
    assert final["commands"][-1] == "quit"
    assert final["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-aaa,MIG-bbb"
    assert "control" not in os.listdir(pipe)
    with open(os.path.join(standin.env["CUDA_MPS_LOG_DIRECTORY"], "control.log")) as handle:
        log = handle.read()
    assert "User command: quit" in log and "Starting new server" in log


def test_client_without_daemon(standin):
    out = run(standin, stdin="get_server_list\n")
    assert (out.returncode, out.stdout) == (1, "Cannot find MPS control daemon process\n")


def test_faults_from_environment_and_from_the_file_next_to_it(standin):
    out = run(standin, "-d", extra_env={"GPUSHARE_STANDIN_FAULT": "die_start"})
    assert out.returncode == 1 and "stand-in fault die_start" in out.stderr
    standin.set_faults("die_start")
    out = run(standin, "-d")
    assert out.returncode == 1 and "stand-in fault die_start" in out.stderr
    standin.clear_faults()
    with pytest.raises(ValueError, match="unknown stand-in fault"):
        standin.set_faults("explode")


def test_hang_start_never_returns(standin):
    standin.set_faults("hang_start")
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([standin.program, "-d"], env=standin.env, timeout=1,
                       capture_output=True)
    standin.kill_all()


def test_client_mode_is_the_compiled_front_end(standin):
    """The plugin pays for a C client per control command, as with NVIDIA's program."""
    with open(standin.program, "rb") as handle:
        assert handle.read(4) == b"\x7fELF"
    assert os.access(standin.program, os.X_OK)
    assert os.listdir(standin.bindir) == [PROGRAM_NAME]  # one program, nothing beside it


def fd_targets(pid):
    """fd -> what it points at, for a process past its start: just after exec the dynamic
    loader opens and closes its libraries, so a listing may name an fd gone a moment later
    (never one inherited: those stay open)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return {fd: os.readlink(f"/proc/{pid}/fd/{fd}")
                    for fd in os.listdir(f"/proc/{pid}/fd")}
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_the_daemon_and_its_servers_are_the_same_native_program(standin):
    """As NVIDIA's: ``-d`` starts no interpreter, so a prolog pays a native daemon's start;
    the servers it starts are the program too, and inherit none of its files."""
    pipe = standin.env["CUDA_MPS_PIPE_DIRECTORY"]
    assert run(standin, "-d").returncode == 0
    wait_for(os.path.join(pipe, "control"))
    daemon = state(standin)["pid"]
    server = int(run(standin, stdin=f"start_server -uid {os.getuid()}\n").stdout)
    for pid in (daemon, server):
        assert os.readlink(f"/proc/{pid}/exe") == os.path.realpath(standin.program)
    # Read until the kernel shows its arguments: the daemon answers with the pid as soon as
    # it forked, and within the server's execve the new program is its exe (begin_new_exec)
    # before its argument pages are set up (create_elf_tables), a window in which cmdline
    # reads empty; a loaded machine has been seen to land in it.
    assert _cmdline(server).split(b"\0")[1:] == [b"--server", b""]
    # stdio on /dev/null, and not the daemon's socket, lock or log pipe
    targets = fd_targets(server)
    for fd, target in targets.items():
        assert not target.startswith((pipe, "socket:")), (fd, target)
    assert [targets[fd] for fd in ("0", "1", "2")] == ["/dev/null"] * 3
    assert run(standin, stdin="quit\n").returncode == 0
    deadline = time.monotonic() + 10
    while standin.processes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert standin.processes() == []
    assert state(standin)["stopped_at"] is not None


def test_sigterm_stops_the_daemon_and_its_servers_and_exited_servers_are_reaped(standin):
    pipe = standin.env["CUDA_MPS_PIPE_DIRECTORY"]
    assert run(standin, "-d").returncode == 0
    wait_for(os.path.join(pipe, "control"))
    daemon = state(standin)["pid"]
    first = run(standin, stdin=f"start_server -uid {os.getuid()}\n").stdout.strip()
    second = run(standin, stdin="start_server -uid 4242\n").stdout.strip()
    assert list(state(standin)["servers"]) == [first, second]
    assert state(standin)["servers"][second] == {"uid": 4242, "active_thread_percentage": 100.0,
                                                "pinned": {}}
    assert run(standin, stdin=f"shutdown_server {second} -f\n").returncode == 0
    deadline = time.monotonic() + 10
    while run(standin, stdin="get_server_list\n").stdout.split() != [first]:
        assert time.monotonic() < deadline, "the server that exited is still listed"
        time.sleep(0.01)
    os.kill(daemon, 15)
    while standin.processes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert standin.processes() == []
    assert os.listdir(pipe) == ["control_lock"]
    final = state(standin)
    assert final["stopped_at"] >= final["started_at"] and final["servers"] == {}
    with open(os.path.join(standin.env["CUDA_MPS_LOG_DIRECTORY"], "control.log")) as handle:
        lines = [line.split("] ", 1)[1] for line in handle.read().splitlines()]
    assert lines[0] == f"Control daemon started, pid {daemon}, devices GPU-aaa,MIG-bbb"
    assert f"Server {second} exited" in lines
    assert lines[-1] == "Control daemon stopping (SIGTERM)"


def test_the_state_file_holds_any_environment_and_command_as_json(standin):
    """Values as Python's os.environ and json.dump give them: escapes, non-ASCII, and bytes
    that are no UTF-8 (surrogate escapes)."""
    odd = 'q"b\\s\x01\x7f\n\té\U0001f600'
    env = dict(standin.env, ODD=odd)
    env_bytes = {k.encode(): v.encode() for k, v in env.items()}
    env_bytes[b"RAW"] = b"a\xff\xe2\x82b"
    assert subprocess.run([standin.program, "-d"], env=env_bytes, timeout=30).returncode == 0
    wait_for(os.path.join(standin.env["CUDA_MPS_PIPE_DIRECTORY"], "control"))
    out = run(standin, stdin="set_default_active_thread_percentage 33.3333\n"
                             "set_default_active_thread_percentage 1_2.5e0\n"
                             "echo  \x1c\u00a0x\u3000y \n")
    assert out.stdout.splitlines() == ["33.3", "12.5", "Unknown command: echo x y"]
    with open(os.path.join(standin.env["CUDA_MPS_LOG_DIRECTORY"], "standin-state.json"),
              "rb") as handle:
        raw = handle.read()
    assert raw.isascii()  # as json.dump writes it: everything else escaped
    final = json.loads(raw)
    assert final["env"]["ODD"] == odd
    assert final["env"]["RAW"] == b"a\xff\xe2\x82b".decode("utf-8", "surrogateescape")
    assert final["default_active_thread_percentage"] == 12.5
    assert final["commands"][-1] == "echo  \x1c\u00a0x\u3000y"
    assert run(standin, stdin="quit\n").returncode == 0
    deadline = time.monotonic() + 10
    while standin.processes() and time.monotonic() < deadline:
        time.sleep(0.01)
