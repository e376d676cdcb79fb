# SPDX-License-Identifier: GPL-2.0-or-later
"""Install the Debian packages and create the test users that builds, tests and the demo need."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import slurmbed


def main() -> int:
    if os.geteuid() != 0:
        print("gpushare: run as root (it installs Debian packages and creates test users)")
        return 1
    slurmbed.ensure_packages((*slurmbed.APT_PACKAGES, "python3-venv", "rpm"))
    for user in slurmbed.TEST_USERS:
        slurmbed.ensure_user(user)
    return 0


if __name__ == "__main__":
    sys.exit(main())
