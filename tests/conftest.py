# SPDX-License-Identifier: GPL-2.0-or-later
"""Make the core (src/) and the test harness (scripts/: slurmbed.py, mps_standin, luahook,
submit_strategies) importable in every test, and fix the examples the property-based tests
try."""

import errno
import os
import sys

import pytest
from hypothesis import settings

# The kubelet stand-in (scripts/kube_standin) serves gRPC from threads of the test process,
# which also starts commands; with gRPC's fork handlers on, a child that Python 3.9's
# subprocess forks (3.10 and later use vfork) can abort in them before its exec. A real
# kubelet is another process; the tests turn the handlers off before gRPC is imported.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

HERE = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts"),
             os.path.join(HERE, "unit")):
    if path not in sys.path:
        sys.path.insert(0, path)

# Property-based tests: by default every run tries the same examples (a seed derived from
# each test, no example database), so a failure reproduces and a pass means the same thing
# everywhere. HYPOTHESIS_PROFILE=dev draws new examples each run and replays earlier failures.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def no_pidfds(monkeypatch):
    """A kernel before 5.3 (RHEL 8's 4.18): os.pidfd_open fails with ENOSYS."""
    def pidfd_open(pid):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", pidfd_open)
