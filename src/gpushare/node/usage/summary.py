# SPDX-License-Identifier: GPL-2.0-or-later
"""A job's GPU use at its end, where Slurm users and admins already look.

The epilog reads the job's figures from the usage sampler and puts one line into the
job's AdminComment: ``scontrol show job`` shows it while slurmctld remembers the job, and
``sacct -o AdminComment`` for as long as the accounting database keeps it. AdminComment,
not Comment: a user can overwrite Comment, only an operator (here root's epilog)
AdminComment. What the site wrote there before is kept, the line appended. The same line
goes to slurmd's log. Nothing here may fail the epilog: a refusal is logged and the
epilog goes on, and each scontrol call is bounded by the epilog's time left.
"""

from __future__ import annotations

import re
from typing import Optional

from gpushare.common.log import get_logger
from gpushare.node.drain import SCONTROL, run_scontrol
from gpushare.node.usage.store import UsageStore
from gpushare.node.usage.view import summary_line

__all__ = ["ADMIN_COMMENT_MAX", "record_end"]

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


def record_end(state_dir: str, job_id: int, scontrol: str = SCONTROL) -> Optional[str]:
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
    if current is None:
        return line
    if line in current:
        return line  # an epilog run twice
    text = f"{current}; {line}" if current else line
    if len(text) > ADMIN_COMMENT_MAX:
        LOG.warning("job %d: AdminComment is full (%d characters); its GPU use is only in "
                    "this log", job_id, len(current))
        return line
    done = run_scontrol(["update", f"JobId={job_id}", f"AdminComment={text}"], scontrol,
                     SCONTROL_TIMEOUT)
    if isinstance(done, str):
        LOG.warning("job %d: its GPU use is not in AdminComment: %s", job_id, done)
    return line
