# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check`` on the users' MPS space (plugstack ``mps_space=``): each daemon's own
tmpfs and who fills it, and a job container setting that would hide those mounts from
the jobs' tasks.

Why here: a user who fills their own space hurts only their jobs, but the admin who is
asked about them needs the key (``u<uid>-<GPU>``) and the numbers; and
``job_container/tmpfs`` without ``Shared=yes`` makes every per-daemon mount invisible to
the job it was made for, which breaks every shared job of the node.
"""

from __future__ import annotations

import os
import re
from typing import Mapping, Optional

from gpushare.node.verify import WARNING, Finding

__all__ = ["check_job_container", "check_key_spaces", "space_findings"]

# A daemon's space at least this full (space or inodes) is reported.
_NEARLY_FULL = 0.9
_TMPFS_CONTAINER = re.compile(r"^\s*(JobContainerType|NamespaceType)\s*=\s*\S*/tmpfs\b",
                              re.IGNORECASE | re.MULTILINE)
_SHARED_YES = re.compile(r"(^|\s)Shared\s*=\s*(yes|true|1)\b", re.IGNORECASE | re.MULTILINE)


def space_findings(state_dir: str, mps_space: str, env: Mapping[str, str]) -> list[Finding]:
    """Everything this module checks, for a node with ``state_dir=`` and ``mps_space=``."""
    from gpushare.admin import check

    if mps_space == "shared":
        return check.check_state_space(state_dir) + check.check_trash(state_dir,
                                                                      keep_trash=True)
    return (check_key_spaces(os.path.join(state_dir, "mps"))
            + check.check_trash(state_dir) + check_job_container(env, mps_space))


def check_key_spaces(mps_dir: str) -> list[Finding]:
    """Each daemon's own tmpfs that is nearly full, with the key naming its user; what
    cannot be read is left to the prologs, which say why."""
    from gpushare.common import safefs
    from gpushare.node.mps import space

    try:
        users_fd = safefs.open_root_dir(mps_dir, create=False)
    except (OSError, safefs.UnsafePathError):
        return []  # no shared job yet, or refused: the prologs say why
    findings = []
    try:
        for key in sorted(os.listdir(users_fd)):
            path = os.path.join(mps_dir, key)
            try:
                used = space.usage(users_fd, key, path)
            except OSError:
                continue
            if used is None:
                continue
            share = max(used.used_bytes / used.size_bytes if used.size_bytes else 0,
                        used.used_inodes / used.inodes if used.inodes else 0)
            if share < _NEARLY_FULL:
                continue
            owner = re.match(r"u(\d+)-", key)
            who = f"uid {owner.group(1)}'s" if owner else f"job {key[3:]}'s"
            findings.append(Finding(
                WARNING, f"{who} MPS space is {share:.0%} full ({used.used_bytes >> 10} of "
                f"{used.size_bytes >> 10} KiB, {used.used_inodes} of {used.inodes} inodes)",
                path, "only that user's jobs on that daemon are hurt; it goes when the "
                "daemon's last job ends (`gpushare mps` lists its jobs); raise plugstack "
                "mps_space= if MPS logs need more"))
    finally:
        os.close(users_fd)
    return findings


def check_job_container(env: Mapping[str, str], mps_space: str,
                        slurm_conf: Optional[str] = None) -> list[Finding]:
    """job_container/tmpfs (namespace/tmpfs from Slurm 25.11) makes each job's mount
    namespace private unless job_container.conf says ``Shared=yes``: then a daemon's space,
    mounted after the job's namespace was made, is not seen by its tasks."""
    from gpushare.node.config import beside_slurm_conf

    path = slurm_conf or env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    text = _read(path)
    if text is None or not _TMPFS_CONTAINER.search(text):
        return []
    conf = beside_slurm_conf({"SLURM_CONF": path}, "job_container.conf")
    if _SHARED_YES.search(_read(conf) or ""):
        return []
    return [Finding(
        WARNING, f"job_container/tmpfs without Shared=yes makes each job's mount namespace "
        f"private, so the MPS space gpushare mounts for a job's daemon (mps_space="
        f"{mps_space}) is not seen by that job's tasks", conf,
        "set Shared=yes in job_container.conf (Slurm 23.02 and later), or plugstack "
        "mps_space=shared (docs/admin.md, \"Space\")")]


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "\n".join(line.split("#", 1)[0] for line in handle)
    except OSError:
        return None
