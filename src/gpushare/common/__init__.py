# SPDX-License-Identifier: GPL-2.0-or-later
"""What every runtime uses and the node's hot path can afford: the log, commands run with a
timeout, root-safe file handling, Slurm's counts and sizes."""
