# SPDX-License-Identifier: GPL-2.0-or-later
"""The ``gpushare`` command: one sub-command module per concern, each with ``register()``."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gpushare import __version__

if TYPE_CHECKING:
    from gpushare.admin.plan import PlanError

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
    "gpushare.cli.relayout",
    "gpushare.cli.tidal",
    "gpushare.cli.usage",
)


def text_table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, as the sub-commands print their listings."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in rows]


def add_slurm_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """How the cluster commands ask slurmctld: --backend, --sinfo, --scontrol, --timeout."""
    parser.add_argument("--backend", default="auto",
                        choices=("auto", "pyslurm", "sinfo", "scontrol", "scontrol-json"),
                        help=f"{prefix}how to ask slurmctld: pyslurm, sinfo --json, scontrol -d "
                        "show node, scontrol show nodes --json (23.02 and later); default auto: "
                        "pyslurm when a build matching this Slurm imports, else sinfo --json, "
                        "else scontrol")
    parser.add_argument("--scontrol", default="/usr/bin/scontrol", metavar="PATH",
                        help="absolute path of scontrol (default /usr/bin/scontrol)")
    parser.add_argument("--sinfo", default="/usr/bin/sinfo", metavar="PATH",
                        help="absolute path of sinfo (default /usr/bin/sinfo)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="limit for each Slurm command (default 10)")


def fail(command: str, message: str) -> int:
    """Say on stderr what stopped ``gpushare COMMAND``; its exit status, 2."""
    print(f"gpushare {command}: {message}", file=sys.stderr)
    return 2


def plan_problems(err: PlanError) -> str:
    """A PlanError for ``fail``: a heading, then one indented line per problem."""
    return "the plan has problems:" + "".join(f"\n  {problem}" for problem in err.problems)


def write_atomically(path: str, text: str, command: str) -> int:
    """Write through a temporary file and rename, so no reader (slurmd, a prolog) ever sees
    half a file; 0, or 2 with the reason printed."""
    import os

    from gpushare.common import safefs

    try:
        safefs.write_file_atomic(os.path.abspath(path), text.encode(), 0o644, exact_mode=True)
    except OSError as err:
        return fail(command, f"cannot write {path}: {err.strerror or err}")
    return 0


class StepHelp(argparse.Action):
    """``-h`` of a command with a step word (``relayout node``, ``tidal holders``): after
    the word, the step's own help (its description, its option groups and ``shared``
    options), else the command's."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 help: str | None = None,
                 steps: dict[str, tuple[str, str, tuple[str, ...], tuple[str, ...]]] | None
                 = None) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help=help)
        self.steps = steps or {}  # word -> (description, epilog, group titles, shared)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        word = next((getattr(namespace, dest, None) for dest in ("step", "action")
                     if getattr(namespace, dest, None) in self.steps), None)
        if word is None:
            parser.print_help()
            parser.exit()
        description, epilog, titles, shared = self.steps[word]
        import textwrap

        wrapped = "\n\n".join(textwrap.fill(part, 79) for part in description.split("\n\n"))
        helper = argparse.ArgumentParser(
            prog=f"{parser.prog} {word}", description=wrapped, epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
        helper._add_action(self)
        for option in shared:
            helper._add_action(parser._option_string_actions[option])
        for group in parser._action_groups:
            if group.title in titles:
                copy = helper.add_argument_group(group.title)
                for action in group._group_actions:
                    copy._add_action(action)
        helper.print_help()
        parser.exit()


def step_word(command: str, word: str, what: str) -> Callable[[str], str]:
    """The type of a step-word positional: anything but ``word`` is refused with what to
    type (a node or GPU name there is the usual slip)."""

    def check(value: str) -> str:
        if value != word:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a sub-command; the only one is the word {word!r} "
                f"({what}), e.g. `gpushare {command} {word} --help`")
        return value

    return check


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
    args, extra = parser.parse_known_args(argv)
    if extra:
        # As parse_args, but from the sub-command's parser (its usage), with its hint for
        # what a stray word usually means there (``unknown_hint``).
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        owner = action.choices.get(getattr(args, "command", None) or "", parser)
        hint = getattr(args, "unknown_hint", "")
        owner.error(f"unrecognized arguments: {' '.join(extra)}" + (f"; {hint}" if hint else ""))
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
