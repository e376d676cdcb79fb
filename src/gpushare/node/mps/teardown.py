# SPDX-License-Identifier: GPL-2.0-or-later
"""Ending everything in a retired daemon's cgroup or scope, not only what looks like MPS.

A user may take over their own daemon (ptrace, where ``kernel.yama.ptrace_scope`` allows
it) and fork a child that is no MPS program: ``procscan`` never calls it the daemon's, so
only the cgroup or scope the daemon started in still holds it. When the daemon retires,
all of that ends, as a job's cgroup does:

* a cgroup of gpushare's (``mps_cgroup=auto`` without systemd, or a directory): ``1`` to
  its ``cgroup.kill`` (Linux 5.14+); before that kernel, the cgroup is frozen where it can
  be (``cgroup.freeze``, 5.2+) and each process ``cgroup.procs`` lists gets SIGKILL through
  a pidfd taken before checking that it is in that cgroup, until none is left; then the
  cgroup is removed;
* a systemd scope is systemd's: ``systemctl kill --kill-who=all --signal=SIGKILL`` of the
  whole scope, then ``systemctl stop`` (systemd removes its cgroup).

What cannot be ended or removed within the time given is returned as text for the caller
to log; the caller keeps the daemon's lock file, so the next reap (``reap_stale``), which
visits every key with one, tries again.
"""

import contextlib
import errno
import os
import re
import signal
import time
from typing import Optional

from gpushare.common import proc
from gpushare.node.mps import isolation

__all__ = ["KILL_FILE", "SYSTEMCTL", "end", "end_cgroup", "end_scopes", "scopes"]

KILL_FILE = "cgroup.kill"
FREEZE_FILE = "cgroup.freeze"
SYSTEMCTL = "/usr/bin/systemctl"
# Where a legacy (cgroup v1 only) systemd host keeps its own hierarchy of units.
V1_SYSTEMD = "/sys/fs/cgroup/systemd"


def end(setting: str, key: str, seconds: float) -> str:
    """End every process in daemon ``key``'s cgroup or scope under ``mps_cgroup=setting``
    and remove it, within ``seconds``; "" when nothing is left, else what stays and why."""
    if setting == "none":
        return ""
    if isolation.uses_systemd(setting):
        return end_scopes(key, seconds)
    parent = isolation.cgroup_parent(setting)
    if parent is None:
        return ""
    return end_cgroup(os.path.join(parent, key), seconds)


# ----------------------------------------------------------------------- cgroup v2

def _pids(path: str) -> list[int]:
    """The processes in cgroup ``path`` and below (as this pid namespace numbers them; 0:
    one it cannot see)."""
    found: list[int] = []
    for dirpath, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError), open(os.path.join(dirpath, "cgroup.procs"),
                                                 encoding="ascii") as handle:
            found.extend(int(word) for word in handle.read().split())
    return found


def _write(path: str, name: str, text: str) -> bool:
    """Write ``text`` to the cgroup's ``name``; False where the kernel has no such file."""
    try:
        fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        os.write(fd, text.encode())
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        os.close(fd)
    return True


def _member(pid: int, relative: str) -> bool:
    """Whether process ``pid`` is in cgroup v2 ``relative`` or below (its ``0::`` line)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return False
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    return path is not None and (path == relative or path.startswith(relative + "/"))


def _kill_member(pid: int, relative: str) -> None:
    """SIGKILL ``pid`` when it is in the cgroup, through a pidfd taken before the check (so
    the process checked is the one killed); without pidfds, checked again right before."""
    proc.signal_checked(pid, signal.SIGKILL, lambda candidate: _member(candidate, relative))


def _kill_all(path: str, relative: Optional[str], pids: list[int]) -> None:
    """Kill everything in the cgroup: the kernel's ``cgroup.kill``, else pid by pid."""
    if _write(path, KILL_FILE, "1"):
        return
    if relative is None:
        return  # not under this node's cgroup v2 mount: no pid can be shown to be in it
    with contextlib.suppress(OSError):  # frozen, nothing forks between listing and kill
        _write(path, FREEZE_FILE, "1")
    for pid in pids:
        if pid > 0:
            _kill_member(pid, relative)


def _remove(path: str) -> None:
    """rmdir the cgroup and any below it, deepest first."""
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda e: -len(e[0])):
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(dirpath)


