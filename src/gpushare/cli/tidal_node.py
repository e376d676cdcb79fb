# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal holders``: on a node, which Kubernetes pods hold one of its devices.

The controller runs it (``--holders-command``) before it gives a device Kubernetes owned
to Slurm, and to learn which of a rule's devices Kubernetes is using. The device's ids come
from NVML: the GPU's UUID and, for a whole GPU, each of its MIG devices' UUIDs; for a slice,
those of every MIG device of the slice's profile on the GPU (the plan numbers slices, NVML
does not: a held slice of the same profile counts, which may wait longer, never too
little). A DRA device is matched by ``--dra DRIVER/POOL/DEVICE``.

Exit status: 0 no pod holds it, 1 a pod holds it (the first line names it), 2 it could not
be told (no kubelet, no such GPU): the controller treats that as held.
"""

from __future__ import annotations

import argparse

from gpushare.cli import fail

__all__ = ["holders"]


def _ids(source: str, gpu: int, piece: int, profile: str) -> frozenset[str]:
    from gpushare.gpu.inventory import open_inventory

    inventory = open_inventory(source)
    found = next((g for g in inventory.gpus if g.nvml_index == gpu), None)
    if found is None:
        raise LookupError(f"NVML shows no GPU {gpu} on this node (it has "
                          f"{len(inventory.gpus)})")
    ids = {found.uuid}
    for mig in found.mig_devices:
        if piece < 0 or profile in ("", "-") or mig.profile == profile:
            ids.add(mig.uuid)
    return frozenset(ids)


def _dra(text: str) -> tuple[str, str, str] | None:
    if text in ("", "-"):
        return None
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"--dra {text!r} must be DRIVER/POOL/DEVICE")
    return parts[0], parts[1], parts[2]


def holders(args: argparse.Namespace) -> int:
    from gpushare.admin.tidal.podresources import (
        PodResourcesError,
        Wanted,
        holders,
        list_pods,
    )
    from gpushare.gpu.inventory import InventoryError

    if args.gpu is None:
        return fail("tidal holders", "give --gpu N (the device's GPU, by NVML index)")
    try:
        dra = _dra(args.dra)
        ids = _ids(args.source, args.gpu, args.slice, args.profile)
        found = holders([Wanted(ids=ids, dra=dra)], list_pods(args.socket))
    except (ValueError, LookupError, InventoryError, PodResourcesError) as err:
        return fail("tidal holders", str(err))
    if not found:
        print(f"no pod holds GPU {args.gpu}" + (f" slice {args.slice + 1}"
                                                 if args.slice >= 0 else ""))
        return 0
    for holder in found:
        print(holder.describe())
    return 1
