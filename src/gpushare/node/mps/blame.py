# SPDX-License-Identifier: GPL-2.0-or-later
"""Who made a daemon's start fail: its user, or the node.

A daemon runs as its job's user, in directories that user owns: the user can ``chmod``
them, kill or stop the daemon, or fill its log, and the start then fails the way a broken
GPU or driver makes it fail. So a failed start is charged to the node only when gpushare
can show it: the user's directories are as root made them, and the same program, started
by root in a directory of root's on the same GPUs (a probe no user can reach or signal),
fails too. Otherwise the job fails with what happened, and the node stays in service.
"""

import os
import signal
import time
from contextlib import suppress
from typing import TYPE_CHECKING

from gpushare.common import safefs
from gpushare.common.log import get_logger
from gpushare.node import counters
from gpushare.node.mps.errors import MpsError, MpsUserError
from gpushare.node.mps.record import DaemonRecord
from gpushare.node.mps.userdirs import exists_at
from gpushare.node.phases import time_left

if TYPE_CHECKING:
    from gpushare.node.mps.daemon import Daemons

__all__ = ["PROBE_PREFIX", "charge", "probe"]

LOG = get_logger("gpushare.mps")

# Root's probe directory among root's daemon records: ``.probe-<pid>/{pipe,log}``.
PROBE_PREFIX = ".probe-"


def charge(daemons: "Daemons", rec: DaemonRecord, what: str, short: str, cause: str,
           detail: str) -> MpsError:
    """The error for a start of ``rec``'s daemon that failed with ``cause``: MpsUserError
    when its user's directories changed or root's probe starts a daemon on the same GPUs,
    MpsError (the node's fault) when the probe fails too."""
    changed = daemons.dirs.changed(rec)
    if changed:
        counters.note("mps_user_start_failures")
        return MpsUserError(
            f"cannot start MPS for {rec.describe()}: {detail}; {changed}, which only its "
            "user can do while the daemon starts. Stop what changes the job's MPS "
            "directories and submit again",
            brief=f"MPS start of daemon {rec.key} failed: its user changed its directories")
    problem = probe(daemons, rec)
    if not problem:
        counters.note("mps_user_start_failures")
        return MpsUserError(
            f"cannot start MPS for {rec.describe()}: {cause}: {detail}; the same program "
            f"started by root on {short} works, so a process of uid {rec.uid} ended, "
            "stopped or disturbed this daemon while it started. Stop what signals the "
            "user's MPS processes and submit again",
            brief=f"MPS start of daemon {rec.key} failed: {cause}, not the node's fault "
                  "(root's probe works)")
    return MpsError(f"cannot start MPS on {what}: {detail}; root's probe on the same GPUs "
                    f"failed too: {problem}",
                    brief=f"MPS start failed: {cause} ({short}, daemon {rec.key})")


def probe(daemons: "Daemons", rec: DaemonRecord) -> str:
    """Start the daemon program as root on ``rec``'s GPUs in a fresh root-owned directory,
    wait for its control socket, ask it one command, then end it. "" when it answered;
    else what failed.

    Run only after a failed start, within the time the start left for it."""
    from gpushare.common import proc
    from gpushare.node.mps import control, isolation

    store = daemons.dirs.store
    name = f"{PROBE_PREFIX}{os.getpid()}"
    base = store.path(name)
    with store.dir_fd() as store_fd:
        for old in os.listdir(store_fd):
            if old.startswith(PROBE_PREFIX):
                safefs.remove_tree_at(store_fd, old)
        safefs.make_owned_dir(store_fd, name, base, 0, 0, 0o700)
        try:
            probe_rec = DaemonRecord(name, rec.mode, 0, 0, rec.devices,
                                     os.path.join(base, "pipe"), os.path.join(base, "log"))
            probe_fd = safefs.open_dir_at(store_fd, name, base, root_owned=True)
            try:
                for sub in ("pipe", "log"):
                    safefs.make_owned_dir(probe_fd, sub, os.path.join(base, sub), 0, 0, 0o700)
                try:
                    result = proc.run(
                        [daemons.program(), "-d"], env=control.daemon_env(probe_rec),
                        timeout=time_left(daemons.timeout),
                        isolate=proc.Isolation(rlimits=isolation.node_rlimits(
                            daemons.proc_root)))
                except proc.ProcError as err:
                    return f"{os.path.basename(daemons.program())} -d: {err}"
                if result.returncode != 0:
                    return (f"{os.path.basename(daemons.program())} -d exit "
                            f"{result.returncode}: {result.output or 'no output'}")
                return _wait_control(daemons, probe_rec, probe_fd) or _answers(daemons,
                                                                               probe_rec)
            finally:
                _end(daemons, probe_rec)
                os.close(probe_fd)
        finally:
            safefs.remove_tree_at(store_fd, name)


def _wait_control(daemons: "Daemons", probe_rec: DaemonRecord, probe_fd: int) -> str:
    pipe_fd = safefs.open_dir_at(probe_fd, "pipe", probe_rec.pipe_dir, root_owned=True)
    try:
        seconds = time_left(daemons.timeout)
        deadline = time.monotonic() + seconds
        pause = 0.0005
        while not exists_at(pipe_fd, "control"):
            if time.monotonic() > deadline:
                return f"no control socket within {seconds:g} s"
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
    finally:
        os.close(pipe_fd)
    return ""


def _answers(daemons: "Daemons", probe_rec: DaemonRecord) -> str:
    """"" when the probe daemon answers a control command, as a user's first one must."""
    try:
        daemons.control(probe_rec, ["get_server_list"])
    except MpsError as err:
        return str(err)
    return ""


def _end(daemons: "Daemons", probe_rec: DaemonRecord) -> None:
    """End root's probe daemon: ``quit``, then SIGKILL whatever of it is left."""
    with suppress(MpsError):
        daemons.control(probe_rec, ["quit"])
    left = daemons.leftovers(probe_rec)
    if left and not daemons.wait_gone(left, max(time_left(1.0), 0.2)):
        for pid in left:
            daemons.signal_if_ours(pid, probe_rec, signal.SIGKILL)
        daemons.wait_gone(left, 1.0)
    left = daemons.leftovers(probe_rec)
    if left:
        LOG.error("root's MPS probe left pids %s in %s", " ".join(map(str, left)),
                  probe_rec.pipe_dir)
