"""The ``gpushare`` command: one sub-command module per concern, each with ``register()``."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from gpushare import __version__

# Each module defines ``register(subparsers)`` which adds its sub-command(s) and sets
# ``func(args) -> int`` as the parser default.
COMMAND_MODULES: tuple[str, ...] = (
    "gpushare.cli.plugstack",
    "gpushare.cli.explain",
    "gpushare.cli.inventory",
    "gpushare.cli.render",
    "gpushare.cli.simulate",
    "gpushare.cli.check",
    "gpushare.cli.job",
    "gpushare.cli.mps",
    "gpushare.cli.metrics",
    "gpushare.cli.status",
)


def text_table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, as the sub-commands print their listings."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare",
        description="Inspect a GPU node and its MPS daemons, render Slurm/Kubernetes config "
        "from the ownership plan, check a node against it, and explain what the submit hooks "
        "do to a job.",
    )
    parser.add_argument("--version", action="version", version=f"gpushare {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
