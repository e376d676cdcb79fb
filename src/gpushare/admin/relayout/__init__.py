# SPDX-License-Identifier: GPL-2.0-or-later
"""MIG layouts that follow the queue: the plan's menu and bounds (``menu``), what slurmctld's
pending jobs ask for (``demand``), the pure choice of layouts (``decide``) and the floors no
choice crosses (``keep``)."""

# How far back the floors of MIG and MPS capacity look (``keep``, --keep-hours): a day, the
# cycle a site's demand repeats on.
DEFAULT_KEEP_H = 24.0

# The site's command that runs the node's step as root on the node (gpushare relayout
# --apply --node-command); here so that the command line imports nothing heavy.
DEFAULT_NODE_COMMAND = ("ssh -o BatchMode=yes {node} /usr/bin/gpushare relayout node "
                        "--node {node} --gpu {gpu} --layout {layout} --round={round} "
                        "--decision {decision} --step-timeout {timeout} --apply")
