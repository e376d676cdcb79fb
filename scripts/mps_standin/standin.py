# SPDX-License-Identifier: GPL-2.0-or-later
"""Stand-in for nvidia-cuda-mps-control on machines without a GPU (tests and demo only).

Installed beside its C front end (``front.c``, built as ``nvidia-cuda-mps-control``), which
answers client mode itself (no arguments: one control command per stdin line, sent to
the daemon over ``$CUDA_MPS_PIPE_DIRECTORY/control``, a SOCK_SEQPACKET socket as the real
one) and runs this file for the rest of the command line: ``-d`` daemonise, ``-f`` run in
the foreground and ``-v``. The servers the daemon starts are the front end too
(``--server``).
Honours CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) and CUDA_MPS_LOG_DIRECTORY
(default /var/log/nvidia-mps); writes ``nvidia-cuda-mps-control.pid``, ``control_lock``
and a ``log`` FIFO in the pipe directory and ``control.log`` in the log directory.

For tests it keeps ``<log dir>/standin-state.json`` (pid, uid, environment, defaults,
servers, commands received, start/stop times) and fails on demand. Faults are read from
GPUSHARE_STANDIN_FAULT (comma separated) and from a file ``faults`` next to this script
(whitespace separated; root writes it, so a test can set a fault on a daemon started
with a clean environment; a running daemon reads it again on each quit and SIGTERM):

  die_start        -d prints an error and exits 1
  hang_start       -d never returns and starts nothing
  slow_start       -d takes 1.5 s before it starts the daemon
  die_after_start  -d returns 0 but the daemon exits at once
  ignore_quit      the daemon answers quit but keeps running
  ignore_term      the daemon ignores quit and SIGTERM (SIGKILL still works)
  hang_client      client mode never returns (read by the front end)
  no_pid_file      the daemon writes no nvidia-cuda-mps-control.pid
"""

import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time

SCRIPT = os.path.realpath(__file__)
FRONT = os.path.join(os.path.dirname(SCRIPT), "nvidia-cuda-mps-control")
PIPE_DIR = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
LOG_DIR = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
CONTROL = os.path.join(PIPE_DIR, "control")
PID_FILE = os.path.join(PIPE_DIR, "nvidia-cuda-mps-control.pid")
LOCK_FILE = os.path.join(PIPE_DIR, "control_lock")
STATE_FILE = os.path.join(LOG_DIR, "standin-state.json")


def faults():
    names = set(filter(None, os.environ.get("GPUSHARE_STANDIN_FAULT", "").split(",")))
    try:
        with open(os.path.join(os.path.dirname(SCRIPT), "faults")) as handle:
            names.update(handle.read().split())
    except OSError:
        pass
    return names


def sleep_forever():
    while True:
        time.sleep(3600)


def devices():
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return ["GPU-standin-0"]
    return [d.strip() for d in visible.split(",") if d.strip()]


