# SPDX-License-Identifier: GPL-2.0-or-later
"""The plugin's own settings for the node commands (``gpushare mps``, ``gpushare job``).

They read the gpushare line of plugstack.conf, as slurmd does, so they look in the state
directory and run the control program the plugin uses, with ``%n``/``%h`` expanded for
this node (several slurmd on one host each have their own).
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Optional

from gpushare.node.config import (
    PLUGIN_LIBRARY,
    ConfigError,
    PluginConfig,
    beside_slurm_conf,
    parse_plugin_args,
    plugstack_line,
)

__all__ = ["add_arguments", "load", "this_node"]


# The source of a configuration read where plugstack.conf has no gpushare line.
DEFAULTS = "the plugin's defaults"


def this_node() -> str:
    """The Slurm node this runs on: slurmd's name inside a job, else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugstack", metavar="FILE",
                        help="plugstack.conf whose gpushare line gives the plugin's settings "
                        "(default: plugstack.conf beside $SLURM_CONF or /etc/slurm/slurm.conf; "
                        "the plugin's defaults when it has no gpushare line)")
    parser.add_argument("--node", metavar="NAME",
                        help="the Slurm node name that %%n stands for in the plugin's paths "
                        "(default: $SLURMD_NODENAME, else the short host name)")


def load(args: argparse.Namespace) -> tuple[PluginConfig, str]:
    """The plugin's configuration for this node and where it came from.

    ConfigError names the file and what is wrong with it.
    """
    path = args.plugstack or beside_slurm_conf(os.environ, "plugstack.conf")
    found: Optional[tuple[str, list[str]]] = None
    if args.plugstack or os.path.exists(path):
        found = plugstack_line(path)
        if found is None and args.plugstack:
            raise ConfigError(f"{path} has no line loading {PLUGIN_LIBRARY}")
    # Where the line is: plugstack.conf, or a file it includes (the RPM's drop-in).
    source, words = found if found is not None else (DEFAULTS, None)
    where = found[0] if found is not None else path
    try:
        config = parse_plugin_args(words or []).for_node(args.node or this_node())
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    except ValueError as err:
        raise ConfigError(f"{where}: {err}; give the node with --node") from None
    if getattr(args, "state_dir", None):
        config = config._replace(state_dir=os.path.normpath(os.path.abspath(args.state_dir)))
        source += "; state_dir from --state-dir"
    return config, source
