# SPDX-License-Identifier: GPL-2.0-or-later
"""Which GPU jobs sacct can show: slurmctld records a job's GRES in accounting (sacct's
``ReqTRES``) only where slurm.conf's ``AccountingStorageTRES`` lists them. By default it lists
none, and a MIG job reads as a CPU job; with ``gres/gpu`` alone, as a whole-GPU job. What
reads sacct (relayout's floors, ``--suggest``) asks :func:`untracked` first; ``render
slurm-conf`` prints the line that records every kind of a plan (:func:`plan_tres`) and
``check --cluster`` compares it with slurmctld's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from gpushare.admin.plan import Plan

__all__ = ["is_mig_profile", "plan_kinds", "plan_tres", "recorded", "tres_name", "untracked",
           "untracked_line"]

_MIG = re.compile(r"^\d+g\.\d+gb(\+me)?$", re.IGNORECASE)


def is_mig_profile(name: str) -> bool:
    """``1g.10gb``, ``1g.10gb+me``: a MIG profile as Slurm's GRES type (not a GPU model)."""
    return bool(_MIG.match(name))


def tres_name(kind: str) -> str:
    """The TRES slurmctld must record for sacct to show jobs of ``kind``: ``gres/gpu:1g.10gb``,
    ``gres/mps``, ``gres/shard``, ``gres/gpu`` (a whole GPU)."""
    return {"whole": "gres/gpu", "mps": "gres/mps", "shard": "gres/shard"}.get(
        kind, f"gres/gpu:{kind}")


def untracked(kinds: Iterable[str], tracked: str) -> list[str]:
    """The kinds whose jobs sacct cannot show, given slurmctld's ``AccountingStorageTRES``
    (``tracked``): a MIG profile unless its own type is listed, MPS or shards unless
    ``gres/mps`` or ``gres/shard`` is, whole GPUs unless ``gres/gpu`` or a type that is not
    a MIG profile is."""
    names = {item.strip().lower() for item in tracked.split(",") if item.strip()}
    whole = "gres/gpu" in names or any(
        name.startswith("gres/gpu:") and not is_mig_profile(name[len("gres/gpu:"):])
        for name in names)
    return sorted({kind for kind in kinds
                   if not (whole if kind == "whole" else tres_name(kind).lower() in names)})


def recorded(scontrol: str, timeout: float = 10.0) -> str:
    """slurmctld's ``AccountingStorageTRES`` (``scontrol show config``); SlurmClientError
    when it cannot be read."""
    from gpushare.admin.slurm_client import SlurmClientError, config_value, run_slurm

    if not scontrol.startswith("/"):
        raise SlurmClientError(f"{scontrol}: give the Slurm command as an absolute path")
    value = config_value(run_slurm([scontrol, "show", "config"], timeout), "AccountingStorageTRES")
    if value is None:
        raise SlurmClientError(f"{scontrol} show config names no AccountingStorageTRES")
    return value


def untracked_line(kinds: Iterable[str], then: str) -> str:
    """Why jobs of ``kinds`` cannot be read from sacct, and what to do (``then``: what
    follows the restart, from ", or ..." or "; ...")."""
    names = ",".join(tres_name(kind) for kind in kinds)
    return (f"slurmctld does not record {names} in accounting, so sacct cannot show what "
            f"those jobs held; add them to slurm.conf's AccountingStorageTRES (`gpushare "
            f"render slurm-conf` prints the line) and restart slurmctld{then}")


def plan_kinds(plan: Plan) -> set[str]:
    """Every kind of job the plan's Slurm GPUs can serve, now or after a relayout: whole
    GPUs, MPS and shard units, each MIG profile Slurm owns or a menu may give it."""
    kinds = {"whole"}
    for group in plan.groups:
        for gpu in group.gpus:
            kinds.update(s.profile for s in gpu.slices_of("slurm"))
            if gpu.owner == "slurm" and not gpu.mig:
                kinds.update(kind for kind in ("mps", "shard") if getattr(gpu, kind))
        for item in group.relayout.items if group.relayout is not None else ():
            kinds.update(item.layout.slices)
            if item.layout.mps:
                kinds.add("mps")
    return kinds


def plan_tres(plan: Plan) -> list[str]:
    """The ``AccountingStorageTRES`` entries that let sacct show every kind of the plan."""
    return sorted({tres_name(kind) for kind in plan_kinds(plan)},
                  key=lambda name: (name.count(":"), name))