def _relative(path: str) -> Optional[str]:
    """``path`` as ``/proc/<pid>/cgroup`` names it; None when it is not under the mount."""
    mount = isolation.cgroup2_mount()
    if mount is None:
        return None
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(mount))
    if rel == ".." or rel.startswith("../"):
        return None
    return "/" if rel == "." else "/" + rel


def end_cgroup(path: str, seconds: float) -> str:
    """Kill every process in cgroup ``path`` and remove it, retrying within ``seconds``;
    "" when it is gone, else why it stays. A directory not root's is left alone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as err:
        return f"cgroup {path} cannot be looked at: {err.strerror}"
    if info.st_uid != 0 or not os.path.isdir(path) or os.path.islink(path):
        return f"{path} is not a cgroup directory of root's; left as it is"
    relative = _relative(path)
    deadline = time.monotonic() + seconds
    pause = 0.001
    pids: list[int] = []
    while True:
        pids = _pids(path)
        try:
            if pids:
                _kill_all(path, relative, pids)
            else:
                _remove(path)
                return ""
        except FileNotFoundError:
            return ""
        except OSError as err:
            if err.errno != errno.EBUSY:
                return f"cgroup {path} cannot be emptied or removed: {err.strerror}"
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)
    held = " ".join(str(p) for p in pids) or "none listed, yet busy"
    return (f"cgroup {path} still holds processes after SIGKILL for {seconds:g} s "
            f"(pids {held}; stuck in the kernel?)")


# ----------------------------------------------------------------------- systemd

_SCOPE = r"^{prefix}(?P<key>.+)-[0-9a-f]{{8}}\.scope$"


def _slice_dirs() -> list[str]:
    """Where ``gpushare.slice``'s scopes have their cgroups: in the cgroup v2 hierarchy
    (unified or hybrid host), or systemd's own v1 one (a legacy host)."""
    found = []
    mount = isolation.cgroup2_mount()
    for base in ((mount,) if mount else ()) + (V1_SYSTEMD,):
        path = os.path.join(base, isolation.SYSTEMD_SLICE)
        if os.path.isdir(path):
            found.append(path)
    return found


def scopes(key: Optional[str] = None) -> dict[str, str]:
    """The daemon scopes of ``gpushare.slice`` (of daemon ``key``, or all): unit name →
    its cgroup directory."""
    pattern = re.compile(_SCOPE.format(prefix=re.escape(isolation.SCOPE_PREFIX)))
    found: dict[str, str] = {}
    for base in _slice_dirs():
        with contextlib.suppress(OSError):
            for name in os.listdir(base):
                match = pattern.match(name)
                if match and (key is None or match["key"] == key):
                    found.setdefault(name, os.path.join(base, name))
    return found


def _systemctl() -> str:
    from gpushare.common import safefs

    try:
        safefs.check_root_owned_file(SYSTEMCTL)
    except safefs.UnsafePathError as err:
        raise OSError(errno.EPERM, f"systemctl refused: {err}") from None
    return SYSTEMCTL


def end_scopes(key: str, seconds: float) -> str:
    """Kill every process in daemon ``key``'s scopes and stop them, within ``seconds``;
    "" when none holds a process any more, else what stays and why. A scope already
    empty is left to systemd, which collects it (``--collect``)."""
    from gpushare.common import proc

    deadline = time.monotonic() + seconds
    problems = []
    for unit, path in sorted(scopes(key).items()):
        if not _pids(path):
            continue
        try:
            systemctl = _systemctl()
            for argv in ([systemctl, "kill", "--kill-who=all", "--signal=SIGKILL", unit],
                         [systemctl, "stop", unit]):
                result = proc.run(argv, env={"PATH": "/usr/bin:/bin"},
                                  timeout=max(deadline - time.monotonic(), 0.5))
                if result.returncode != 0 and os.path.isdir(path):
                    problems.append(f"`{' '.join(argv[1:])}` failed: {result.output}")
        except (OSError, proc.ProcError) as err:
            problems.append(f"scope {unit}: {err}")
            continue
        held = _pids(path)
        if held:
            problems.append(f"scope {unit} still holds pids {' '.join(map(str, held))} "
                            "after SIGKILL (stuck in the kernel?)")
    return "; ".join(problems)
