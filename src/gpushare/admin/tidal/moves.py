# SPDX-License-Identifier: GPL-2.0-or-later
"""The steps of one tidal move, and what the next run does with a move a crash left open.

A move is journalled step by step, so a crash leaves it at a known step. Each step names
which scheduler may place new work on the device once it has run; no step lets both. The
fence (a taint, or Slurm's drain) goes up before the device is given away, and the device
is given only once the holder has let go of it (the kubelet's PodResources lists no pod
holding it; Slurm runs no job on it), so the overlap the plan forbids never exists.

Recovery is pure: a move that has not yet given the device away is undone (the fence comes
down, the device stays home or stays lent), one that has is finished (giving is idempotent:
gres.conf and ``Gres=`` are rewritten, the fence on the far side is lifted). A reclaim is
always finished: the home side was promised its device back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["K8S", "SLURM", "STEPS", "Recovery", "new_work_on", "recover"]

K8S = "kubernetes"
SLURM = "slurm"

# The steps of a move from ``source`` to ``target``, in order; ``planned`` is before any.
STEPS = ("planned", "fenced", "released", "given", "unfenced", "done")
# The first step after which the device belongs to the target: from here a move is finished.
_COMMIT = "given"


def new_work_on(source: str, target: str, step: str) -> frozenset[str]:
    """The schedulers that may place new work on the device once ``step`` has run."""
    index = STEPS.index(step)
    if index < STEPS.index("fenced"):
        return frozenset({source})
    if index < STEPS.index("unfenced"):
        return frozenset()  # fenced on the source side, not yet open on the target side
    return frozenset({target})


@dataclass(frozen=True)
class Recovery:
    """What the next run does: ``finish`` from ``step`` on, or ``undo`` back to the source."""

    action: str  # "finish", "undo" or "none"
    step: str
    why: str


def recover(step: str, reclaim: bool, started: Optional[str] = None) -> Recovery:
    """The next run's choice for a move journalled at ``step`` (the last step that ran);
    ``started`` is a step that began and did not report (its effect is unknown)."""
    if step not in STEPS or (started is not None and started not in STEPS):
        raise ValueError(f"unknown step {started or step!r}")
    if step == "done":
        return Recovery("none", step, "the move ended")
    committed = STEPS.index(step) >= STEPS.index(_COMMIT) or started == _COMMIT
    if committed or reclaim:
        why = ("the device was given away" if committed
               else "a reclaim keeps the promise made to the home side")
        return Recovery("finish", step, why)
    return Recovery("undo", step, "the device was not given away yet")
