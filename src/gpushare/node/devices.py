# SPDX-License-Identifier: GPL-2.0-or-later
"""A device a job got, as the job-start check resolved it (gpushare.node.verify).

Kept apart from the check itself, so that a prolog that reuses an earlier check's result
(gpushare.node.inventory_cache) needs neither the check nor gres.conf's parser.
"""

from collections.abc import Mapping
from typing import Any, NamedTuple, Optional

__all__ = ["ResolvedDevice", "check_key", "gres_name_of", "is_uuid", "uuid_list"]

UUID_PREFIXES = ("GPU-", "MIG-")


class ResolvedDevice(NamedTuple):
    """A device the job got, as Slurm names it and as NVML reports it."""

    slurm_index: int  # -1 when Slurm named it only by UUID
    gres_name: str
    gres_type: str
    uuid: str  # GPU-... or MIG-...
    gpu_uuid: str  # the parent GPU's UUID (equal to uuid for a whole GPU)
    gpu_index: int  # NVML index of the (parent) GPU
    minor: int  # /dev/nvidia<minor>
    is_mig: bool
    memory_total: int  # bytes
    profile: str  # MIG profile, "" for a whole GPU
    device_files: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as the job's record keeps them."""
        return {**self._asdict(), "device_files": list(self.device_files)}

    @classmethod
    def from_dict(cls, data: Any) -> "ResolvedDevice":
        """The device ``to_dict`` gave; ValueError when ``data`` is not one."""
        try:
            device = cls(**data)
        except TypeError as err:
            raise ValueError(f"not a resolved device: {err}") from None
        types = (int, str, str, str, str, int, int, bool, int, str, list)
        if not all(isinstance(value, kind) for value, kind in zip(device, types)):
            raise ValueError(f"not a resolved device: {data!r}")
        return device


def gres_name_of(env: Mapping[str, str]) -> str:
    """The GRES a job holds on the node when the caller does not say: mps when Slurm set
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, else gpu."""
    return "mps" if env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") else "gpu"


def check_key(node: str, env: Mapping[str, str], gres_name: Optional[str] = None) -> str:
    """What the job-start check of ``node`` reads from a job (its GRES and how Slurm named
    its devices): jobs with the same key get the same result on the same gres.conf, plan
    and NVML layout."""
    gres_name = gres_name or gres_name_of(env)
    return " ".join((node, gres_name, env.get("SLURM_JOB_GPUS", "").strip() or "-",
                     env.get("CUDA_VISIBLE_DEVICES", "").strip() or "-"))


def is_uuid(token: str) -> bool:
    """Whether one item of a device list names a GPU or MIG slice by its NVML UUID."""
    return token.startswith(UUID_PREFIXES) and len(token) > len("GPU-")


def uuid_list(value: str) -> bool:
    """Whether a ``CUDA_VISIBLE_DEVICES`` value names its devices by UUID only, as Slurm
    26.05 writes it for gres.conf ``Flags=env_uuid`` (and for MIG slices): an MPS client
    may keep such a list, since UUIDs name the daemon's devices whatever it renumbers, so
    the C glue leaves it to the task (``gs_uuid_list``, held to this by the parity test)."""
    return bool(value) and all(is_uuid(token) for token in value.split(","))
