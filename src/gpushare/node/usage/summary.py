# SPDX-License-Identifier: GPL-2.0-or-later
"""A job's GPU use at its end, where Slurm users and admins already look.

The epilog reads the job's figures from the usage sampler, writes one line into slurmd's
log and appends it to the job's AdminComment in the accounting database, where ``sacct
-o AdminComment`` shows it (as Princeton's jobstats does; AdminComment, not Comment: a
user can overwrite Comment, only an operator AdminComment). slurmctld refuses any update
of a job that has ended, and the epilog runs after the end, so the line goes through
``sacctmgr modify job``, which needs slurmdbd; without it the line is in slurmd's log
only. Nothing here may fail the epilog: a refusal is logged, and each call is bounded by
the epilog's time left.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from gpushare.common import proc, safefs
from gpushare.common.log import get_logger
from gpushare.node.drain import SCONTROL, run_scontrol
from gpushare.node.phases import time_left
from gpushare.node.usage.store import UsageStore
from gpushare.node.usage.view import summary_line

__all__ = ["ADMIN_COMMENT_MAX", "SACCTMGR", "record_end"]

SACCTMGR = "/usr/bin/sacctmgr"

LOG = get_logger("gpushare.usage")
ADMIN_COMMENT_MAX = 1000  # what gpushare lets AdminComment grow to; older text is kept first
SCONTROL_TIMEOUT = 5.0
# scontrol show job -o: AdminComment= runs to the next " Key=" of the line.
_ADMIN = re.compile(r"(?:^| )AdminComment=(.*?)(?= [A-Za-z][A-Za-z/:_]*=|$)")


def _current(job_id: int, scontrol: str) -> Optional[str]:
    """The job's AdminComment now ("" when none), or None when it cannot be read."""
    shown = run_scontrol(["show", "job", "-o", str(job_id)], scontrol, SCONTROL_TIMEOUT)
    if isinstance(shown, str):
        LOG.warning("job %d: its GPU use is not recorded: %s", job_id, shown)
        return None
    match = _ADMIN.search(shown.stdout.splitlines()[0] if shown.stdout else "")
    value = match.group(1) if match else ""
    return "" if value in ("(null)", "") else value


def _sacctmgr(job_id: int, text: str, sacctmgr: str) -> str:
    """Set the job's AdminComment in the accounting database; "" or why not."""
    try:
        safefs.check_root_owned_file(sacctmgr)
    except (safefs.UnsafePathError, OSError) as err:
        return f"{sacctmgr} refused: {err}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    try:
        done = proc.run([sacctmgr, "-i", "modify", "job", "where", f"jobid={job_id}", "set",
                         f"AdminComment={text}"], timeout=time_left(SCONTROL_TIMEOUT), env=env)
    except proc.ProcError as err:
        return str(err)
    if done.returncode != 0:
        detail = done.output.strip().splitlines()
        return f"sacctmgr failed (exit {done.returncode}): {detail[-1] if detail else ''}"
    return ""


def record_end(state_dir: str, job_id: int, scontrol: str = SCONTROL,
               sacctmgr: str = SACCTMGR) -> Optional[str]:
    """Log the job's GPU use, append it to its AdminComment and remove its figures; the
    line written (None when the sampler had nothing for the job). Never raises."""
    store = UsageStore(state_dir)
    try:
        usage = store.read_job(job_id)
    except (OSError, ValueError) as err:
        LOG.warning("job %d: its GPU use cannot be read: %s", job_id, err)
        return None
    if usage is None:
        return None
    line = summary_line(usage)
    LOG.info("job %d: %s", job_id, line)
    try:
        store.remove_job(job_id)
    except OSError as err:
        LOG.warning("job %d: its usage file stays for the sampler to remove: %s", job_id, err)
    current = _current(job_id, scontrol)
    if current is None or line in current:  # unreadable, or an epilog run twice
        return line
    text = f"{current}; {line}" if current else line
    if len(text) > ADMIN_COMMENT_MAX:
        LOG.warning("job %d: AdminComment is full (%d characters); its GPU use is only in "
                    "this log", job_id, len(current))
        return line
    why = _sacctmgr(job_id, text, sacctmgr)
    if why:
        LOG.warning("job %d: its GPU use is not in AdminComment (it needs slurmdbd): %s",
                    job_id, why)
    return line
