# SPDX-License-Identifier: GPL-2.0-or-later
"""The simulated NVML's errors: pynvml's codes, texts and ``NVMLError`` subclasses."""

from __future__ import annotations

import string
from typing import ClassVar

__all__ = ["ERROR_CLASSES", "NVML_ERRORS", "NVML_SUCCESS", "NVMLError"]

# The NVML constants the simulator answers with, valued as in pynvml (nvidia-ml-py).
NVML_SUCCESS = 0
NVML_ERRORS = {
    "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7, "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10, "LIBRARY_NOT_FOUND": 12, "FUNCTION_NOT_FOUND": 13, "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16, "LIB_RM_VERSION_MISMATCH": 18, "IN_USE": 19, "NO_DATA": 21,
    "INSUFFICIENT_RESOURCES": 23, "UNKNOWN": 999,
}
_ERROR_TEXT = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
    5: "Already Initialized", 6: "Not Found", 7: "Insufficient Size", 9: "Driver Not Loaded",
    10: "Timeout", 12: "NVML Shared Library Not Found", 13: "Function Not Found",
    15: "GPU is lost", 16: "GPU requires restart",
    18: "RM has detected an NVML/RM version mismatch.", 19: "In use", 21: "No data",
    23: "Insufficient resources", 999: "Unknown Error",
}


class NVMLError(Exception):
    """Same shape as pynvml's: ``.value`` holds the code; ``NVMLError(code)`` picks the subclass."""

    _value_class: ClassVar[dict[int, type]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._value_class.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return getattr(other, "value", None) == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def _make_error_classes() -> dict[str, type]:
    classes = {}
    for name, value in NVML_ERRORS.items():
        class_name = "NVMLError_" + string.capwords(name, "_").replace("_", "")
        cls = type(class_name, (NVMLError,), {})
        NVMLError._value_class[value] = cls
        classes[class_name] = cls
    return classes



ERROR_CLASSES = _make_error_classes()
