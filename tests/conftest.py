# SPDX-License-Identifier: GPL-2.0-or-later
"""Make the core (src/) and the test harness (scripts/: slurmbed.py, mps_standin, luahook,
submit_strategies) importable in every test."""

import errno
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts")):
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture
def no_pidfds(monkeypatch):
    """A kernel before 5.3 (RHEL 8's 4.18): os.pidfd_open fails with ENOSYS."""
    def pidfd_open(pid):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", pidfd_open)
