# SPDX-License-Identifier: GPL-2.0-or-later
"""Install the Debian packages and create the test users that builds, tests and the demo need."""

from __future__ import annotations

import os
import sys

import slurmbed  # scripts/slurmbed.py, beside this script
import slurmdbd_bed  # accounting for the AdminComment test

# The C checks (`make lint`, tests/c): clang with its libFuzzer and sanitizer runtime, which
# Debian only recommends (so it is named, by the release's clang version), and cppcheck.
C_CHECK_PACKAGES = ("clang", "cppcheck")
CLANG_RUNTIME = {"bookworm": "libclang-rt-14-dev", "trixie": "libclang-rt-19-dev"}


def main() -> int:
    if os.geteuid() != 0:
        print("gpushare: run as root (it installs Debian packages and creates test users)")
        return 1
    codename = slurmbed.debian_codename()
    runtime = CLANG_RUNTIME.get(codename)
    accounting = slurmdbd_bed.APT_PACKAGES if codename in slurmdbd_bed.RELEASES else ()
    slurmbed.ensure_packages((*slurmbed.APT_PACKAGES, *accounting,
                              "python3-venv", "rpm", *C_CHECK_PACKAGES,
                              *([runtime] if runtime else [])))
    for user in slurmbed.TEST_USERS:
        slurmbed.ensure_user(user)
    return 0


if __name__ == "__main__":
    sys.exit(main())
