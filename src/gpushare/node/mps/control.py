# SPDX-License-Identifier: GPL-2.0-or-later
"""The control protocol: commands written to ``nvidia-cuda-mps-control`` run as the
daemon's user in client mode, one per line, through the daemon's pipe directory."""

from gpushare.common import proc
from gpushare.node import counters
from gpushare.node.mps.errors import MpsError
from gpushare.node.mps.limits import Limits
from gpushare.node.mps.record import DaemonRecord

DAEMON_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def daemon_env(rec: DaemonRecord) -> dict[str, str]:
    """The whole environment a daemon starts with (``<program> -d``)."""
    return {
        "PATH": DAEMON_PATH,
        "CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in rec.devices),
        "CUDA_MPS_PIPE_DIRECTORY": rec.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": rec.log_dir,
    }


def client_env(rec: DaemonRecord) -> dict[str, str]:
    """The whole environment of a control command sent to a running daemon."""
    return {
        "PATH": DAEMON_PATH,
        "CUDA_MPS_PIPE_DIRECTORY": rec.pipe_dir,
        "CUDA_MPS_LOG_DIRECTORY": rec.log_dir,
    }


def default_cap_commands(caps: Limits) -> list[str]:
    """Set a daemon's caps for the servers it starts from now on."""
    cmds = [f"set_default_active_thread_percentage {caps.percent}"]
    cmds += [f"set_default_device_pinned_mem_limit {i} {size}"
             for i, size in sorted(caps.mem)]
    return cmds


def server_cap_commands(servers: list[int], caps: Limits) -> list[str]:
    """Set the caps on running servers (``get_server_list``'s pids), for their new clients."""
    cmds = []
    for pid in servers:
        cmds.append(f"set_active_thread_percentage {pid} {caps.percent}")
        cmds += [f"set_device_pinned_mem_limit {pid} {i} {size}"
                 for i, size in sorted(caps.mem)]
    return cmds


def server_list(result: proc.Result) -> list[int]:
    """The pids ``get_server_list`` answered."""
    return [int(w) for w in result.stdout.split() if w.isdigit()]


def send(program: str, rec: DaemonRecord, commands: list[str], timeout: float) -> proc.Result:
    """Send control commands through the daemon's pipe, as the daemon's user."""
    try:
        result = proc.run([program], input_text="\n".join(commands) + "\n",
                          env=client_env(rec), uid=rec.uid, gid=rec.gid, timeout=timeout)
    except proc.ProcError as err:
        counters.command_error(err)
        raise MpsError(f"{rec.describe()}: control command {commands[0]!r} "
                       f"failed: {err}") from None
    if result.returncode != 0:
        raise MpsError(f"{rec.describe()}: control command {commands[0]!r} failed "
                       f"(exit {result.returncode}): {result.output or 'no output'}")
    return result
