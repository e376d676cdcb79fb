# SPDX-License-Identifier: GPL-2.0-or-later
"""Slurm's counts and sizes: a whole number with an optional binary suffix (``2``, ``1k``,
``16G``), as gres.conf, GRES strings, sinfo and the plugin's ``mem_limit=`` write them."""

import re
from typing import Optional

__all__ = ["parse_count"]

SUFFIXES = "KMGTP"  # each a factor of 1024 over the one before
_COUNT = re.compile(r"([0-9]+)([KMGTPkmgtp]?)")


def parse_count(text: str, suffixes: str = SUFFIXES) -> Optional[int]:
    """``2`` -> 2, ``1k`` -> 1024, ``16G`` -> 16 << 30; None when ``text`` is not digits
    followed by at most one of ``suffixes`` (either case)."""
    match = _COUNT.fullmatch(text)
    if match is None:
        return None
    number, suffix = int(match.group(1)), match.group(2).upper()
    if not suffix:
        return number
    if suffix not in suffixes:
        return None
    return number << (10 * (SUFFIXES.index(suffix) + 1))
