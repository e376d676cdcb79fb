# SPDX-License-Identifier: GPL-2.0-or-later
"""Where and how a user's MPS daemon runs: the node's default rlimits and a cgroup of its
own, so that it starts as a job's process would and not as a child of slurmd (whose
``oom_score_adj``, limits and cgroup are slurmd's).

``mps_cgroup=`` says where: ``auto`` (a systemd scope ``gpushare-mps-<daemon key>-<n>``
in ``gpushare.slice`` where systemd runs the node, since systemd owns the cgroup tree
there; elsewhere ``<cgroup v2 mount>/gpushare-mps/<daemon key>``; none where the node has
no cgroup v2), ``systemd`` (always the scope), ``none``, or a cgroup v2 directory whose
children the daemons get. The admin caps them all through that parent: the slice's
``MemoryMax=``, ``CPUQuota=``, ``TasksMax=`` (``systemctl set-property``), or the
directory's ``memory.max``, ``cpu.max``, ``pids.max``.
"""

import contextlib
import errno
import os
import re
from typing import TYPE_CHECKING, Optional, Sequence

from gpushare.common import proc

if TYPE_CHECKING:
    from gpushare.node.mps.record import MpsDevice

__all__ = ["AUTO_PARENT", "SYSTEMD_RUN", "SYSTEMD_SLICE", "cgroup2_mount", "cgroup_of",
           "cgroup_parent", "containment_gaps", "daemon_cgroup", "daemon_devices",
           "daemon_scope", "isolation", "node_rlimits", "scope_refused", "systemd_booted",
           "systemd_run", "uses_systemd"]

AUTO_PARENT = "gpushare-mps"
SYSTEMD_SLICE = "gpushare.slice"
SYSTEMD_RUN = "/usr/bin/systemd-run"
SCOPE_PREFIX = "gpushare-mps-"

# /proc/<pid>/limits' row names, as the kernel writes them, and their resources' names.
_LIMIT_ROWS = {
    "Max cpu time": "RLIMIT_CPU", "Max file size": "RLIMIT_FSIZE",
    "Max data size": "RLIMIT_DATA", "Max stack size": "RLIMIT_STACK",
    "Max core file size": "RLIMIT_CORE", "Max resident set": "RLIMIT_RSS",
    "Max processes": "RLIMIT_NPROC", "Max open files": "RLIMIT_NOFILE",
    "Max locked memory": "RLIMIT_MEMLOCK", "Max address space": "RLIMIT_AS",
    "Max file locks": "RLIMIT_LOCKS", "Max pending signals": "RLIMIT_SIGPENDING",
    "Max msgqueue size": "RLIMIT_MSGQUEUE", "Max nice priority": "RLIMIT_NICE",
    "Max realtime priority": "RLIMIT_RTPRIO", "Max realtime timeout": "RLIMIT_RTTIME",
}


def node_rlimits(proc_root: str = "/proc") -> tuple[tuple[int, int, int], ...]:
    """The limits a process of the node gets by default: PID 1's, from which every login
    and service inherits (slurmd's own may be raised or lowered by its unit)."""
    import resource

    try:
        with open(os.path.join(proc_root, "1", "limits"), encoding="ascii") as handle:
            lines = handle.read().splitlines()[1:]
    except (OSError, UnicodeDecodeError):
        return ()
    limits = []
    for line in lines:
        name = line[:26].strip()
        words = line[26:].split()
        attr = _LIMIT_ROWS.get(name)
        if attr is None or len(words) < 2 or not hasattr(resource, attr):
            continue
        try:
            soft, hard = (resource.RLIM_INFINITY if word == "unlimited" else int(word)
                          for word in words[:2])
        except ValueError:
            continue
        limits.append((getattr(resource, attr), soft, hard))
    return tuple(limits)


def cgroup2_mount(proc_root: str = "/proc") -> Optional[str]:
    """Where this node mounts the cgroup v2 hierarchy (``/sys/fs/cgroup`` on a unified
    host, ``/sys/fs/cgroup/unified`` on a hybrid one); None without one. Of several, the
    last: a later mount over ``/sys/fs/cgroup`` (a container's, a node booted in
    namespaces) hides the ones before it."""
    found = None
    try:
        with open(os.path.join(proc_root, "self", "mountinfo"), encoding="utf-8",
                  errors="replace") as handle:
            for line in handle:
                fields = line.split(" - ", 1)
                if len(fields) == 2 and fields[1].split()[:1] == ["cgroup2"]:
                    found = fields[0].split()[4].replace("\\040", " ")
    except OSError:
        pass
    return found


def systemd_booted(run_root: str = "/run") -> bool:
    """Whether systemd runs this node (and so owns its cgroup tree): the test of
    sd_booted(3), a directory ``/run/systemd/system`` that only systemd as PID 1 makes."""
    return os.path.isdir(os.path.join(run_root, "systemd", "system"))


def uses_systemd(setting: str, run_root: str = "/run") -> bool:
    """Whether ``mps_cgroup=`` puts daemons in systemd scopes: ``systemd``, or ``auto``
    where systemd runs the node and ships systemd-run."""
    if setting == "systemd":
        return True
    return setting == "auto" and systemd_booted(run_root) and os.path.exists(SYSTEMD_RUN)


def cgroup_parent(setting: str, proc_root: str = "/proc") -> Optional[str]:
    """The cgroup directory under which gpushare makes daemons' cgroups for
    ``mps_cgroup=``; None: it makes none (``none``; systemd's scopes; ``auto`` without
    cgroup v2)."""
    if setting == "none" or uses_systemd(setting):
        return None
    if setting == "auto":
        mount = cgroup2_mount(proc_root)
        return os.path.join(mount, AUTO_PARENT) if mount else None
    return setting


