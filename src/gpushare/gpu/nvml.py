# SPDX-License-Identifier: GPL-2.0-or-later
"""Talking to NVML, the real pynvml module or the simulated node of ``nvml_sim``: its errors
turned into messages that say what to do, and its strings.

Both answer the same pynvml function names, constants and ``NVMLError`` classes, so
``gpushare.gpu.inventory.collect`` runs exactly the same code against either; which one is
used is chosen by ``gpushare.gpu.inventory.load_nvml``.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

T = TypeVar("T")

__all__ = [
    "SIM_PREFIX",
    "InventoryError",
    "describe_nvml_error",
    "is_unsupported",
    "nvml_call",
    "text",
]

SIM_PREFIX = "sim:"


class InventoryError(RuntimeError):
    """The node's GPUs could not be read; the message says why and what to do."""


def _error_name(nvml: Any, value: int) -> str:
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == value:
            return name
    return f"NVML error {value}"


# The NVML errors that need something done on the node, and what; {what}: the call's purpose.
_ADVICE = (
    ("NVML_ERROR_LIBRARY_NOT_FOUND",
     "no NVIDIA driver/NVML on this node (libnvidia-ml.so.1 not found); "
     "for a test on a node without GPUs, give a simulated profile: --source sim:FILE "
     "(gpushare commands) or inventory=sim:FILE (the plugstack line)"),
    ("NVML_ERROR_DRIVER_NOT_LOADED",
     "the NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded); "
     "load it (modprobe nvidia) and check dmesg for why it failed"),
    ("NVML_ERROR_NO_PERMISSION",
     "no permission to {what} (NVML: Insufficient Permissions); "
     "run as root or as a user allowed to open /dev/nvidiactl and /dev/nvidia*"),
    ("NVML_ERROR_LIB_RM_VERSION_MISMATCH",
     "the NVML library and the loaded NVIDIA kernel module have different versions "
     "(driver upgraded without reboot); reboot the node or reload the nvidia module"),
    ("NVML_ERROR_GPU_IS_LOST",
     "a GPU fell off the bus while trying to {what} (NVML: GPU is lost); "
     "drain the node and reset or reboot it"),
)


def describe_nvml_error(nvml: Any, err: BaseException, what: str) -> str:
    """Turn an NVMLError raised while doing ``what`` into a message that says what to do."""
    value = getattr(err, "value", None)
    for name, advice in _ADVICE:
        if value == getattr(nvml, name, object()):
            return advice.replace("{what}", what)
    if value is None:
        return f"could not {what}: {err}"
    return f"could not {what}: NVML says {err} ({_error_name(nvml, value)})"


def is_unsupported(nvml: Any, err: BaseException) -> bool:
    """True for errors meaning "this GPU or driver has no such feature" — not a failure."""
    return getattr(err, "value", None) in (
        getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", object()),
        getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", object()),
    )


def nvml_call(nvml: Any, what: str, fn: Callable[..., T], *args: Any) -> T:
    """Call an NVML function; an NVMLError becomes an ``InventoryError`` naming ``what``."""
    try:
        return fn(*args)
    except nvml.NVMLError as err:
        raise InventoryError(describe_nvml_error(nvml, err, what)) from None


def text(value: Any) -> str:
    """NVML strings arrive as ``str`` or ``bytes`` depending on the call and pynvml version."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
