# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare plugstack``: validate the plugin arguments of a plugstack.conf line."""

from __future__ import annotations

import argparse

from gpushare.node.config import ARG_SPECS, ConfigError, plugin_arg_values


def register(subparsers: argparse._SubParsersAction) -> None:
    keys = "\n".join(f"  {s.key}= ({s.accepts}; default "
                     f"{s.built_default or s.default or 'none'}): {s.help}"
                     for s in ARG_SPECS)
    parser = subparsers.add_parser(
        "plugstack-args",
        help="validate key=value arguments of the gpushare plugstack.conf line",
        description="Validate the key=value arguments the SPANK plugin takes.\n\nKeys:\n" + keys,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("args", nargs="*", metavar="KEY=VALUE")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        values = plugin_arg_values(args.args)
    except ConfigError as err:
        print(f"gpushare: {err}")
        return 1
    given = {token.partition("=")[0] for token in args.args}
    for spec in ARG_SPECS:
        if spec.built_default and spec.key not in given:
            # Not a value to paste: the plugin decides it by how it was built.
            print(f"# {spec.key}= not given: {spec.built_default}")
        else:
            print(f"{spec.key}={values[spec.key]}")
    return 0
