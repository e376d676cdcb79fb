# SPDX-License-Identifier: GPL-2.0-or-later
"""Devices lent between Kubernetes and Slurm by the plan's ``lending`` rules: the choice of
what moves when (``decide``) and its replay over a day of load (``simulate``)."""
