# SPDX-License-Identifier: GPL-2.0-or-later
"""NVML's answer about the node's GPU layout, reused for ``verify_reuse=`` seconds.

Asking NVML is most of a first shared job's GPU check: importing pynvml, ``nvmlInit``
(tens to hundreds of milliseconds on a GPU without persistence mode) and a query per GPU
and slice. A shared (mps) job's check needs only the layout: each GPU's and slice's UUID,
minor, profile and memory, and its MIG mode. It never looks at processes, since other jobs
are expected on a shared device. A layout changes only when an administrator changes MIG
or the hardware, and then gres.conf usually changes with it.

So a worker that asked NVML leaves what it found in ``<state_dir>/inventory.json``, with
the time and the stamps of the files the check reads beside it (gres.conf, the plan, a
simulated node's profile), processes left out. A shared job's prolog within
``verify_reuse=`` seconds of that, with those files unchanged, checks its GPUs against it
instead of asking NVML. A check that fails on reused facts is done again on NVML's own
answer, so a node is only ever drained on what NVML says now. A job that holds whole GPUs
always asks NVML (its check looks for processes outside the job), and ``verify_reuse=0``
makes every job ask.
"""

import contextlib
import json
import os
import time
from typing import Optional, Sequence

from gpushare.common import safefs
from gpushare.gpu.inventory import Inventory, inventory_from_dict

__all__ = ["FILE_NAME", "load", "save"]

FILE_NAME = "inventory.json"
_FORMAT = 1


def _stamps(paths: Sequence[str]) -> list[list]:
    """``[path, dev, inode, size, mtime_ns, ctime_ns]`` of each file, ``[path]`` when absent:
    what changes when one is edited, replaced or removed."""
    stamps: list[list] = []
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            stamps.append([path])
            continue
        stamps.append([path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                       st.st_ctime_ns])
    return stamps


def _without_processes(inventory: Inventory) -> Inventory:
    """The layout alone: which processes use a GPU is out of date at once."""
    return inventory._replace(gpus=[
        gpu._replace(processes=[], mig_devices=[m._replace(processes=[])
                                                for m in gpu.mig_devices])
        for gpu in inventory.gpus])


def load(state_dir: str, source: str, files: Sequence[str], seconds: float,
         now: Optional[float] = None) -> "Optional[tuple[Inventory, float]]":
    """The layout NVML (``source``) gave at most ``seconds`` ago and when it was asked,
    if ``files`` are as they were then; None otherwise, or when unreadable (the caller then
    asks NVML)."""
    if seconds <= 0:
        return None
    try:
        dir_fd = safefs.open_root_dir(state_dir, create=False)
    except (OSError, safefs.UnsafePathError):
        return None
    try:
        raw = safefs.read_small_file_at(dir_fd, FILE_NAME, 4 << 20)
        data = json.loads(raw) if raw else None
    except (OSError, ValueError, safefs.UnsafePathError):
        return None
    finally:
        os.close(dir_fd)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        return None
    asked = data.get("asked")
    now = time.time() if now is None else now
    if (data.get("source") != source or not isinstance(asked, (int, float))
            or not asked <= now < asked + seconds or data.get("files") != _stamps(files)):
        return None
    try:
        return inventory_from_dict(data.get("inventory")), float(asked)
    except ValueError:
        return None


def save(state_dir: str, source: str, files: Sequence[str], inventory: Inventory,
         asked: float) -> None:
    """Leave ``inventory``, asked of NVML at ``asked``, for the jobs that follow. Only a
    shortcut: when it cannot be written, the next job asks NVML again."""
    data = {"format": _FORMAT, "source": source, "asked": asked, "files": _stamps(files),
            "inventory": _without_processes(inventory).to_dict()}
    with contextlib.suppress(OSError, safefs.UnsafePathError):
        dir_fd = safefs.open_root_dir(state_dir)
        try:
            safefs.write_file_atomic_at(dir_fd, FILE_NAME, json.dumps(data).encode())
        finally:
            os.close(dir_fd)
