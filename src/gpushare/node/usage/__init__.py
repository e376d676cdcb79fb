# SPDX-License-Identifier: GPL-2.0-or-later
"""What each job uses of its GPUs: the node's sampler and the figures it leaves on disk."""
