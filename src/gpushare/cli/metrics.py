# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare metrics``: this node's GPU sharing and the plugin's counters for Prometheus.

Settings come from plugstack.conf's gpushare line, as for ``gpushare mps``. On stdout, or
with ``--textfile`` written atomically for node_exporter's textfile collector (the RPM's
``gpushare-metrics.timer`` runs it so, once enabled).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpushare.cli import fail, nodeconf
from gpushare.node.config import ConfigError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "metrics",
        help="this node's GPU sharing and the plugin's counters, for Prometheus",
        description="Print this node's MPS daemons, the jobs sharing each GPU or MIG slice "
        "with their shares and caps, and the plugin's counters since boot (prologs, "
        "epilogs, refusals and drains by reason, daemon starts, stop failures, timeouts, "
        "reaps, prolog and epilog time) in Prometheus' text exposition format. Run as root "
        "to tell running daemons from gone ones. Exit status: 0 written (also when the "
        "state could not be read: gpushare_state_readable is then 0, and the reason is on "
        "stderr), 2 bad settings or the textfile could not be written.",
        epilog="Examples:\n  gpushare metrics\n"
        "  gpushare metrics --textfile /var/lib/node_exporter/textfile_collector/"
        "gpushare.prom\n"
        "  systemctl enable --now gpushare-metrics.timer   # the same every 30 s",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    nodeconf.add_arguments(parser)
    parser.add_argument("--state-dir", metavar="DIR",
                        help="the plugin's state directory, instead of plugstack.conf's")
    parser.add_argument("--relayout-state", metavar="FILE",
                        help="add gpushare relayout --apply's counters and applied layouts "
                        "from its state file (on the controller, e.g. "
                        "/etc/gpushare/relayout-state.json); without a plugstack line here, "
                        "print only those")
    parser.add_argument("--textfile", metavar="PATH",
                        help="replace this *.prom file atomically instead of printing (its "
                        "directory: node_exporter's --collector.textfile.directory)")
    parser.set_defaults(func=_run)


def _usage(state_dir: str, node: str) -> list[Any]:
    """The running jobs' GPU use from the node's usage sampler (none when it does not run;
    an unreadable file is said on stderr, and the rest is still written)."""
    import time

    from gpushare.admin.metrics_usage import usage_families
    from gpushare.node.usage.store import UsageStore

    store = UsageStore(state_dir)
    try:
        return usage_families(store.read_all(), store.read_node(), node, time.time())
    except (OSError, ValueError) as err:
        print(f"gpushare metrics: the jobs' GPU use cannot be read: {err}", file=sys.stderr)
        return []


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin import metrics

    families: list[metrics.Family] = []
    if args.relayout_state:
        from gpushare.admin.relayout.state import StateError, load_state

        try:
            families = metrics.relayout_families(load_state(args.relayout_state))
        except StateError as err:
            return fail("metrics", str(err))
    try:
        config, _source = nodeconf.load(args)  # as gpushare mps
    except ConfigError as err:
        if not families:
            return fail("metrics", str(err))
        config = None
    if config is not None:
        node = args.node or nodeconf.this_node()
        found, problem = metrics.collect(config, node, check_processes=os.geteuid() == 0)
        families = found + _usage(config.state_dir, node) + families
        if problem:
            print(f"gpushare metrics: {problem}", file=sys.stderr)
    text = metrics.render(families)
    if not args.textfile:
        sys.stdout.write(text)
        return 0
    try:
        metrics.write_textfile(args.textfile, text)
    except FileNotFoundError:
        return fail("metrics", f"cannot write {args.textfile}: its directory "
                    f"{os.path.dirname(os.path.normpath(args.textfile))} does not exist; "
                    "create it (node_exporter's --collector.textfile.directory)")
    except OSError as err:
        return fail("metrics", f"cannot write {args.textfile}: {err.strerror or err}")
    except ValueError as err:
        return fail("metrics", f"cannot write {args.textfile}: {err}")
    return 0
