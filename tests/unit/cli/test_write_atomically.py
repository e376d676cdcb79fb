# SPDX-License-Identifier: GPL-2.0-or-later
"""What gpushare render and simulate write: whole files, readable by all, no leftovers."""

from __future__ import annotations

import os
import stat

from gpushare.cli import write_atomically


def test_the_file_is_replaced_whole_and_readable_by_all(tmp_path):
    target = tmp_path / "gres.conf"
    target.write_text("old\n")
    old_umask = os.umask(0o077)
    try:
        assert write_atomically(str(target), "Name=gpu File=/dev/nvidia0\n", "render") == 0
    finally:
        os.umask(old_umask)
    assert target.read_text() == "Name=gpu File=/dev/nvidia0\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["gres.conf"]


def test_a_failure_is_said_and_leaves_nothing_behind(tmp_path, capsys):
    (tmp_path / "gres.conf").mkdir()  # the rename cannot replace a directory
    assert write_atomically(str(tmp_path / "gres.conf"), "x\n", "render") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpushare render: cannot write {tmp_path}/gres.conf: ")
    assert sorted(os.listdir(tmp_path)) == ["gres.conf"]
    assert write_atomically(str(tmp_path / "missing" / "f"), "x\n", "simulate") == 2
    assert "No such file or directory" in capsys.readouterr().err