class Daemon:
    """The control daemon: one command per connection, replies ``<rc>\n<output>``."""

    def __init__(self):
        self.faults = faults()
        self.servers = {}  # pid -> {"uid", "active_thread_percentage", "pinned"}
        self.state = {
            "pid": os.getpid(),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "groups": os.getgroups(),
            "argv": sys.argv,
            "env": dict(os.environ),
            "devices": devices(),
            "faults": sorted(self.faults),
            "default_active_thread_percentage": 100.0,
            "default_device_pinned_mem_limit": {},
            "servers": {},
            "commands": [],
            "started_at": time.time(),
            "stopped_at": None,
        }
        self.lock_fd = None
        self.sock = None

    def log(self, line):
        with open(os.path.join(LOG_DIR, "control.log"), "a") as handle:
            handle.write(time.strftime("[%Y-%m-%d %H:%M:%S] ") + line + "\n")

    def save(self):
        self.state["servers"] = {str(pid): info for pid, info in self.servers.items()}
        tmp = STATE_FILE + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.state, handle)
        os.replace(tmp, STATE_FILE)

    def setup(self):
        os.makedirs(PIPE_DIR, exist_ok=True)
        os.makedirs(LOG_DIR, exist_ok=True)
        self.lock_fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            sys.stderr.write("An instance of this daemon is already running\n")
            sys.exit(1)
        if os.path.exists(CONTROL):
            os.unlink(CONTROL)
        # The control socket appears last, and already listening: a client that sees it
        # also finds the pid file and the log pipe, and its connect is never refused.
        pending = CONTROL + ".new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pending)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(pending)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        with contextlib.suppress(FileExistsError):
            os.mkfifo(os.path.join(PIPE_DIR, "log"), 0o600)
        if "no_pid_file" not in self.faults:
            with open(PID_FILE, "w") as handle:
                handle.write(f"{os.getpid()}\n")
        signal.signal(signal.SIGTERM, self.on_sigterm)
        self.log(f"Control daemon started, pid {os.getpid()}, devices {','.join(devices())}")
        self.save()
        os.rename(pending, CONTROL)

    def on_sigterm(self, *_):
        if "ignore_term" in faults():
            self.log("SIGTERM ignored (stand-in fault ignore_term)")
            return
        self.stop("SIGTERM")

    def stop(self, why):
        for pid in list(self.servers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in list(self.servers):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.servers.clear()
        for path in (CONTROL, PID_FILE, os.path.join(PIPE_DIR, "log")):
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.log(f"Control daemon stopping ({why})")
        self.state["stopped_at"] = time.time()
        self.save()
        os._exit(0)

    def reap(self):
        for pid in list(self.servers):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                del self.servers[pid]
                self.log(f"Server {pid} exited")

    def serve(self):
        while True:
            self.reap()
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    line = conn.recv(4096).decode().strip()
                except OSError:
                    continue
                if not line:
                    continue
                self.state["commands"].append(line)
                self.log(f"User command: {line}")
                out, rc, then_quit = self.handle(line.split())
                self.save()
                with contextlib.suppress(OSError):
                    conn.send(f"{rc}\n{out}".encode())
            if then_quit:
                self.stop("quit")

    def server_pid(self, word):
        try:
            pid = int(word)
        except ValueError:
            return None
        return pid if pid in self.servers else None

    def handle(self, words):
        cmd, args = words[0], words[1:]
        if cmd == "quit":
            if {"ignore_quit", "ignore_term"} & faults():
                self.log("quit ignored (stand-in fault ignore_quit)")
                return "", 0, False
            return "", 0, True
        if cmd == "get_server_list":
            return "\n".join(str(pid) for pid in sorted(self.servers)), 0, False
        if cmd == "start_server" and len(args) >= 2 and args[0] == "-uid":
            uid = int(args[1])
            if uid != os.getuid() and os.getuid() != 0:
                return f"Cannot start server for uid {uid}: permission denied", 1, False
            for pid, info in self.servers.items():
                if info["uid"] == uid:
                    return str(pid), 0, False
            pid = spawn_server()
            self.servers[pid] = {
                "uid": uid,
                "active_thread_percentage": self.state["default_active_thread_percentage"],
                "pinned": dict(self.state["default_device_pinned_mem_limit"]),
            }
            self.log(f"Starting new server {pid} for user {uid}")
            return str(pid), 0, False
        if cmd == "shutdown_server" and args:
            pid = self.server_pid(args[0])
            if pid is None:
                return f"Server {args[0]} not found", 1, False
            os.kill(pid, signal.SIGKILL if "-f" in args else signal.SIGTERM)
            return "", 0, False
        if cmd == "get_client_list" and args:
            if self.server_pid(args[0]) is None:
                return f"Server {args[0]} not found", 1, False
            return "", 0, False
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            value = percentage(args[0])
            if value is None:
                return f"Invalid percentage {args[0]}", 1, False
            self.state["default_active_thread_percentage"] = value
            return f"{value:.1f}", 0, False
        if cmd == "get_default_active_thread_percentage":
            return f"{self.state['default_active_thread_percentage']:.1f}", 0, False
        if cmd == "set_active_thread_percentage" and len(args) == 2:
            pid, value = self.server_pid(args[0]), percentage(args[1])
            if pid is None or value is None:
                return f"Invalid arguments {' '.join(args)}", 1, False
            self.servers[pid]["active_thread_percentage"] = value
            return f"{value:.1f}", 0, False
        if cmd == "get_active_thread_percentage" and len(args) == 1:
            pid = self.server_pid(args[0])
            if pid is None:
                return f"Server {args[0]} not found", 1, False
            return f"{self.servers[pid]['active_thread_percentage']:.1f}", 0, False
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            dev, size = device_index(args[0]), mem_size(args[1])
            if dev is None or size is None:
                return f"Invalid arguments {' '.join(args)}", 1, False
            self.state["default_device_pinned_mem_limit"][str(dev)] = size
            return "", 0, False
        if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
            dev = device_index(args[0])
            if dev is None:
                return f"Invalid device {args[0]}", 1, False
            return self.state["default_device_pinned_mem_limit"].get(str(dev), "0"), 0, False
        if cmd == "set_device_pinned_mem_limit" and len(args) == 3:
            pid, dev, size = self.server_pid(args[0]), device_index(args[1]), mem_size(args[2])
            if pid is None or dev is None or size is None:
                return f"Invalid arguments {' '.join(args)}", 1, False
            self.servers[pid]["pinned"][str(dev)] = size
            return "", 0, False
        if cmd == "get_device_pinned_mem_limit" and len(args) == 2:
            pid, dev = self.server_pid(args[0]), device_index(args[1])
            if pid is None or dev is None:
                return f"Invalid arguments {' '.join(args)}", 1, False
            return self.servers[pid]["pinned"].get(str(dev), "0"), 0, False
        if cmd == "lsdevice":
            return "\n".join(f"{i} {uuid}" for i, uuid in enumerate(devices())), 0, False
        if cmd == "ps":
            rows = ["PID ID SERVER DEVICE NAMESPACE COMMAND"]
            rows += [f"{pid} {i} - - - nvidia-cuda-mps-server"
                     for i, pid in enumerate(sorted(self.servers))]
            return "\n".join(rows), 0, False
        return f"Unknown command: {' '.join(words)}", 1, False


def percentage(word):
    try:
        value = float(word)
    except ValueError:
        return None
    return value if 0 < value <= 100 else None


def device_index(word):
    try:
        index = int(word)
    except ValueError:
        return None
    return index if 0 <= index < len(devices()) else None


def mem_size(word):
    if len(word) >= 2 and word[:-1].isdigit() and word[-1] in "MG" and int(word[:-1]) > 0:
        return word
    return None


def spawn_server():
    """Start a server (the front end with --server), its stdio on /dev/null; its pid.

    posix_spawn, not subprocess: the daemon's own fds are close-on-exec, and importing
    subprocess would add to every daemon start a benchmark pays for.
    """
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        actions = [(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
        return os.posix_spawn(FRONT, [FRONT, "--server"], dict(os.environ),
                              file_actions=actions)
    finally:
        os.close(devnull)


def daemon_in_use():
    """True when a live daemon holds this pipe directory's control_lock."""
    try:
        fd = os.open(LOCK_FILE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def start(background):
    active = faults()
    if "die_start" in active:
        sys.stderr.write("An error occurred while starting the control daemon "
                         "(stand-in fault die_start)\n")
        return 1
    if "hang_start" in active:
        sleep_forever()
    if "slow_start" in active:
        time.sleep(1.5)
    if daemon_in_use():
        sys.stderr.write("An instance of this daemon is already running\n")
        return 1
    if background:
        if os.fork():
            return 0
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.umask(0o077)
    if "die_after_start" in active:
        # As NVIDIA's daemon does when a GPU cannot be used: a line in control.log, then exit.
        with open(os.path.join(LOG_DIR, "control.log"), "a") as handle:
            handle.write("[stand-in] Failed to start the control daemon: no usable GPU "
                         "(stand-in fault die_after_start)\n")
        os._exit(1)
    daemon = Daemon()
    daemon.setup()
    daemon.serve()
    return 0


def main(argv):
    if "-v" in argv:
        print("nvidia-cuda-mps-control stand-in 0.1")
        return 0
    if "-d" in argv:
        return start(background=True)
    if "-f" in argv:
        return start(background=False)
    sys.stderr.write(f"Unknown option {argv[0] if argv else '(none)'}; client mode is "
                     "the front end's (no arguments)\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
