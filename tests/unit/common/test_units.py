# SPDX-License-Identifier: GPL-2.0-or-later
"""Slurm's counts and sizes: digits and one binary suffix, nothing else."""

import pytest

from gpushare.common.units import parse_count


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("2", 2), ("1k", 1024), ("1K", 1024), ("16G", 16 << 30), ("3m", 3 << 20),
    ("2T", 2 << 40), ("1p", 1 << 50), ("007", 7),
])
def test_counts(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "k", "1.5G", "-1", "1 G", " 1", "1\n", "1KB", "1E",
                                  "\u0661\u0662", "0x10"])
def test_not_counts(text):
    assert parse_count(text) is None


def test_suffixes_can_be_narrowed():
    assert parse_count("1T", "KMGT") == 1 << 40
    assert parse_count("1P", "KMGT") is None
    assert parse_count("12", "") == 12 and parse_count("1k", "") is None
