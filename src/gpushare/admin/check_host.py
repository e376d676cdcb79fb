# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check``'s findings about the node's host rather than its GPUs: where the
users' MPS space lives and how full it is, the daemons' cgroup and containment, ptrace,
and what is left in the trash. Each is a ``Finding`` with what to do.
"""

from __future__ import annotations

from gpushare.node.verify import ERROR, WARNING, Finding

__all__ = ["check_daemon_cgroup", "check_daemon_containment", "check_ptrace_scope",
           "check_state_space", "check_trash"]

# Below this share of its blocks or inodes free, a state file system is reported.
_LOW_FREE = 0.1


def check_state_space(state_dir: str) -> list[Finding]:
    """Where the plugin's state lives: the users' MPS directories (``<state_dir>/mps``) on a
    file system of their own, so that what users write there cannot fill the one holding
    root's job records, daemon records, task environments, locks and counters; and their
    mount not nearly full (root's own is the node's file system, watched as the node's is)."""
    import os

    findings: list[Finding] = []
    mps_dir = os.path.join(state_dir, "mps")
    try:
        state = os.stat(state_dir)
    except OSError:
        return findings  # no shared job ran yet: nothing to look at
    try:
        mps = os.stat(mps_dir)
    except OSError:
        mps = None
    if mps is None or mps.st_dev == state.st_dev:
        findings.append(Finding(
            WARNING, "the users' MPS pipe and log directories share a file system with "
            "root's job records, so a user who fills them fails every job's set-up here",
            mps_dir, "mount a tmpfs of its own there before slurmd starts (size= and "
            "nr_inodes=; the package ships run-gpushare-mps.mount for /run/gpushare)"))
        return findings
    try:
        room = os.statvfs(mps_dir)
    except OSError:
        return findings
    low = [name for name, free, total in (("space", room.f_bavail, room.f_blocks),
                                          ("inodes", room.f_favail, room.f_files))
           if total and free < total * _LOW_FREE]
    if low:
        findings.append(Finding(
            WARNING, f"the file system of the users' MPS directories has less than "
            f"{_LOW_FREE:.0%} of its {' and '.join(low)} free", mps_dir,
            "see which daemon's directory fills it (du -x); a daemon's start that finds it "
            "full fails its job (the node stays in service) until the filling daemon stops"))
    return findings


def check_daemon_cgroup(setting: str) -> list[Finding]:
    """Whether the cgroup ``mps_cgroup=`` asks for can be had here, before a shared job's
    daemon start fails (and drains the node) on it: ``systemd`` where systemd runs the node
    with a systemd-run of root's, a directory in the cgroup v2 hierarchy."""
    import os

    from gpushare.node.mps import isolation

    where = f"plugstack mps_cgroup={setting}"
    if isolation.uses_systemd(setting):
        try:
            isolation.systemd_run()
        except OSError as err:
            return [Finding(ERROR, f"MPS daemons cannot get a systemd scope: {err.strerror}",
                            where, "set mps_cgroup=auto, or fix systemd-run")]
        return []
    if setting in ("auto", "none"):
        return []
    parent = os.path.dirname(setting.rstrip("/")) or "/"
    if not os.path.exists(os.path.join(setting, "cgroup.procs")) and not os.path.exists(
            os.path.join(parent, "cgroup.procs")):
        return [Finding(ERROR, "MPS daemons cannot get a cgroup: neither the directory nor "
                        "its parent is in the cgroup v2 hierarchy", where,
                        "name a directory under the cgroup v2 mount, or set mps_cgroup=auto")]
    return []


def check_ptrace_scope(proc_root: str = "/proc") -> list[Finding]:
    """Whether a user can take over their own MPS daemon: it runs as the user, outside the
    job's cgroup, so where ``kernel.yama.ptrace_scope`` is 0 (or the kernel has no Yama) a
    job can attach to it or write its ``/proc/<pid>/mem`` and run code beyond the job's
    device and memory limits and past its end. 1 or more allows only a tracer's own
    descendants (the daemon is root's prolog's child, not the job's)."""
    where = f"{proc_root.rstrip('/')}/sys/kernel/yama/ptrace_scope"
    why = ("a job can ptrace its user's MPS control daemon or open its /proc/<pid>/mem and "
           "take it over; the daemon runs outside the job's cgroup, so code run there "
           "escapes the job's device and memory limits and outlives the job")
    fix = ("sysctl -w kernel.yama.ptrace_scope=1 (or 2, 3), and keep it in /etc/sysctl.d/ "
           "(e.g. 10-ptrace.conf: kernel.yama.ptrace_scope = 1)")
    try:
        with open(where) as handle:
            value = handle.read().strip()
    except FileNotFoundError:
        return [Finding(WARNING, f"this kernel has no Yama (no {where}): {why}", where,
                        "boot a kernel with Yama (CONFIG_SECURITY_YAMA, listed in lsm=), "
                        "then " + fix)]
    except OSError:
        return []  # unreadable: nothing can be said
    if value == "0":
        return [Finding(WARNING, f"kernel.yama.ptrace_scope is 0: {why}", where, fix)]
    return []


def check_daemon_containment(setting: str, proc_root: str = "/proc") -> list[Finding]:
    """What a user's daemon escapes on this host under ``mps_cgroup=`` (docs/admin.md, "On
    a cgroup v1 host"): warned, since a site may choose it knowingly. The mounts are read
    below ``proc_root`` (``gpushare check --proc-root``)."""
    from gpushare.node.mps import isolation

    fix = ("run the node with the cgroup v2 hierarchy mounted (systemd's unified mode; under "
           "systemd mps_cgroup=auto gives each daemon a scope with its GPUs only)"
           if setting == "auto" else
           "set mps_cgroup=auto on a node with cgroup v2 (under systemd: a scope each, with "
           "its GPUs only)")
    return [Finding(WARNING, gap, f"plugstack mps_cgroup={setting}",
                    f"{fix}, or accept it knowingly (docs/admin.md: On a cgroup v1 host)")
            for gap in isolation.containment_gaps(setting, proc_root)]


def check_trash(state_dir: str, keep_trash: bool = False) -> list[Finding]:
    """Go on purging the daemon directories a prolog or epilog moved into
    ``<state_dir>/mps/.trash`` (root only, within the same budget as they do), and say
    what is still there: a user's tree too large for one purge, or one still written to.
    ``keep_trash`` (``mps_space=shared``): the emptied trash stays, made while there was
    room."""
    import os

    from gpushare.common import safefs

    mps_dir = os.path.join(state_dir, "mps")
    if os.geteuid() != 0:
        return []
    try:
        fd = safefs.open_root_dir(mps_dir, create=False)
    except (OSError, safefs.UnsafePathError):
        return []  # absent, or refused: the prologs say why
    try:
        if safefs.purge_trash_at(fd, keep_trash=keep_trash):
            return []
        left = safefs.trash_entries_at(fd)
    except OSError as err:
        left = [str(err)]
    finally:
        os.close(fd)
    return [Finding(WARNING, f"{len(left)} stopped daemons' directories still wait to be "
                    "removed (a very large tree a user left, or one still written to)",
                    os.path.join(mps_dir, safefs.TRASH), "each gpushare check and each "
                    "prolog removes more; nothing needs doing unless this stays")]
