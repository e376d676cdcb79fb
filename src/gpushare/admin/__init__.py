# SPDX-License-Identifier: GPL-2.0-or-later
"""The admin side behind the CLI: the plan, what is rendered from it, the checks against a
node and the cluster, the GPU models' MIG profiles, Slurm's view, metrics and the MPS
report."""
