# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare is GPL-2.0-or-later, as Slurm is: every source file says so in its first lines."""

from __future__ import annotations

import os
import subprocess

import pytest

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
TAG = "SPDX-License-Identifier: GPL-2.0-or-later"
SOURCES = (".py", ".c", ".h", ".lua", ".sh", ".spec")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [path for path in out.split() if path.endswith(SOURCES) or
            os.path.basename(path) == "Makefile"]


def test_every_source_file_names_its_license():
    missing = []
    for path in _tracked():
        with open(os.path.join(REPO, path), encoding="utf-8", errors="replace") as handle:
            head = "".join(handle.readline() for _ in range(3))
        if TAG not in head:
            missing.append(path)
    assert missing == [], f"no '{TAG}' in the first lines of: {missing}"


def test_the_license_text_ships():
    with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as handle:
        assert "GNU GENERAL PUBLIC LICENSE" in handle.read(400)
