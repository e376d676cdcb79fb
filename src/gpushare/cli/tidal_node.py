# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal holders``: on a node, which Kubernetes pods hold one of its devices.

The controller runs it (``--holders-command``) before it gives a device Kubernetes owned
to Slurm, and to learn which of a rule's devices Kubernetes is using. The device's ids come
from NVML: the GPU's UUID and, for a whole GPU, each of its MIG devices' UUIDs; for a slice,
those of every MIG device of the slice's profile on the GPU (the plan numbers slices, NVML
does not: a held slice of the same profile counts, which may wait longer, never too
little). A DRA device is matched by ``--dra DRIVER/POOL/DEVICE``.

``--devices GPU:SLICE:PROFILE:DRA,...`` asks for several devices with one List call (the
controller's default: one ssh per node a round), answering a line per device, its spec
first: ``SPEC free`` or ``SPEC held pod NS/NAME ...``.

Exit status: 0 no pod holds it (any of them), 1 a pod holds it (the first line names it),
2 it could not be told (no kubelet, no such GPU): the controller treats that as held.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gpushare.cli import fail

if TYPE_CHECKING:
    from gpushare.gpu.inventory import Inventory

__all__ = ["holders"]


def _ids(inventory: Inventory, gpu: int, piece: int, profile: str) -> frozenset[str]:
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


def _spec(text: str) -> tuple[int, int, str, str]:
    """GPU:SLICE:PROFILE:DRA (``--devices``, as ``apply.device_spec`` writes it)."""
    parts = text.split(":")
    if len(parts) != 4 or not parts[0].isdigit() or not parts[1].lstrip("-").isdigit():
        raise ValueError(f"--devices: {text!r} is not GPU:SLICE:PROFILE:DRA")
    return int(parts[0]), int(parts[1]), parts[2], parts[3]


def holders(args: argparse.Namespace) -> int:
    from gpushare.admin.tidal.podresources import (
        PodResourcesError,
        Wanted,
        holders,
        list_pods,
    )
    from gpushare.gpu.inventory import InventoryError, open_inventory

    if args.gpu is None and not args.devices:
        return fail("tidal holders", "give --gpu N (the device's GPU, by NVML index) or "
                    "--devices GPU:SLICE:PROFILE:DRA,...")
    try:
        if args.devices:
            texts = args.devices.split(",")
            specs = [_spec(text) for text in texts]
        else:
            texts, specs = [""], [(args.gpu, args.slice, args.profile, args.dra)]
        inventory = open_inventory(args.source, topology=False)  # once, for every device
        wanted = [Wanted(ids=_ids(inventory, gpu, piece, profile), dra=_dra(dra))
                  for gpu, piece, profile, dra in specs]
        answer = list_pods(args.socket)
    except (ValueError, LookupError, InventoryError, PodResourcesError) as err:
        return fail("tidal holders", str(err))
    held = False
    for text, want, (gpu, piece, _, _) in zip(texts, wanted, specs):
        found = holders([want], answer)
        held = held or bool(found)
        if args.devices:  # one line each: the device as asked, free or held, by whom
            print(f"{text} held {found[0].describe()}" if found else f"{text} free")
        elif not found:
            print(f"no pod holds GPU {gpu}" + (f" slice {piece + 1}" if piece >= 0 else ""))
        else:
            for holder in found:
                print(holder.describe())
    return 1 if held else 0
