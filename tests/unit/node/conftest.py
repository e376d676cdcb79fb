# SPDX-License-Identifier: GPL-2.0-or-later
"""The MPS unit bed (``test_mps.Bed``: a state directory, a stand-in MPS program, test
users) for the node's MPS tests; each test gets a fresh one, and fails when it leaves a
stand-in process, a mount or a daemon cgroup behind."""

from __future__ import annotations

import shutil
import subprocess

import pytest


@pytest.fixture(scope="module")
def users():
    from mps_standin.harness import ensure_users

    return ensure_users()


@pytest.fixture
def bed():
    from tests.unit.node.test_mps import Bed

    from gpushare.node.mps import teardown

    bed = Bed()
    yield bed
    leftovers = bed.standin.kill_all()
    mounted = bed.mounts()
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(bed.base)
    if bed.cgroup != "none":  # the cgroups of daemons a test leaves running, then its own
        assert teardown.end_cgroup(bed.cgroup, 10) == ""
    assert leftovers == [], f"stand-in processes left running: {leftovers}"
    assert mounted == [], f"mounts left behind: {mounted}"
