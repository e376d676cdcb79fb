# SPDX-License-Identifier: GPL-2.0-or-later
"""Draining this node with gpushare's reason, from a failing prolog or ``gpushare check``,
and requeueing the job whose prolog failed, as Slurm does.

Light on purpose: a prolog that fails on a node problem imports only this and ``proc``,
not the plan, PyYAML or jinja2 that ``gpushare check`` needs.
"""

import os
import re
from typing import Optional

from gpushare.common import proc, safefs
from gpushare.node.phases import time_left

__all__ = ["DRAIN_REASON_MAX", "SCONTROL", "drain_node", "fit_reason", "requeue_job",
           "run_scontrol"]

# What `sinfo -R` shows without cutting: the cause must come first and fit.
DRAIN_REASON_MAX = 100
SCONTROL = "/usr/bin/scontrol"
PREFIX = "gpushare: "  # the C glue's drains (spank/gs_drain.c) start the same


def fit_reason(text: str, more: str = "") -> str:
    """``gpushare: <text><more>`` on one line of at most DRAIN_REASON_MAX characters.

    The text should say the cause first and identifiers last: what does not fit is cut
    from the end. Double quotes become single ones (scontrol's argument syntax).
    """
    if text.startswith(PREFIX):
        text = text[len(PREFIX):]
    text = re.sub(r"\s+", " ", "".join(ch if ch.isprintable() else " " for ch in text))
    text = text.strip().replace('"', "'")
    budget = DRAIN_REASON_MAX - len(PREFIX) - len(more)
    if len(text) > budget:
        text = text[:budget - 3].rstrip() + "..."
    return f"{PREFIX}{text}{more}"


def drain_node(node: str, reason: str, scontrol: str = SCONTROL,
               timeout: float = 10.0) -> Optional[str]:
    """Drain ``node``; None on success, else why it failed (never raises)."""
    done = run_scontrol(["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
                     scontrol, timeout)
    return done if isinstance(done, str) else None


# What slurmctld answers `scontrol requeue` for a job it will not requeue: one that asked
# --no-requeue (or JobRequeue=0 without --requeue), or one that is not a batch job.
NOT_REQUEUED = ("disabled", "batch job")


def requeue_job(job_id: int, scontrol: str = SCONTROL,
                timeout: float = 10.0) -> tuple[str, Optional[str]]:
    """Requeue a job whose prolog failed on this node, as Slurm does after a failing
    prolog: held (``requeuehold``) unless slurm.conf's SchedulerParameters has
    ``nohold_on_prolog_fail``. slurmctld itself refuses a job that asked ``--no-requeue``
    (or runs under ``JobRequeue=0`` without ``--requeue``) and any job that is not a batch
    job, as it does for its own prolog failures.

    Returns what was done (``"held"``, ``"requeued"`` or ``""``) and, when nothing was,
    why (slurmctld's answer). Never raises."""
    config = run_scontrol(["show", "config"], scontrol, timeout)
    if isinstance(config, str):
        return "", config
    held = not re.search(r"^SchedulerParameters\s*=.*\bnohold_on_prolog_fail\b",
                         config.output, re.MULTILINE)
    done = run_scontrol(["requeuehold" if held else "requeue", str(job_id)], scontrol, timeout)
    if isinstance(done, str):
        return "", done
    return ("held" if held else "requeued"), None


def run_slurm_client(program: str, args: list[str], timeout: float) -> "proc.Result | str":
    """Run a Slurm client (scontrol, sacct, sacctmgr) as root: its result, or why it failed
    (never raises). Only a root-owned program, with a fixed environment, within ``timeout``
    or the time left of this process's deadline, whichever ends first: the fault path that
    drains and requeues is itself bounded by the C glue."""
    timeout = time_left(timeout)
    name = os.path.basename(program)
    if not program.startswith("/"):
        return f"{program}: {name} must be given as an absolute path"
    try:  # run as root: only a program no user can replace
        safefs.check_root_owned_file(program)
    except safefs.UnsafePathError as err:
        return f"{name} refused: {err}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if os.environ.get("SLURM_CONF"):  # slurmd's own, passed to its prologs
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    try:
        done = proc.run([program, *args], timeout=timeout, env=env)
    except proc.CommandNotFound as err:
        return f"{program} cannot be run: {err}"
    except proc.CommandTimeout:
        return f"{name} did not answer within {timeout:g} s"
    except proc.ProcError as err:
        return str(err)
    if done.returncode != 0:
        detail = done.output.strip().splitlines()
        return f"{name} failed (exit {done.returncode}): {detail[-1] if detail else ''}"
    return done


def run_scontrol(args: list[str], scontrol: str, timeout: float) -> "proc.Result | str":
    """``scontrol args`` through ``run_slurm_client``."""
    return run_slurm_client(scontrol, args, timeout)
