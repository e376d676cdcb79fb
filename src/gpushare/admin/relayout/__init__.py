# SPDX-License-Identifier: GPL-2.0-or-later
"""MIG layouts that follow the queue: the plan's menu and bounds (``menu``), what slurmctld's
pending jobs ask for (``demand``) and the pure choice of layouts (``decide``)."""
