# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check`` on where the plugin's state lives: the users' MPS directories apart
from root's records, and neither nearly full."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpushare.admin.check import WARNING, check_state_space

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def test_nothing_to_say_before_the_first_shared_job(tmp_path):
    assert check_state_space(str(tmp_path / "absent")) == []


@pytest.fixture
def state_fs(tmp_path):
    """A state_dir= on a tmpfs of the test's own: how full the machine's disk is says
    nothing here."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=1024", "test",
                    str(tmp_path)], check=True)
    try:
        yield tmp_path
    finally:
        subprocess.run(["umount", "--recursive", str(tmp_path)], check=True)


@needs_root
def test_mps_dirs_on_the_state_dirs_file_system_are_a_warning(state_fs):
    (state_fs / "mps").mkdir()
    (finding,) = check_state_space(str(state_fs))
    assert finding.severity == WARNING and finding.where == str(state_fs / "mps")
    assert "share a file system with root's job records" in finding.what


@needs_root
def test_a_mount_of_their_own_is_clean_until_nearly_full(state_fs):
    tmp_path = state_fs
    mps = tmp_path / "mps"
    mps.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=64", "test", str(mps)],
                   check=True)
    try:
        assert check_state_space(str(tmp_path)) == []
        for index in range(60):  # the inodes run out before the space
            (mps / f"f{index}").touch()
        (finding,) = check_state_space(str(tmp_path))
        assert finding.where == str(mps)
        assert "less than 10% of its inodes free" in finding.what
    finally:
        subprocess.run(["umount", str(mps)], check=True)
