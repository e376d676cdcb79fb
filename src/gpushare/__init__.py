"""gpushare: safe, automatic GPU sharing for Slurm (MPS, MIG verification, NVLink placement).

Modules that job_prolog and job_epilog import write ``TYPE_CHECKING = False`` instead of
importing it from ``typing``, and import ``typing`` only for type checkers: every prolog
and epilog starts a fresh interpreter, and importing ``typing`` is about 1.7 ms of that on
each of them. Annotations are strings (``from __future__ import annotations``), and ruff's
TC004 fails the lint if such a name is used at run time.
"""

__version__ = "0.1.0"
