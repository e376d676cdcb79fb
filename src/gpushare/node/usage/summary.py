# SPDX-License-Identifier: GPL-2.0-or-later
"""A job's GPU use at its end, where Slurm users and admins already look.

The epilog reads the job's figures from the usage sampler, writes one line into slurmd's
log and appends it to the job's AdminComment in the accounting database, where ``sacct
-o AdminComment`` shows it (as Princeton's jobstats does; AdminComment, not Comment: a
user can overwrite Comment, only an operator AdminComment). slurmctld refuses any update
of a job that has ended, and the epilog runs after the end, so the line goes through
``sacctmgr modify job``, after the comment already there (read with ``sacct``), which
needs slurmdbd; without it the line is in slurmd's log only. Slurm 22.05's sacctmgr
stores the value lowercased (23.02 and later keep its case). Nothing here may fail the
epilog: a refusal is logged, and each call is bounded by the epilog's time left.
"""

from __future__ import annotations

from typing import Optional

from gpushare.common import proc
from gpushare.common.log import get_logger
from gpushare.node.usage.store import UsageStore
from gpushare.node.usage.view import summary_line

__all__ = ["ADMIN_COMMENT_MAX", "SACCT", "SACCTMGR", "record_end"]

SACCT = "/usr/bin/sacct"
SACCTMGR = "/usr/bin/sacctmgr"

LOG = get_logger("gpushare.usage")
ADMIN_COMMENT_MAX = 1000  # what gpushare lets AdminComment grow to; older text is kept first
SLURM_TIMEOUT = 5.0
# sacctmgr stores a value that starts with a quote only up to its closing quote and turns
# any other quote into a backquote: a comment holding one would not come back as it was.
_QUOTES = ("'", '"')


def _slurm(argv: list[str]) -> tuple[Optional[proc.Result], str]:
    """A root-owned Slurm client's result, or why not (``drain.run_slurm_client``)."""
    from gpushare.node.drain import run_slurm_client

    done = run_slurm_client(argv[0], argv[1:], SLURM_TIMEOUT)
    return (None, done) if isinstance(done, str) else (done, "")


def _current(job_id: int, sacct: str) -> tuple[Optional[str], str]:
    """The job's AdminComment in the accounting database ("" when none), or None and why.

    Read from sacct, the only field asked for: ``scontrol show job -o`` prints the job's
    name, command and paths before AdminComment, and a user who names a job
    "x AdminComment=..." would have their text taken for it and written back by root."""
    done, why = _slurm([sacct, "-X", "-n", "-P", "-j", str(job_id), "-o", "AdminComment"])
    if done is None:
        return None, why
    return done.stdout.rstrip("\n"), ""


def record_end(state_dir: str, job_id: int, sacct: str = SACCT,
               sacctmgr: str = SACCTMGR) -> Optional[str]:
    """Log the job's GPU use, append it to its AdminComment and remove its figures; the
    line written (None when the sampler had nothing for the job). Never raises."""
    store = UsageStore(state_dir)
    try:
        usage = store.read_job(job_id)
    except (OSError, ValueError) as err:
        LOG.warning("its GPU use cannot be read: %s", err)
        return None
    if usage is None:
        return None
    line = summary_line(usage)
    LOG.info("%s", line.removeprefix("gpushare: "))  # the log says gpushare and the job
    try:
        store.remove_job(job_id)
    except OSError as err:
        LOG.warning("its usage file stays for the sampler to remove: %s", err)
    current, why = _current(job_id, sacct)
    if current is None:
        LOG.warning("its GPU use is not in AdminComment (it needs slurmdbd): %s", why)
        return line
    if line in current:  # an epilog run twice
        return line
    if any(quote in current for quote in _QUOTES):
        LOG.warning("its AdminComment holds a quote, which sacctmgr would alter; its GPU use "
                    "is only in this log")
        return line
    text = f"{current}; {line}" if current else line
    if len(text) > ADMIN_COMMENT_MAX:
        LOG.warning("its AdminComment is full (%d characters); its GPU use is only in this "
                    "log", len(current))
        return line
    _done, why = _slurm([sacctmgr, "-i", "modify", "job", "where", f"jobid={job_id}", "set",
                         f"AdminComment={text}"])
    if why:
        LOG.warning("its GPU use is not in AdminComment (it needs slurmdbd): %s", why)
    return line