def daemon_cgroup(setting: str, key: str) -> Optional[str]:
    """Make (root's, 0755) and return daemon ``key``'s cgroup; None where it has none.
    Raises OSError when the cgroup of an ``mps_cgroup=`` directory cannot be made; with
    ``auto``, a hierarchy root may not write (a container's read-only one) means none."""
    parent = cgroup_parent(setting)
    if parent is None:
        return None
    if setting == "auto":
        try:
            return _make_cgroup(parent, key)
        except OSError:
            return None
    return _make_cgroup(parent, key)


def _make_cgroup(parent: str, key: str) -> str:
    for path in (parent, os.path.join(parent, key)):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        info = os.lstat(path)
        if not os.path.isdir(path) or os.path.islink(path) or info.st_uid != 0:
            raise OSError(errno.EPERM, f"{path} is not a directory of root's")
    if not os.path.exists(os.path.join(parent, key, "cgroup.procs")):
        raise OSError(errno.ENOTSUP, f"{parent} is not in a cgroup v2 hierarchy")
    return os.path.join(parent, key)


def daemon_scope(key: str) -> str:
    """A new scope unit's name for daemon ``key``: unique per start, so that what a
    killed daemon of the same key left in its scope never blocks the next start (the
    next start's cleanup kills those by their uid and pipe directory)."""
    return f"{SCOPE_PREFIX}{key}-{os.urandom(4).hex()}.scope"


# What systemd-run says when it made no scope (and so ran nothing), as opposed to what the
# program it runs says about its own failure.
# (An older systemd-run that lacks an option says so prefixed with its name, as getopt does.)
_SCOPE_REFUSED = re.compile(r"^(Failed to (start transient scope unit|connect to bus|create "
                            r"bus connection|allocate manager object)|systemd-run: )",
                            re.MULTILINE)


def scope_refused(output: str) -> bool:
    """Whether a failed start's output is systemd-run's: no scope, the program never ran."""
    return _SCOPE_REFUSED.search(output) is not None


def systemd_run() -> str:
    """The systemd-run root runs to make a scope: OSError where systemd does not run the
    node or the program is missing or not root's alone."""
    from gpushare.common import safefs

    if not systemd_booted():
        raise OSError(errno.ENOTSUP, "systemd does not run this node (no /run/systemd/"
                      "system): set mps_cgroup=auto or a cgroup v2 directory")
    try:
        safefs.check_root_owned_file(SYSTEMD_RUN)
    except safefs.UnsafePathError as err:
        raise OSError(errno.EPERM, f"systemd-run refused: {err}") from None
    return SYSTEMD_RUN


# What every CUDA process opens besides its GPUs (in the directory of /dev/nvidia<minor>).
COMMON_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def daemon_devices(devices: Sequence["MpsDevice"]) -> tuple[str, ...]:
    """The device files a daemon's scope may open: its GPUs' (for a MIG slice, the parent
    GPU's and the slice's ``nvidia-caps`` files) and the driver's common ones beside them;
    () when a device's files are unknown or outside ``/dev`` (a simulated node's; systemd
    takes only device nodes), since a closed policy would leave the daemon without its GPU.
    """
    if not devices or not all(d.device_files and all(
            path.startswith("/dev/") for path in d.device_files) for d in devices):
        return ()
    found: dict[str, None] = {}
    for device in devices:
        base = os.path.dirname(device.device_files[0])
        for path in (*(os.path.join(base, name) for name in COMMON_DEVICES),
                     *device.device_files):
            found[path] = None
    return tuple(found)


def isolation(setting: str, key: str, proc_root: str = "/proc",
              devices: Sequence["MpsDevice"] = ()) -> proc.Isolation:
    """How daemon ``key`` starts (``proc.run(isolate=...)``): in a systemd scope, only
    ``devices``' files may be opened. OSError when its cgroup cannot be made or
    systemd-run is unsafe or missing."""
    if uses_systemd(setting):
        return proc.Isolation(rlimits=node_rlimits(proc_root), scope=daemon_scope(key),
                              scope_slice=SYSTEMD_SLICE, systemd_run=systemd_run(),
                              devices=daemon_devices(devices))
    return proc.Isolation(rlimits=node_rlimits(proc_root),
                          cgroup=daemon_cgroup(setting, key) or "")


def cgroup_of(pid: int, proc_root: str = "/proc") -> str:
    """Where process ``pid`` runs: its cgroup v2 path (``0::`` in ``/proc/<pid>/cgroup``),
    or on a cgroup v1 host its memory controller's; "" when it is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8",
                  errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return ""
    found = {}
    for line in lines:
        _, controllers, path = ([*line.split(":", 2), "", ""])[:3]
        found[controllers] = path
    if "" in found and found[""] != "/":
        return found[""]
    return next((path for names, path in found.items() if "memory" in names.split(",")),
                found.get("", ""))


def containment_gaps(setting: str, proc_root: str = "/proc") -> list[str]:
    """What a daemon's cgroup under ``mps_cgroup=setting`` does not hold on this host (for
    ``gpushare check``): where there is none, a process a user forks from their daemon
    outlives the job. (A hybrid host's controller-less cgroup v2 hierarchy, which caps
    nothing, is only documented: it is what the host is, warned about on every run.)"""
    if uses_systemd(setting) or cgroup_parent(setting, proc_root) is not None:
        return []
    why = "mps_cgroup=none" if setting == "none" else "this host has no cgroup v2"
    return [f"MPS daemons get no cgroup ({why}): a process a user forks from their own "
            "daemon (a takeover, where ptrace is allowed) outlives the job and its limits; "
            "only the MPS processes gpushare recognises end with the daemon"]
