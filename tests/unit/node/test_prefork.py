# SPDX-License-Identifier: GPL-2.0-or-later
"""The prefork server (gpushare.node.prefork): a worker's callback runs in a fresh child with
the worker's own ids, options, environment, umask and a session of its own; only root is
served; a server whose code changed on disk refuses and ends; one server per node."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import stat
import struct
import tempfile
import time
from typing import Any, Optional

import pytest

from gpushare.node import prefork
from procfs import unix_listening

CODE = "0123456789abcdef"
ROOT = pathlib.Path(__file__).resolve().parents[3]


def request_bytes(callback: str = "job_prolog", code: str = CODE, env: Optional[dict] = None,
                  umask: int = 0o022, options: Optional[dict] = None) -> bytes:
    """What spank/gs_prefork.c sends."""
    fields = [prefork.PROTOCOL.decode(), callback, f"code={code}", "job_id=42", "uid=1001",
              "gid=1002", "deadline=123.5", f"umask={umask:o}"]
    fields += [f"opt.{k}={v}" for k, v in (options or {"gpu-share": "25"}).items()]
    fields += ["arg=state_dir=/x", "arg=timeout=10"]
    fields += [f"env={k}={v}" for k, v in (env or {"SLURM_JOB_ID": "42"}).items()]
    return b"\0".join(f.encode() for f in fields) + b"\0\0"


def frames(conn: socket.socket) -> list[tuple[bytes, bytes]]:
    """Every frame until the server's child closes the connection."""
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    out = []
    while data:
        kind, (length,) = data[:1], struct.unpack(">I", data[1:5])
        out.append((kind, data[5:5 + length]))
        data = data[5 + length:]
    return out


def recording_run(out_dir: str):
    def run(request: prefork.Request, host: Any) -> int:
        host.log(1, b"hello from the child")
        with open(os.path.join(out_dir, f"ran.{os.getpid()}.json"), "w") as handle:
            json.dump({"pid": os.getpid(), "sid": os.getsid(0), "umask": os.umask(0),
                       "env": dict(os.environ), "ids": [request.job_id, request.uid,
                                                        request.gid],
                       "options": request.options, "args": request.args,
                       "deadline": host.deadline, "callback": request.callback}, handle)
        return 7
    return run


