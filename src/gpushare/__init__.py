# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare: safe, automatic GPU sharing for Slurm (MPS, MIG verification, NVLink placement).

Every job_prolog and job_epilog starts a fresh interpreter inside slurmstepd, so whatever
the modules they import import is paid once per job and node. Those modules (config,
state, mps, proc, log, job, spank_adapter, and for a prolog that verifies devices
gresconf, inventory, nvml and verify) therefore keep their records as NamedTuples or
plain classes rather than dataclasses (``dataclasses`` brings ``inspect``: about 5 ms of
CPU), log through ``gpushare.log`` rather than ``logging`` (about 4 ms), and import
``subprocess``, ``hashlib`` and the GPU verification only where they are used. The
modules declaring those NamedTuples do without ``from __future__ import annotations``
(forward references are quoted by hand): typing.NamedTuple compiles every string
annotation into a ForwardRef, which cost a verifying prolog over 100 ``compile()`` calls.
``tests/unit/test_callback_imports.py`` keeps it so.
"""

__version__ = "0.1.0"
