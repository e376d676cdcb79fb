# SPDX-License-Identifier: GPL-2.0-or-later
"""What the rule modules share: Slurm's unset values, reading a job_desc number, the
running Slurm release, and the rejection a rule raises.

Kept apart from ``rules`` so that ``placement`` (where a multi-node job runs) can refuse a
request without importing the module that imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    "ESLURM_INVALID_GRES",
    "NO_VAL",
    "NO_VAL16",
    "Rejected",
    "Rejection",
    "Release",
    "at_least",
    "before",
    "number",
    "reject",
]

NO_VAL = 0xFFFFFFFE
NO_VAL16 = 0xFFFE
ESLURM_INVALID_GRES = 2072  # every rejection concerns the job's GPU request

# The running slurmctld's (major, minor), e.g. (26, 5); None when the hook could not tell,
# and then every release-dependent rule behaves as on the oldest supported release.
Release = Optional[tuple[int, int]]


def at_least(release: Release, wanted: tuple[int, int]) -> bool:
    """The running Slurm is known to be ``wanted`` or later."""
    return release is not None and release >= wanted


def before(release: Release, wanted: tuple[int, int]) -> bool:
    """The running Slurm is known to be older than ``wanted``."""
    return release is not None and release < wanted


@dataclass(frozen=True)
class Rejection:
    """Why a job cannot run as asked: the flag, the reason, and what to type instead."""

    code: int
    flag: str
    reason: str
    fix: str

    @property
    def text(self) -> str:
        return f"gpushare: {self.flag} {self.reason}; {self.fix}"


class Rejected(Exception):
    """Raised by a rule; ``rules.apply`` turns it into the job's rejection."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.text)
        self.rejection = rejection


def reject(flag: str, reason: str, fix: str) -> Rejected:
    return Rejected(Rejection(ESLURM_INVALID_GRES, flag, reason, fix))


def number(value: Any) -> int | None:
    """A numeric job_desc field, or None when unset (nil, NO_VAL, NO_VAL16)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        value = int(value)
    elif isinstance(value, str):
        if not value.isdigit() or not value.isascii():
            return None
        value = int(value)
    elif not isinstance(value, int):
        return None
    return None if value in (NO_VAL, NO_VAL16) else value