@pytest.fixture
def server(tmp_path):
    """A server in a process of its own (it forks per request), its state directory one
    that every user can reach (as /run/gpushare is), the children's reports in tmp_path."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="gs-prefork-", dir="/tmp"))
    os.chmod(base, 0o755)
    state = base / "state"
    state.mkdir(mode=0o755)
    out = tmp_path / "out"
    out.mkdir()
    pids = []

    def start(code: str = CODE, idle: float = 30.0) -> int:
        srv = prefork.Server(str(state), code, recording_run(str(out)), idle=idle)
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                if srv.bind():
                    srv.serve()
                    status = 0
            finally:
                os._exit(status)
        pids.append(pid)
        # Listening, not merely there: the server sets the socket's mode between its bind
        # and its listen, and a test that changes the mode must come after.
        wait_for(lambda: unix_listening(str(state / prefork.SOCKET)), "the socket listening")
        return pid

    yield start, state, out
    for pid in pids:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    shutil.rmtree(base)


def wait_for(check, what: str, limit: float = 30.0) -> None:
    until = time.monotonic() + limit
    while not check():
        if time.monotonic() > until:
            raise AssertionError(f"no {what} within {limit} s")
        time.sleep(0.02)


def connect(state) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(state / prefork.SOCKET))
    return conn


def ended(pid: int, limit: float = 30.0) -> Optional[int]:
    until = time.monotonic() + limit
    while time.monotonic() < until:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.05)
    return None


def test_a_callback_runs_in_a_child_with_the_workers_ids_options_env_and_umask(server):
    start, state, out = server
    server_pid = start()
    with connect(state) as conn:
        conn.sendall(request_bytes(env={"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"},
                                   umask=0o027))
        got = frames(conn)
    kinds = [kind for kind, _ in got]
    assert kinds == [prefork.PID, prefork.LOG, prefork.RESULT], got
    child = int(got[0][1])
    assert got[1][1] == b"\x01hello from the child"
    assert got[2][1] == b"7"
    with open(out / f"ran.{child}.json") as handle:
        ran = json.load(handle)
    assert ran["pid"] == child != server_pid
    assert ran["sid"] == child  # a session of its own, as a worker's
    assert ran["umask"] == 0o027
    assert ran["env"] == {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"}
    assert ran["ids"] == [42, 1001, 1002]
    assert ran["options"] == {"gpu-share": "25"}
    assert ran["args"] == ["state_dir=/x", "timeout=10"]
    assert ran["deadline"] == 123.5
    assert ran["callback"] == "job_prolog"


def test_the_socket_is_roots_alone(server):
    start, state, _out = server
    start()
    info = os.lstat(state / prefork.SOCKET)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.getuid()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_a_peer_that_is_not_root_is_never_served(server):
    """Even with the socket opened to all (an admin's mistake), a user's connection is
    closed unread and runs nothing."""
    start, state, out = server
    start()
    os.chmod(state / prefork.SOCKET, 0o666)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            with connect(state) as conn:
                try:
                    conn.sendall(request_bytes())
                    got = frames(conn)
                except (BrokenPipeError, ConnectionResetError):  # closed unread
                    got = []
                os.write(write_end, json.dumps(got == []).encode())
            status = 0
        except BaseException as err:
            os.write(write_end, repr(err).encode())
        finally:
            os._exit(status)
    os.close(write_end)
    answer = os.read(read_end, 100)
    os.close(read_end)
    assert answer == b"true"
    assert ended(pid) == 0
    assert not list(out.iterdir())


def test_a_server_of_other_code_refuses_and_ends(server):
    start, state, out = server
    server_pid = start(code="ffffffffffffffff")
    with connect(state) as conn:
        conn.sendall(request_bytes(code=CODE))
        got = frames(conn)
    assert got == [(prefork.REFUSED, b"the code on disk changed since the server started")]
    assert ended(server_pid) is not None, "the stale server still runs"
    assert not os.path.exists(state / prefork.SOCKET)
    assert not list(out.iterdir())


def test_a_bad_request_is_refused_and_runs_nothing(server):
    start, state, out = server
    start()
    with connect(state) as conn:
        conn.sendall(b"gpushare-prefork 0\0job_prolog\0\0")
        got = frames(conn)
    assert [kind for kind, _ in got] == [prefork.REFUSED]
    assert not list(out.iterdir())


def test_one_server_per_node(server):
    start, state, _out = server
    start()
    second = prefork.Server(str(state), CODE, lambda request, host: 0)
    assert not second.bind()


def test_an_idle_server_ends_and_takes_its_socket(server):
    start, state, _out = server
    pid = start(idle=0.2)
    assert ended(pid) == 0
    assert not os.path.exists(state / prefork.SOCKET)


def test_a_server_whose_socket_is_removed_ends(server):
    start, state, _out = server
    pid = start()
    os.unlink(state / prefork.SOCKET)
    assert ended(pid) is not None


@pytest.mark.parametrize("data, why", [
    (b"nonsense\0\0", "not a gpushare-prefork 1 request"),
    (b"gpushare-prefork 1\0job_prolog\0job_id=1\0\0", "bad or missing field"),
    (b"gpushare-prefork 1\0job_prolog\0noequals\0\0", "field without '='"),
])
def test_parse_request_says_what_is_wrong(data, why):
    with pytest.raises(prefork.RequestError, match=why):
        prefork.parse_request(data)


@pytest.mark.parametrize("cgroups, inside", [
    ("0::/system.slice/slurmd.service\n", False),
    ("9:name=systemd:/\n4:memory:/process_api/fe35\n0::/\n", False),
    ("0::/system.slice/slurmstepd.scope/job_42/step_extern/slurm\n", True),
    ("4:memory:/slurm/uid_1001/job_7\n0::/\n", True),
    ("0::/system.slice/job_runner.service\n", False),
])
def test_a_server_inside_a_jobs_cgroup_does_not_serve(cgroups, inside):
    """There it would be killed with that job, and the jobs its children set up with it."""
    assert prefork.in_a_job_cgroup(cgroups) is inside


def test_a_log_line_too_long_for_the_workers_frames_is_cut():
    """The worker reads frames of at most 64 KiB and counts a longer one as a broken
    server: a huge traceback must never turn into a killed worker and a drained node."""
    left, right = socket.socketpair()
    with left, right:
        prefork._ChildHost(left, 0.0).log(0, b"x" * 200000)
        left.shutdown(socket.SHUT_WR)
        got = frames(right)
    assert len(got) == 1 and got[0][0] == prefork.LOG
    assert len(got[0][1]) <= 1 + prefork.LOG_MAX + len(b" [cut]") < 65536
    assert got[0][1].endswith(b" [cut]")


def test_the_snapshot_holds_every_option_the_core_asks_for():
    """The C glue sends the options spank/gs_prefork.c names; an option the core asks for
    beyond them would read as not given in the server's child. Both lists are held alike."""
    asked = set(re.findall(r'\.option\("([\w-]+)"\)',
                           (ROOT / "src/gpushare/node/spank_adapter.py").read_text()))
    c_text = (ROOT / "spank/gs_prefork.c").read_text()
    sent = set(re.findall(r'"([\w-]+)"', re.search(
        r"options\[\] = \{([^}]*)\}", c_text)[1]))  # type: ignore[index]
    assert asked and asked == sent, (asked, sent)


def test_the_c_glue_and_the_core_take_the_same_default():
    """prefork= left out means the same to the plugin (gs_args.c) and to the core
    (config.py): both on, or a worker would try a server the core does not run."""
    from gpushare.node.config import ARG_SPECS, PluginConfig

    c_default = re.search(r"^int gs_prefork = ([01]);", (ROOT / "spank/gs_args.c").read_text(),
                          re.M)
    assert c_default, "gs_args.c no longer initialises gs_prefork"
    (spec,) = [spec for spec in ARG_SPECS if spec.key == "prefork"]
    assert spec.default == "yes" and PluginConfig().prefork is True
    assert c_default[1] == "1"
