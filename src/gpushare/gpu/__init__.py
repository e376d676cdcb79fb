# SPDX-License-Identifier: GPL-2.0-or-later
"""The GPU facts the node and the admin side share: the NVML seam (real or simulated), the
node's inventory, gres.conf and the simulated node profiles."""
