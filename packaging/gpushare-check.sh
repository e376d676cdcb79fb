#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-or-later
# gpushare-check: slurm.conf's HealthCheckProgram (which passes no arguments). Checks this
# node's GPUs and gres.conf against the plan (/etc/gpushare/plan.yaml unless --plan is given)
# and drains the node with a readable reason when they disagree.
exec /usr/bin/gpushare check --drain "$@"
