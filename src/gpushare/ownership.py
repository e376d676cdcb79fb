"""Who owns a GPU or MIG slice on a node, answered from the ownership plan and the inventory.

The plan names GPUs by index and slices by profile; NVML names them by UUID. A slice's
owner is known when every slice of that profile on that GPU has the same owner; where the
plan mixes owners for one profile on one GPU the answer is None (the plan cannot tell the
slices apart without placements NVML reports per GPU instance).
"""

from __future__ import annotations

from typing import Callable, Optional

from gpushare.inventory import Inventory
from gpushare.plan import Plan


def owner_lookup(plan: Plan, node: str, inventory: Inventory) -> Callable[[str], Optional[str]]:
    """``owner(uuid)`` for the node's GPUs and slices; "unplanned" when the plan omits them."""
    group = plan.group_of(node)
    owners: dict[str, Optional[str]] = {}
    for gpu in inventory.gpus:
        planned = group.gpus[gpu.index] if group and gpu.index < len(group.gpus) else None
        if planned is None:
            owners[gpu.uuid] = "unplanned"
            for mig in gpu.mig_devices:
                owners[mig.uuid] = "unplanned"
            continue
        owners[gpu.uuid] = planned.owner
        for mig in gpu.mig_devices:
            candidates = {s.owner for s in planned.slices if s.profile == mig.profile}
            owners[mig.uuid] = candidates.pop() if len(candidates) == 1 else None
    return owners.get
