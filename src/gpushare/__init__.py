"""gpushare: safe, automatic GPU sharing for Slurm (MPS, MIG verification, NVLink placement)."""

__version__ = "0.1.0"
