# SPDX-License-Identifier: GPL-2.0-or-later
"""Install the Debian packages and create the test users that builds, tests and the demo need."""

from __future__ import annotations

import os
import sys

import slurmbed  # scripts/slurmbed.py, beside this script


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
