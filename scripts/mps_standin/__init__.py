# SPDX-License-Identifier: GPL-2.0-or-later
"""Stand-in for nvidia-cuda-mps-control and helpers to run it in tests (never shipped)."""
