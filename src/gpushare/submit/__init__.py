# SPDX-License-Identifier: GPL-2.0-or-later
"""The controller side, run inside slurmctld at submit time: the job_submit entry, its rules,
the cluster facts they read and GRES request strings."""
