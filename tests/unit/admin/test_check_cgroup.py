# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare check says, before a shared job's daemon start fails on it, that the cgroup
mps_cgroup= asks for cannot be had on this node; and when a start fails on it under
systemd, systemd-run's refusal is told from the MPS program's own failure."""

from __future__ import annotations

import os

import pytest

from gpushare.admin import check
from gpushare.node.mps import isolation


def test_auto_and_none_need_nothing():
    assert check.check_daemon_cgroup("auto") == []
    assert check.check_daemon_cgroup("none") == []


def test_systemd_where_systemd_does_not_run_the_node_is_an_error(monkeypatch):
    monkeypatch.setattr(isolation, "systemd_booted", lambda run_root="/run": False)
    (finding,) = check.check_daemon_cgroup("systemd")
    assert finding.severity == check.ERROR
    assert "systemd does not run this node" in finding.what
    assert finding.where == "plugstack mps_cgroup=systemd"
    assert "mps_cgroup=auto" in finding.fix


@pytest.mark.skipif(not os.access(isolation.SYSTEMD_RUN, os.X_OK),
                    reason="systemd-run is not installed")
def test_systemd_where_systemd_runs_the_node_is_fine(monkeypatch):
    monkeypatch.setattr(isolation, "systemd_booted", lambda run_root="/run": True)
    assert check.check_daemon_cgroup("systemd") == []


def test_a_directory_outside_the_cgroup_hierarchy_is_an_error(tmp_path):
    (finding,) = check.check_daemon_cgroup(str(tmp_path / "mps"))
    assert finding.severity == check.ERROR
    assert "is in the cgroup v2 hierarchy" in finding.what


def test_a_directory_under_the_cgroup_v2_mount_is_fine():
    parent = isolation.cgroup_parent("auto")
    if parent is None:
        pytest.skip("no cgroup v2 hierarchy here")
    assert check.check_daemon_cgroup(os.path.join(os.path.dirname(parent), "mps")) == []


def test_systemd_runs_refusal_is_told_from_the_programs_own_failure():
    assert isolation.scope_refused(
        "Failed to start transient scope unit: Unit gpushare.slice is masked.")
    assert isolation.scope_refused("Failed to connect to bus: No such file or directory")
    assert isolation.scope_refused("systemd-run: unrecognized option '--collect'")
    assert not isolation.scope_refused("An instance of this daemon is already running")
    assert not isolation.scope_refused("")
