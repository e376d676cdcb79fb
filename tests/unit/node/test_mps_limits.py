# SPDX-License-Identifier: GPL-2.0-or-later
"""Every MPS limit of a job and a daemon, against values worked out by hand."""

import pytest

from gpushare.node.mps import Limits, format_size, limits_for
from gpushare.node.mps.control import default_cap_commands, server_cap_commands

GIB = 1 << 30
MIB = 1 << 20


def test_format_size():
    assert format_size(20 << 30) == "20G"
    assert format_size((20 << 30) + (512 << 20)) == "20992M"
    assert format_size(100) == "1M"


@pytest.mark.parametrize("shares, memory, setting, expected", [
    # 25% of an 80 GiB GPU: 20 GiB.
    ([25], [80 * GIB], "proportional", Limits(25, (("0", "20G"),))),
    # 25% of a 10 GiB MIG slice: 2.5 GiB = 2560 MiB.
    ([25], [10 * GIB], "proportional", Limits(25, (("0", "2560M"),))),
    # 30% of 40 GB (decimal): 12,000,000,000 bytes = 11444.09 MiB, rounded down.
    ([30], [40_000_000_000], "proportional", Limits(30, (("0", "11444M"),))),
    # 1% of 64 MiB is under 1 MiB: never less than 1 MiB.
    ([1], [64 * MIB], "proportional", Limits(1, (("0", "1M"),))),
    # Memory unknown: no proportional limit.
    ([25], [0], "proportional", Limits(25)),
    # A fixed size, capped at the device's memory; kept as is when that is unknown.
    ([25], [10 * GIB], "16G", Limits(25, (("0", "10G"),))),
    ([25], [10 * GIB], "4G", Limits(25, (("0", "4G"),))),
    ([25], [0], "4G", Limits(25, (("0", "4G"),))),
    ([25], [80 * GIB], "off", Limits(25)),
    # A daemon of two jobs of one user: each client is capped on its own, so the daemon
    # caps at the larger share, 30% of 80 GiB = 24 GiB (not the 55% of both).
    ([25, 30], [80 * GIB], "proportional", Limits(30, (("0", "24G"),))),
    ([30, 25, 30], [80 * GIB], "proportional", Limits(30, (("0", "24G"),))),
    # A user granted more than a GPU across jobs: no job above its own share.
    ([60, 70], [80 * GIB], "proportional", Limits(70, (("0", "56G"),))),
    ([100, 40], [80 * GIB], "proportional", Limits(100, (("0", "80G"),))),
    # Several devices: one limit each, numbered from 0 as the daemon numbers them.
    ([50], [80 * GIB, 10 * GIB], "proportional", Limits(50, (("0", "40G"), ("1", "5G")))),
])
def test_shared_limits(shares, memory, setting, expected):
    assert limits_for("shared", shares, memory, setting) == expected


def test_private_limits_are_the_daemons_own_without_memory_limits():
    assert limits_for("private", [100], [80 * GIB, 80 * GIB], "proportional") == Limits(100)
    assert limits_for("private", [40], [80 * GIB], "8G") == Limits(40)


def test_a_shared_jobs_environment_carries_its_limits():
    limits = limits_for("shared", [25], [80 * GIB, 10 * GIB], "proportional")
    assert limits.env("shared") == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
                                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G,1=2560M"}
    assert limits_for("shared", [100]).env("shared") == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}


def test_a_private_jobs_environment_carries_none():
    assert limits_for("private", [100], [80 * GIB]).env("private") == {}


def test_a_daemon_is_told_its_caps_for_servers_to_come_and_running_ones():
    caps = limits_for("shared", [25, 30], [80 * GIB], "proportional")
    assert default_cap_commands(caps) == ["set_default_active_thread_percentage 30",
                                          "set_default_device_pinned_mem_limit 0 24G"]
    assert server_cap_commands([41, 42], caps) == [
        "set_active_thread_percentage 41 30", "set_device_pinned_mem_limit 41 0 24G",
        "set_active_thread_percentage 42 30", "set_device_pinned_mem_limit 42 0 24G"]
    assert default_cap_commands(limits_for("private", [100])) == [
        "set_default_active_thread_percentage 100"]
