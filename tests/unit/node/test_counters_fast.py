# SPDX-License-Identifier: GPL-2.0-or-later
"""The C glue's counted callbacks (counters.fast): a failed one is counted as failed, with a
drain, so that every prolog and epilog gpushare takes up is counted once either way."""

from __future__ import annotations

import os

import pytest

from gpushare.node import counters

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory is root's")


def test_failed_lines_count_as_failed_callbacks_with_a_drain(tmp_path):
    os.chmod(tmp_path, 0o755)
    state_dir = str(tmp_path / "state")
    os.makedirs(state_dir)
    with open(os.path.join(state_dir, counters.FILE), "w") as handle:
        handle.write('{"version": 1, "counters": {}}')
    with open(os.path.join(state_dir, counters.FAST_FILE), "w") as handle:
        handle.write("prolog failed 1200\nepilog 300\nepilog failed 40\nprolog failed x\n"
                     "prolog failing 10\n")
    values = counters.read(state_dir)
    assert (values["prologs_total:failed"], values["epilogs_total:failed"]) == (1, 1)
    assert values["epilogs_total:ok"] == 1 and "prologs_total:ok" not in values
    assert values["drains_total:other"] == 2
    assert (values["prolog_duration_count"], values["epilog_duration_count"]) == (1, 2)
    assert values["prolog_duration_sum_us"] == 1200
    assert values["epilog_duration_sum_us"] == 340


def test_counters_are_root_s_alone_also_those_of_an_earlier_release(tmp_path):
    """What ran on the node, when, and how it ended is the admin's: 0600, and a file an
    earlier release made 0644 is narrowed at the next count."""
    os.chmod(tmp_path, 0o755)
    state_dir = str(tmp_path / "state")
    os.makedirs(state_dir)
    counters.add(state_dir, ["prologs_total:ok"])
    path = os.path.join(state_dir, counters.FILE)
    assert oct(os.stat(path).st_mode & 0o7777) == "0o600"
    os.chmod(path, 0o644)
    counters.add(state_dir, ["prologs_total:ok"])
    assert oct(os.stat(path).st_mode & 0o7777) == "0o600"
    assert counters.read(state_dir)["prologs_total:ok"] == 2
