# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare check goes on purging what the prologs and epilogs moved into the MPS trash."""

from __future__ import annotations

import os

import pytest

from gpushare.admin import check
from gpushare.common import safefs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="purges as root")


def test_check_finishes_a_purge_a_prolog_left_and_then_reports_nothing(tmp_path):
    os.chmod(tmp_path, 0o755)
    state_dir = str(tmp_path / "state")
    mps_fd = safefs.open_root_dir(os.path.join(state_dir, "mps"))
    try:
        tree = os.path.join(state_dir, "mps", "u1000-GPU-x", "log")
        os.makedirs(tree)
        for index in range(50):
            os.mkdir(os.path.join(tree, f"d{index}"))
        assert safefs.discard_tree_at(mps_fd, "u1000-GPU-x", budget=3) is True
        assert safefs.trash_entries_at(mps_fd)
        assert check.check_trash(state_dir) == []
        assert safefs.trash_entries_at(mps_fd) == []
        assert not os.path.exists(os.path.join(state_dir, "mps", safefs.TRASH))
    finally:
        os.close(mps_fd)


def test_check_of_a_node_without_state_says_nothing(tmp_path):
    assert check.check_trash(str(tmp_path / "absent")) == []
