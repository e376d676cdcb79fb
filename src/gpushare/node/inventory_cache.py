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
instead of asking NVML. ``gpushare check`` run as root (HealthCheckProgram) leaves its own
answer the same way. A check that fails on reused facts is done again on NVML's own
answer, so a node is only ever drained on what NVML says now. A job that holds whole GPUs
always asks NVML (its check looks for processes outside the job), and ``verify_reuse=0``
makes every job ask.

The check is a pure function of that layout, those files and what it reads from the job
(gpushare.node.devices.check_key). So the devices of each clean check (no finding at all)
done on the layout are kept beside it, and a later job with the same key takes them as
they are: its prolog then neither parses gres.conf nor imports the check.
"""

import contextlib
import json
import os
import time
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional, Sequence

from gpushare.common import safefs

if TYPE_CHECKING:
    from gpushare.gpu.inventory import Inventory
    from gpushare.node.devices import ResolvedDevice

__all__ = ["FILE_NAME", "Reusable", "load", "save", "save_check"]

FILE_NAME = "inventory.json"
_FORMAT = 1
_MAX_CHECKS = 64  # distinct device sets a node's jobs get; more are checked, not kept


class Reusable(NamedTuple):
    """What a worker left: when NVML was asked, the layout it gave, the clean checks done
    on it (check key → devices), and the stamps of the files they read."""

    asked: float
    layout: dict[str, Any]
    checks: dict[str, list[dict[str, Any]]]
    stamps: list[list[Any]]

    def inventory(self) -> "Inventory":
        """The layout as an Inventory; ValueError when it is not one."""
        from gpushare.gpu.inventory import inventory_from_dict

        return inventory_from_dict(self.layout)

    def devices(self, key: str) -> "Optional[list[ResolvedDevice]]":
        """The devices a clean check with ``key`` resolved; None when none was kept (or
        what was kept is not a list of devices)."""
        kept = self.checks.get(key)
        if not isinstance(kept, list) or not kept:
            return None
        from gpushare.node.devices import ResolvedDevice

        try:
            return [ResolvedDevice.from_dict(device) for device in kept]
        except ValueError:
            return None


def _stamps(paths: Sequence[str]) -> list[list[Any]]:
    """``[path, *stamp]`` of each file (gpushare.common.safefs.file_stamp), ``[path]`` when
    absent."""
    stamps: list[list[Any]] = []
    for path in paths:
        try:
            stamps.append([path, *safefs.file_stamp(path)])
        except FileNotFoundError:
            stamps.append([path])
    return stamps


def _without_processes(inventory: "Inventory") -> "Inventory":
    """The layout alone: which processes use a GPU is out of date at once."""
    return inventory._replace(gpus=[
        gpu._replace(processes=[], mig_devices=[m._replace(processes=[])
                                                for m in gpu.mig_devices])
        for gpu in inventory.gpus])


def load(state_dir: str, source: str, files: Sequence[str], seconds: float,
         now: Optional[float] = None) -> Optional[Reusable]:
    """What NVML (``source``) gave at most ``seconds`` ago, if ``files`` are as they were
    then; None otherwise, or when unreadable (the caller then asks NVML)."""
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
    asked, layout, checks = data.get("asked"), data.get("inventory"), data.get("checks", {})
    now = time.time() if now is None else now
    stamps = _stamps(files)
    if (data.get("source") != source or not isinstance(asked, (int, float))
            or not asked <= now < asked + seconds or data.get("files") != stamps
            or not isinstance(layout, dict) or not isinstance(checks, dict)):
        return None
    return Reusable(float(asked), layout, checks, stamps)


def save(state_dir: str, source: str, files: Sequence[str], inventory: "Inventory",
         asked: float, checks: "Mapping[str, Sequence[ResolvedDevice]]") -> None:
    """Leave ``inventory``, asked of NVML at ``asked``, and the devices of the clean
    ``checks`` done on it, for the jobs that follow. Only a shortcut: when it cannot be
    written, the next job asks NVML again."""
    kept = {key: [device.to_dict() for device in devices] for key, devices in checks.items()}
    _write(state_dir, source, Reusable(asked, _without_processes(inventory).to_dict(), kept,
                                       _stamps(files)))


def save_check(state_dir: str, source: str, reusable: Reusable, key: str,
               devices: "Sequence[ResolvedDevice]") -> None:
    """Keep the devices of a clean check done on ``reusable``'s layout and files."""
    kept = [device.to_dict() for device in devices]
    if reusable.checks.get(key) == kept or (key not in reusable.checks
                                            and len(reusable.checks) >= _MAX_CHECKS):
        return
    checks = {**reusable.checks, key: kept}
    _write(state_dir, source, reusable._replace(checks=checks))


def _write(state_dir: str, source: str, reusable: Reusable) -> None:
    data = {"format": _FORMAT, "source": source, "asked": reusable.asked,
            "files": reusable.stamps, "inventory": reusable.layout, "checks": reusable.checks}
    with contextlib.suppress(OSError, safefs.UnsafePathError):
        dir_fd = safefs.open_root_dir(state_dir)
        try:
            safefs.write_file_atomic_at(dir_fd, FILE_NAME, json.dumps(data).encode())
        finally:
            os.close(dir_fd)
