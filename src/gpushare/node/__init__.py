# SPDX-License-Identifier: GPL-2.0-or-later
"""The prolog/epilog path run inside slurmstepd, in a fresh interpreter for every job: the
SPANK adapter, the job's plan, its state on disk, device verification and MPS daemons."""
