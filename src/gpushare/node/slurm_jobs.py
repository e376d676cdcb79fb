# SPDX-License-Identifier: GPL-2.0-or-later
"""Which jobs slurmctld still runs on this node: the one answer gpushare's own records
cannot give when an epilog was lost (slurmd killed between a cancel and the epilog).

Light on purpose: the prolog imports it, and it runs one bounded ``squeue``.
"""

import os
from typing import Optional

from gpushare.common import proc, safefs

__all__ = ["ACTIVE_STATES", "SQUEUE", "jobs_on_node"]

SQUEUE = "/usr/bin/squeue"
# Every state in which a job holds its nodes or has an epilog to come; a job in none of
# them on this node has left it for good.
ACTIVE_STATES = ("CONFIGURING", "RUNNING", "SUSPENDED", "COMPLETING", "STOPPED",
                 "SIGNALING", "RESIZING", "STAGE_OUT")


def jobs_on_node(node: str, timeout: float, squeue: str = SQUEUE) -> Optional[set[int]]:
    """Job ids slurmctld has on ``node`` in an active state; None when it cannot tell
    (squeue missing, failing, or slower than ``timeout``), so that nothing is reaped on a
    guess."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    try:  # run as root: only a program no user can replace
        safefs.check_root_owned_file(squeue)
    except safefs.UnsafePathError:
        return None
    argv = [squeue, "--noheader", f"--nodelist={node}", "--states=" + ",".join(ACTIVE_STATES),
            "--format=%A"]
    try:
        result = proc.run(argv, timeout=timeout, env=env)
    except proc.ProcError:
        return None
    if result.returncode != 0:
        return None
    words = result.stdout.split()
    if not all(word.isdigit() for word in words):
        return None
    return {int(word) for word in words}
