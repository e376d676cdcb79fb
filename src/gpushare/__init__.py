# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare: safe, automatic GPU sharing for Slurm (MPS, MIG verification, NVLink placement).

One subpackage per runtime: ``node`` (the prolog/epilog path inside slurmstepd),
``submit`` (the job_submit rules inside slurmctld), ``admin`` (plan, MIG profiles, render,
check, status, metrics, behind the CLI), ``cli``, and what they share: ``gpu`` (NVML,
inventory, gres.conf) and ``common`` (log, commands, root-safe files).

Every job_prolog and job_epilog starts a fresh interpreter inside slurmstepd, so whatever
the modules they import import is paid once per job and node. Those modules (node's
config, state, mps, job and spank_adapter, common's proc and log, and for a prolog that
verifies devices node's verify and gpu's gresconf, inventory and nvml) therefore keep
their records as NamedTuples or plain classes rather than dataclasses (``dataclasses``
brings ``inspect``: about 5 ms of CPU), log through ``gpushare.common.log`` rather than
``logging`` (about 4 ms), and import ``subprocess``, ``hashlib`` and the GPU verification
only where they are used. The
modules declaring those NamedTuples do without ``from __future__ import annotations``
(forward references are quoted by hand): typing.NamedTuple compiles every string
annotation into a ForwardRef, which cost a verifying prolog over 100 ``compile()`` calls.
``tests/unit/test_callback_imports.py`` keeps it so, for every module of ``node``, ``gpu``
and ``common``, none of which imports ``admin``, ``submit`` or ``cli`` when it loads.
"""

__version__ = "0.1.0"
